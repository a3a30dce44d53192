package apns

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel"
)

func TestNoListenerIsRetryAfterNotUnknown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "https://" + ln.Addr().String()
	ln.Close()
	r := newRig(t, func(c *Config) { c.Host = closed })

	o := r.send(t, message(0))[0]
	if o.Kind != channel.RetryAfter || !strings.Contains(o.Reason, "refused") {
		t.Errorf("outcome %+v, want retry_after: connection refused", o)
	}
}

func TestAFailedTLSHandshakeIsRetryAfter(t *testing.T) {
	t.Parallel()
	// No RootCAs: apns2's own transport and the system's roots, which do
	// not know the fake's certificate.
	r := newRig(t, func(c *Config) { c.RootCAs = nil })

	o := r.send(t, message(0))[0]
	if o.Kind != channel.RetryAfter || !strings.Contains(o.Reason, "certificate") {
		t.Errorf("outcome %+v, want retry_after: certificate not trusted", o)
	}
	if n := len(r.fake.Requests()); n != 0 {
		t.Errorf("the fake received %d requests, want none", n)
	}
}

func TestAConnectionThatDiesMidBatchLosesNothingSilently(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *Config) { c.Concurrency = 4 })
	r.fake.SetDelay(20 * time.Millisecond) // several streams in flight at the kill
	r.fake.KillAfter(6)
	msgs := messages(12)

	outs := r.send(t, msgs...)
	seen := byToken(r.fake.Requests())
	unknown := 0
	for i, o := range outs {
		req, received := seen[msgs[i].Token]
		switch {
		case o.Kind == channel.Delivered && req.Status != 200:
			t.Errorf("message %d delivered, but the fake answered it %d", i, req.Status)
		case received && req.Status == 0 && o.Kind != channel.Unknown:
			t.Errorf("message %d: the fake got it and never answered, outcome %+v, want unknown", i, o)
		case o.Kind == channel.RetryAfter && received:
			t.Errorf("message %d: retry_after, but the fake received it", i)
		case o.Kind != channel.Delivered && o.Kind != channel.Unknown && o.Kind != channel.RetryAfter:
			t.Errorf("message %d: outcome %+v, want delivered, unknown, or retry_after if never written", i, o)
		}
		if o.Kind == channel.Unknown {
			unknown++
		}
	}
	if unknown < 1 || unknown > 4 {
		t.Errorf("%d messages unknown, want the one whose request killed the connection, up to the 4 streams in flight: %+v", unknown, outs)
	}

	r.fake.SetDelay(0)
	for i, o := range r.send(t, messages(3)...) {
		if o.Kind != channel.Delivered {
			t.Errorf("after the kill, message %d: %+v, want delivered on a new connection", i, o)
		}
	}
	if n := r.fake.Connections(); n < 2 {
		t.Errorf("the fake saw %d connections, want a new one after the kill", n)
	}
}

func TestAContextEndedBeforeSendingSendsNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()

	for i, o := range r.ch.Send(ctx, messages(3)) {
		if o.Kind != channel.NotSent {
			t.Errorf("message %d: %+v, want not_sent", i, o)
		}
	}
	if n := len(r.fake.Requests()); n != 0 {
		t.Errorf("the fake received %d requests, want none", n)
	}
}

func TestAContextEndedMidBatchLeavesTheWrittenUnknownAndTheRestNotSent(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *Config) { c.Concurrency = 2 })
	r.fake.SetDelay(time.Minute)
	ctx, cancel := context.WithCancel(t.Context())
	msgs := messages(6)
	done := make(chan []channel.Outcome)
	go func() { done <- r.ch.Send(ctx, msgs) }()
	waitFor(t, "two requests at the fake", func() bool { return len(r.fake.Requests()) == 2 })
	cancel()
	outs := <-done

	seen := byToken(r.fake.Requests())
	for i, o := range outs {
		want := channel.NotSent
		if _, ok := seen[msgs[i].Token]; ok {
			want = channel.Unknown
		}
		if o.Kind != want {
			t.Errorf("message %d: %+v, want %v", i, o, want)
		}
	}
}

func TestATimeoutAwaitingTheAnswerIsUnknown(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *Config) { c.Timeout = 500 * time.Millisecond })
	// Open the connection first: under load the handshake alone can
	// outlast the timeout, and that request, never written, is retry_after.
	waitFor(t, "a connection", func() bool { return r.send(t, message(0))[0].Kind == channel.Delivered })
	r.fake.SetDelay(time.Minute)

	o := r.send(t, message(1))[0]
	if o.Kind != channel.Unknown || !strings.Contains(o.Reason, "deadline exceeded") {
		t.Errorf("outcome %+v, want unknown: deadline exceeded", o)
	}
	if _, ok := byToken(r.fake.Requests())[deviceToken(1)]; !ok {
		t.Error("the fake did not receive the request that timed out")
	}
}

func TestManyMessagesShareOneConnection(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	for i, o := range r.send(t, messages(200)...) {
		if o.Kind != channel.Delivered {
			t.Fatalf("message %d: %+v, want delivered", i, o)
		}
	}
	if n := r.fake.Connections(); n != 1 {
		t.Errorf("the fake saw %d connections for 200 messages, want 1", n)
	}
	if n := r.fake.JWTs(); n != 1 {
		t.Errorf("the fake saw %d JWTs, want 1 for the hour", n)
	}
}

func TestConcurrencyIsBoundedAcrossSends(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *Config) { c.Concurrency = 3 })
	r.fake.SetDelay(time.Minute) // hold every request
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	results := make(chan []channel.Outcome, 2)
	for range 2 {
		go func() { results <- r.ch.Send(ctx, messages(6)) }()
	}
	waitFor(t, "three requests at the fake", func() bool { return r.fake.MaxInFlight() == 3 })
	// A fourth, if the bound leaked, would be on its way at once: every
	// other message is waiting for a stream.
	time.Sleep(50 * time.Millisecond)
	if n := len(r.fake.Requests()); n != 3 {
		t.Errorf("%d requests at the fake, want 3, the Concurrency", n)
	}
	cancel()
	count := map[channel.Kind]int{}
	for range 2 {
		for _, o := range <-results {
			count[o.Kind]++
		}
	}
	if count[channel.Unknown] != 3 || count[channel.NotSent] != 9 {
		t.Errorf("outcomes %v, want the 3 held unknown and the other 9 not sent", count)
	}
}
