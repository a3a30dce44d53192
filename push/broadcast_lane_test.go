package push_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/push"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/topics"
)

// A broadcast's pushes due before a direct one do not hold it back: a
// pass claims the due direct pushes first, then fills its batch with the
// broadcast's. Its members' devices are APNs devices, which topic pacing
// does not spread: all due at once.
func TestADirectPushGoesBeforeABroadcastsPushesDueEarlier(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	// m00's first push is given back unsent (the replica stopping): it
	// stays in the broadcast's lane.
	ch := &scriptedChannel{script: map[string][]channel.Outcome{fmt.Sprintf("%064x", 0): {{Kind: channel.NotSent}, {Kind: channel.Delivered}}}}
	s.devices.Channels = append(s.devices.Channels, ch)
	d, err := push.NewDispatcher(push.DispatcherConfig{DB: s.pool, Sender: s.client, Preferences: s.prefs, Devices: s.devices,
		Channels: []channel.Channel{ch}, BatchSize: 10, Metrics: s.metrics, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	members := make([]string, 30)
	for i := range members {
		members[i] = fmt.Sprintf("m%02d", i)
		if _, err := s.devices.RegisterWith(ctx, members[i], "apns", fmt.Sprintf("%064x", i), devices.IOS); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := topics.NewStore(s.pool).ChangeMembers(ctx, "everyone", members, nil); err != nil {
		t.Fatal(err)
	}
	s.broadcast(map[string]any{"idempotency_key": "launch", "type": "launch", "title": "We launched", "topics": []string{"everyone"}})
	time.Sleep(10 * time.Millisecond) // the direct push is due after every member's
	s.register("u-direct", phone)
	s.ingest("direct-1", "c", "u-direct")

	if _, err := d.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := len(s.fake.Messages()); got != 1 {
		t.Errorf("the first pass sent %d direct pushes; want the one, ahead of the broadcast's", got)
	}
	if got := len(ch.sent); got != 9 {
		t.Errorf("the first pass sent %d of the broadcast's pushes; want 9, the rest of its batch", got)
	}
	var lane []bool
	if err := s.pool.QueryRow(ctx, `SELECT array_agg(broadcast) FROM push_queue WHERE user_id = 'm00'`).Scan(&lane); err != nil || len(lane) != 1 || !lane[0] {
		t.Errorf("m00's push given back is queued with broadcast %v (%v); want the broadcast's lane", lane, err)
	}
	for range 3 {
		if _, err := d.Pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(ch.sent); got != 31 {
		t.Errorf("%d of the broadcast's pushes sent after four passes; want every member's 30, and m00's again", got)
	}
}

// A digest gathering a broadcast's pushes keeps their lane: its one push,
// queued when its window ends, waits behind direct pushes as they did.
func TestADigestOfABroadcastsPushesStaysInItsLane(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	s := newStackOn(t, clk)
	ctx := context.Background()
	s.register("m1", phone)
	if _, err := topics.NewStore(s.pool).ChangeMembers(ctx, "rooms", []string{"m1"}, nil); err != nil {
		t.Fatal(err)
	}
	s.broadcast(map[string]any{"idempotency_key": "room-1", "type": "message", "title": "New message", "topics": []string{"rooms"},
		"digest": map[string]any{"key": "room", "window": "10s"}})
	s.drain() // the member's push joins its digest
	clk.Advance(11 * time.Second)
	if _, _, err := newFirer(t, s.pool, clk).Pass(ctx); err != nil {
		t.Fatal(err)
	}
	var lanes []bool
	if err := s.pool.QueryRow(ctx, `SELECT array_agg(broadcast) FROM push_queue WHERE user_id = 'm1' AND digest_count = 1`).Scan(&lanes); err != nil || len(lanes) != 1 || !lanes[0] {
		t.Errorf("the digest's push is queued with broadcast %v (%v); want one, in the broadcast's lane", lanes, err)
	}
}

// broadcast ingests the topic event body and writes its fan-out whole.
func (s *stack) broadcast(body map[string]any) {
	s.t.Helper()
	raw, _ := json.Marshal(body)
	ev, err := event.Decode(raw, "")
	if err != nil {
		s.t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := ingest.Ingest(ctx, s.pool, []ingest.Item{{Producer: "news", Event: ev}}); err != nil {
		s.t.Fatal(err)
	}
	f, err := topics.NewFanout(topics.FanoutConfig{DB: s.pool})
	if err != nil {
		s.t.Fatal(err)
	}
	if err := f.Drain(ctx); err != nil {
		s.t.Fatal(err)
	}
}
