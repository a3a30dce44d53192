package forward

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/spool"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// claimScheduled spools producer p's event key for recipients, due in an hour.
func (h *forwarderHarness) claimScheduled(key string, recipients ...string) {
	h.t.Helper()
	to := fmt.Sprintf("%q", recipients[0])
	for _, r := range recipients[1:] {
		to += fmt.Sprintf(",%q", r)
	}
	sendAt := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":%q,"type":"t","recipients":[%s],"send_at":%q}`, key, to, sendAt), "")
	if err != nil {
		h.t.Fatal(err)
	}
	h.claim(key, ev.Canonical())
}

// claimCancel spools the cancellation of producer p's event key.
func (h *forwarderHarness) claimCancel(key string) {
	h.t.Helper()
	payload := []byte(`{"cancel":true}`)
	if _, err := h.sp.Claim(context.Background(), spool.Entry{Producer: spool.CancelProducer("p"), Key: key, Hash: event.HashCanonical(payload), Payload: payload}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *forwarderHarness) waitDrained() {
	h.t.Helper()
	testsignal.Eventually(h.t, "the spool to drain", 30*time.Second, func() bool {
		st, err := h.sp.Stats(context.Background())
		return err == nil && st.Pending == 0
	})
}

func cancels(f *Forwarder, o ingest.CancelOutcome) float64 {
	return testutil.ToFloat64(f.cfg.Metrics.cancels.WithLabelValues(o.String()))
}

func TestACancellationWaitsForTheBatchAheadOfItToLand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newForwarderHarness(t, pgtest.DB(t))
	h.claimScheduled("k", "u1")
	h.claimCancel("k")
	// A session holds the recipient's claim, uncommitted: the event's
	// ingest waits for it, its batch in flight, while the other worker
	// comes to the cancellation.
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (key) VALUES ($1)`, ingest.NotificationKey("p", "k", "u1")); err != nil {
		t.Fatal(err)
	}
	// No poll: only the release of the batch ahead can wake the worker.
	f := h.forwarder(Config{Workers: 2, BatchSize: 1, PollInterval: time.Hour})
	f.testSignals.held.Init()
	f.Start(ctx)
	if seq, err := f.testSignals.held.Wait(30 * time.Second); err != nil || seq != 2 {
		t.Fatalf("held back seq %d, %v; want the cancellation, seq 2, held back", seq, err)
	}
	if n := cancels(f, ingest.CancelUnknown) + cancels(f, ingest.Cancelled); n != 0 {
		t.Fatalf("%v cancellations applied while the event was in flight, want 0", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	h.waitDrained()
	if got, unknown := cancels(f, ingest.Cancelled), cancels(f, ingest.CancelUnknown); got != 1 || unknown != 0 {
		t.Errorf("cancellations: %v cancelled, %v unknown; want 1 cancelled", got, unknown)
	}
	if n := h.count(`SELECT count(*) FROM scheduled_notifications WHERE cancelled_at IS NOT NULL`); n != 1 {
		t.Errorf("%d scheduled rows cancelled, want 1", n)
	}
}

func TestAFailedCancellationIsRetriedUntilItLands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newForwarderHarness(t, pgtest.DB(t))
	for _, q := range []string{
		`CREATE FUNCTION fail_cancellations() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN RAISE EXCEPTION 'cancellations fail for now' USING ERRCODE = '40001'; END $$`,
		`CREATE TRIGGER fail_cancellations BEFORE UPDATE ON scheduled_notifications
		 FOR EACH ROW EXECUTE FUNCTION fail_cancellations()`,
	} {
		if _, err := h.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	h.claimScheduled("k", "u1", "u2")
	h.claimCancel("k")
	f := h.forwarder(Config{Workers: 1, MinBackoff: time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	f.testSignals.backoff.Init()
	f.Start(ctx)
	for range 2 {
		if _, err := f.testSignals.backoff.Wait(30 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	pending, err := h.sp.List(ctx, spool.PendingRows, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 1 || !isCancel(pending[0]) || pending[0].Attempts < 1 {
		t.Fatalf("pending after failed cancellations = %+v; want only the cancellation, its attempts counted", pending)
	}
	if n := h.count(`SELECT count(*) FROM scheduled_notifications`); n != 2 {
		t.Fatalf("%d scheduled rows, want the event's 2 landed ahead of its cancellation", n)
	}
	if _, err := h.pool.Exec(ctx, `DROP TRIGGER fail_cancellations ON scheduled_notifications`); err != nil {
		t.Fatal(err)
	}
	h.waitDrained()
	if got := cancels(f, ingest.Cancelled); got != 1 {
		t.Errorf("cancelled = %v, want 1", got)
	}
	if n := h.count(`SELECT count(*) FROM push_dispatches WHERE state = 'cancelled'`); n != 2 {
		t.Errorf("%d cancelled dispatches, want 2", n)
	}
	if dead, _ := h.sp.List(ctx, spool.DeadRows, 0); len(dead) != 0 {
		t.Errorf("%d rows set aside, want none: the failure was not the row's", len(dead))
	}
}
