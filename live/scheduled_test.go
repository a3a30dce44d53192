package live_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/schedule"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// A scheduled notification reaches the stream when it fires — not at
// ingest — and a socket that resumes from a cursor taken before it fired
// gets it; the feed shows it first.
func TestAScheduledNotificationReachesTheStreamAndTheFeedTopWhenItFiresAndResumeGetsIt(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	clk := clock.NewFake(time.Now())
	firer, err := schedule.New(schedule.Config{DB: s.pool, Clock: clk, Logger: slog.New(slog.DiscardHandler),
		Fired: func() { _ = ingest.WakeUp(context.Background(), s.pool) }})
	if err != nil {
		t.Fatal(err)
	}
	live1 := s.dial("u1", "")
	_, before := s.ready(live1)
	ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":"later","type":"t","recipients":["u1"],"title":"scheduled","send_at":%q}`,
		clk.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)), "")
	if err != nil {
		t.Fatal(err)
	}
	s.ingest(s.pool, []ingest.Item{{Producer: "p", Event: ev}})
	s.ingest(s.pool, items(t, "now", "u1", 2))
	if got := titles(t, next(t, live1, "notification", 2)); fmt.Sprint(got) != "[now-0 now-1]" {
		t.Fatalf("before send_at the stream sent %v", got)
	}
	quiet(t, live1, 300*time.Millisecond)
	clk.Advance(time.Hour)
	if _, _, err := firer.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := titles(t, next(t, live1, "notification", 1)); got[0] != "scheduled" {
		t.Fatalf("at send_at the stream sent %v", got)
	}
	// A socket resuming from before everything gets all three, the scheduled one last.
	resumer := s.dial("u1", before)
	resumed, _ := s.ready(resumer)
	if got := titles(t, resumed); fmt.Sprint(got) != "[now-0 now-1 scheduled]" {
		t.Errorf("the resume sent %v; want the scheduled one too, where it fired", got)
	}
	page, err := feed.NewStore(s.pool, nil).Page(context.Background(), feed.Query{UserID: "u1", Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 3 || page.Items[0].Title != "scheduled" {
		t.Errorf("the feed's first item is %q; want the scheduled notification on top", page.Items[0].Title)
	}
}
