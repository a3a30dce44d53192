package fcm_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/fcm"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
)

func TestConnectionsDroppedMidBatchLeaveTheirRequestsUnknownAndLaterSendsWork(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	fake.DropConnections(3, 7)
	out := ch.Send(context.Background(), msgs(10))
	if d, u := count(out, channel.Delivered), count(out, channel.Unknown); d != 3 || u != 7 {
		t.Fatalf("%d delivered, %d unknown, want 3 and 7: %+v", d, u, out)
	}
	for _, o := range out {
		if o.Kind == channel.Unknown && (o.Status != 0 || o.Reason == "") {
			t.Errorf("unknown outcome %+v, want no status and a reason", o)
		}
	}
	if fake.Dropped() != 7 {
		t.Errorf("fake dropped %d, want 7", fake.Dropped())
	}
	if out := ch.Send(context.Background(), msgs(4)); count(out, channel.Delivered) != 4 {
		t.Errorf("the next send: %+v, want all delivered", out)
	}
}

func TestAConnectionCutWithRequestsInFlightLeavesThemUnknown(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	fake.SetDelay(time.Minute)
	var taken atomic.Int32
	fake.SetOnMessage(func(fcmtest.Message) {
		if taken.Add(1) == 5 {
			fake.CutConnections()
		}
	})
	out := ch.Send(context.Background(), msgs(5))
	for _, o := range out {
		if o.Kind != channel.Unknown {
			t.Errorf("outcome %+v, want Unknown", o)
		}
	}
	fake.SetDelay(0)
	if out := ch.Send(context.Background(), msgs(2)); count(out, channel.Delivered) != 2 {
		t.Errorf("the next send: %+v, want all delivered", out)
	}
}

func TestARequestUnansweredWithinTheTimeoutIsUnknown(t *testing.T) {
	t.Parallel()
	fake := startFake(t, fcmtest.Config{})
	ch := newChannel(t, fake, fcm.Config{Timeout: 100 * time.Millisecond})
	fake.SetDelay(time.Minute)
	o := ch.Send(context.Background(), []channel.Message{msg(1)})[0]
	if o.Kind != channel.Unknown {
		t.Errorf("outcome %+v, want Unknown", o)
	}
	if n := len(fake.Messages()); n != 1 {
		t.Errorf("fake took %d messages, want 1: an Unknown may have been delivered", n)
	}
}

func TestAnFCMOutOfReachIsRetryAfter(t *testing.T) {
	t.Parallel()
	fake := startFake(t, fcmtest.Config{})
	ch, err := fcm.New(fcm.Config{CredentialsFile: credentials(t, fake), Endpoint: closedURL(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for _, o := range ch.Send(context.Background(), msgs(2)) {
		if o.Kind != channel.RetryAfter || o.Credentials || o.Reason == "" {
			t.Errorf("outcome %+v, want RetryAfter with a reason: nothing was written", o)
		}
	}
}

func TestAContextEndedBeforeTheSendIsNotSent(t *testing.T) {
	t.Parallel()
	fake, ch := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, o := range ch.Send(ctx, msgs(3)) {
		if o.Kind != channel.NotSent {
			t.Errorf("outcome %+v, want NotSent", o)
		}
	}
	if fake.Requests() != 0 || fake.TokenRequests() != 0 {
		t.Errorf("%d requests to FCM, %d to the token endpoint; want none", fake.Requests(), fake.TokenRequests())
	}
}

func TestAContextEndingMidBatchLeavesTheWrittenUnknownAndTheRestNotSent(t *testing.T) {
	t.Parallel()
	fake := startFake(t, fcmtest.Config{})
	ch := newChannel(t, fake, fcm.Config{Concurrency: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fake.SetDelay(time.Minute)
	fake.SetOnMessage(func(fcmtest.Message) { cancel() })
	out := ch.Send(ctx, msgs(3))
	want := []channel.Kind{channel.Unknown, channel.NotSent, channel.NotSent}
	if k := kinds(out); k[0] != want[0] || k[1] != want[1] || k[2] != want[2] {
		t.Errorf("kinds %v, want %v", k, want)
	}
	if n := fake.Requests(); n != 1 {
		t.Errorf("FCM got %d requests, want 1", n)
	}
}
