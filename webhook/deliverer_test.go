package webhook_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/webhook"
)

// maintain runs Maintain until it has nothing more to do now.
func (e *env) maintain() {
	e.t.Helper()
	for range 100 {
		more, err := e.d.Maintain(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		if !more {
			return
		}
	}
	e.t.Fatal("Maintain still had more after 100 rounds")
}

// An endpoint at its cap with a backlog older than everything else does
// not hide the other endpoints' deliveries: the scenario a review
// reproduced, 60 deliveries to a receiver slow to answer (here: holding
// its answers), then 5 to a fast one.
func TestABacklogAtAnEndpointsCapDoesNotHoldBackOtherEndpoints(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{Timeout: time.Minute, Concurrency: 8, PerEndpoint: 2})
	slow, fast := newReceiver(t), newReceiver(t)
	release := slow.hold(t)
	e.endpoint(slow.URL, webhook.NotificationCreated)
	for i := range 60 {
		e.ingest(fmt.Sprintf("slow-%d", i), "alice")
	}
	e.endpoint(fast.URL, webhook.NotificationCreated)
	for i := range 5 {
		e.ingest(fmt.Sprintf("both-%d", i), "alice")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.d.Start(ctx)
	defer e.d.Stop(context.Background())
	defer release() // before Stop, which waits for the held attempts
	testsignal.Eventually(t, "the fast receiver to get its 5 deliveries while the slow one holds its share", 10*time.Second,
		func() bool { return len(fast.deliveries()) == 5 })
	testsignal.Eventually(t, "the slow receiver's requests to arrive", 10*time.Second, func() bool { return slow.requested() >= 2 })
	if n := slow.requested(); n != 2 {
		t.Errorf("the slow receiver has %d requests in flight, want its cap of 2", n)
	}
}

// One pass takes each endpoint's share: the endpoint whose rows are oldest
// filling its cap does not end the pass.
func TestOnePassTakesEveryEndpointsShare(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{Concurrency: 8, PerEndpoint: 2})
	older, newer := newReceiver(t), newReceiver(t)
	e.endpoint(older.URL, webhook.NotificationCreated)
	for i := range 60 {
		e.ingest(fmt.Sprintf("older-%d", i), "alice")
	}
	e.endpoint(newer.URL, webhook.NotificationCreated)
	for i := range 5 {
		e.ingest(fmt.Sprintf("both-%d", i), "alice")
	}
	if _, err := e.d.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.d.Wait()
	if n := len(older.deliveries()); n != 2 {
		t.Errorf("one pass sent the first endpoint %d, want its share of 2", n)
	}
	if n := len(newer.deliveries()); n != 2 {
		t.Errorf("one pass sent the second endpoint %d, want its share of 2", n)
	}
}

// Disabling an endpoint is one row, however many deliveries it has
// pending: the recording of the batch that disabled it commits, other
// endpoints' outcomes with it, and Maintain ends the backlog in batches.
func TestDisablingAnEndpointWithABacklogIsRecordedAndMaintainEndsTheBacklog(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	gone, up := newReceiver(t), newReceiver(t)
	gone.set(http.StatusGone, 0)
	epGone := e.endpoint(gone.URL, webhook.NotificationCreated)
	epUp := e.endpoint(up.URL, webhook.NotificationCreated)
	e.ingest("k", "alice") // one due delivery to each
	const backlog = 12_000 // more than one Maintain batch
	e.exec(`INSERT INTO webhook_deliveries (endpoint_id, type, payload, next_attempt_at)
		SELECT $1, 'notification.created', '{}', now() + interval '1 hour' FROM generate_series(1, $2)`, epGone.ID, backlog)
	// A session holding one of the backlog's rows stands in for a backlog
	// of millions: a recording that must update all of them waits past
	// its time limit either way.
	endHold := pgtest.HoldOpen(t, e.url, fmt.Sprintf(`SELECT 1 FROM webhook_deliveries
		WHERE endpoint_id = '%s' AND attempts = 0 AND next_attempt_at > now() LIMIT 1 FOR UPDATE`, epGone.ID))

	e.pass()
	got, _ := e.store.Get(context.Background(), epGone.ID)
	if got.Enabled || got.DisabledReason == nil || !strings.Contains(*got.DisabledReason, "410") {
		t.Fatalf("after 410: enabled %v, reason %v", got.Enabled, got.DisabledReason)
	}
	if n := e.count(`SELECT count(*) FROM webhook_attempts`); n != 2 {
		t.Errorf("%d attempts logged, want both endpoints' 1", n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND state = 'delivered'`, epUp.ID); n != 1 {
		t.Errorf("the other endpoint has %d deliveries delivered, want 1", n)
	}

	endHold()

	// Until Maintain ends them, the disabled endpoint's deliveries are not
	// sent when they come due, nor stand in the way of newer ones.
	e.exec(`UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 minute' WHERE endpoint_id = $1`, epGone.ID)
	e.ingest("k2", "alice")
	e.pass()
	if n := gone.requested(); n != 1 {
		t.Errorf("the disabled endpoint had %d requests, want the one it answered 410", n)
	}
	if n := len(up.deliveries()); n != 2 {
		t.Errorf("the other endpoint got %d deliveries, want 2", n)
	}

	e.maintain()
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND state = 'failed' AND last_error LIKE '%endpoint disabled'`, epGone.ID); n != backlog+1 {
		t.Errorf("%d of the disabled endpoint's %d deliveries ended failed", n, backlog+1)
	}
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'`); n != 0 {
		t.Errorf("%d deliveries still pending", n)
	}
	if n := testutil.ToFloat64(webhook.Ended(e.metrics, "failed")); n != backlog+1 {
		t.Errorf("ended{failed} = %v, want %d", n, backlog+1)
	}
	if n := testutil.ToFloat64(webhook.Ended(e.metrics, "delivered")); n != 2 {
		t.Errorf("ended{delivered} = %v, want 2", n)
	}
}

// The ended counter counts deliveries that ended, once each: not an
// attempt whose delivery was deleted while it was in flight.
func TestEndedCountsDeliveriesThatEndedNotAttempts(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	r := newReceiver(t)
	release := r.hold(t)
	ep := e.endpoint(r.URL, webhook.NotificationCreated)
	e.ingest("k", "alice")
	if _, err := e.d.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	testsignal.Eventually(t, "the attempt to reach the receiver", 10*time.Second, func() bool { return r.requested() == 1 })
	if err := e.store.Delete(context.Background(), ep.ID); err != nil {
		t.Fatal(err)
	}
	e.maintain() // removes the deleted endpoint's deliveries
	release()
	e.d.Wait()
	if n := len(r.deliveries()); n != 1 {
		t.Fatalf("the receiver got %d, want 1", n)
	}
	if n := testutil.ToFloat64(webhook.Ended(e.metrics, "delivered")); n != 0 {
		t.Errorf("ended{delivered} = %v for a delivery deleted before its attempt ended, want 0", n)
	}
}

// A first attempt in flight is new, not retrying: retrying says a
// receiver failed. A replay makes a failed delivery new again.
func TestAFirstAttemptInFlightIsNewNotRetrying(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	r := newReceiver(t)
	r.set(http.StatusInternalServerError, 0)
	release := r.hold(t)
	ep := e.endpoint(r.URL, webhook.NotificationCreated)
	e.ingest("k", "alice")
	stages := func() string {
		t.Helper()
		e.maintain()
		return fmt.Sprintf("new %v, retrying %v",
			testutil.ToFloat64(webhook.Pending(e.metrics, "new")), testutil.ToFloat64(webhook.Pending(e.metrics, "retrying")))
	}
	if _, err := e.d.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := stages(); got != "new 1, retrying 0" {
		t.Errorf("first attempt in flight: %s", got)
	}
	release()
	e.d.Wait()
	if got := stages(); got != "new 0, retrying 1" {
		t.Errorf("after the attempt failed: %s", got)
	}
	if _, err := e.store.Replay(context.Background(), ep.ID, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got := stages(); got != "new 1, retrying 0" {
		t.Errorf("after a replay: %s", got)
	}
}

// An attempt in flight when a replay ran belongs to the run before it: its
// outcome (a failure past that run's retry period), landing after the
// replayed delivery was taken again, neither ends it nor moves its next
// attempt; the replay's attempt decides.
func TestAnAttemptInFlightDuringAReplayLeavesTheReplayToRun(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{RetryFor: time.Hour})
	r := newReceiver(t)
	ep := e.endpoint(r.URL, webhook.NotificationCreated)
	e.ingest("k", "alice")
	e.clk.Advance(2 * time.Hour) // the delivery's retry period is over
	r.set(http.StatusInternalServerError, 0)
	releaseEarlier := r.hold(t)
	if _, err := e.d.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	testsignal.Eventually(t, "the earlier attempt to reach the receiver", 10*time.Second, func() bool { return r.requested() == 1 })
	if n, err := e.store.Replay(context.Background(), ep.ID, time.Time{}); err != nil || n != 1 {
		t.Fatalf("replay queued %d (%v), want 1", n, err)
	}
	r.set(0, 0)
	releaseReplayed := r.hold(t)
	if _, err := e.d.Pass(context.Background()); err != nil { // the replay's first attempt, as the earlier one's
		t.Fatal(err)
	}
	testsignal.Eventually(t, "the replay's attempt to reach the receiver", 10*time.Second, func() bool { return r.requested() == 2 })
	releaseEarlier()
	e.flushUntil("the earlier attempt to be recorded", 1)
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'`); n != 1 {
		t.Errorf("after the earlier attempt's failure: %d deliveries pending, want the replayed one", n)
	}
	releaseReplayed()
	e.d.Wait()
	if n := len(r.deliveries()); n != 1 {
		t.Errorf("the replay delivered %d, want 1", n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'`); n != 1 {
		t.Errorf("%d deliveries delivered, want 1", n)
	}
	if n := testutil.ToFloat64(webhook.Ended(e.metrics, "failed")); n != 0 {
		t.Errorf("ended{failed} = %v, want 0", n)
	}
}

// A failed attempt whose lease ran out, and that was taken again, is
// logged but does not move the next attempt of the lease after it: that
// delivery is not sent a third time while the second attempt is in flight.
func TestAFailureWhoseLeaseRanOutLeavesTheNextLeaseAlone(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{Timeout: 10 * time.Second}) // a lease of 40 s
	r := newReceiver(t)
	e.endpoint(r.URL, webhook.NotificationCreated)
	e.ingest("k", "alice")
	r.set(http.StatusInternalServerError, 0)
	releaseFirst := r.hold(t)
	if _, err := e.d.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	testsignal.Eventually(t, "the first attempt to reach the receiver", 10*time.Second, func() bool { return r.requested() == 1 })
	e.clk.Advance(time.Minute) // its lease ran out (a replica stalled, say)
	r.set(0, 0)
	releaseSecond := r.hold(t)
	if _, err := e.d.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	testsignal.Eventually(t, "the second attempt to reach the receiver", 10*time.Second, func() bool { return r.requested() == 2 })
	releaseFirst()
	e.flushUntil("the first attempt to be recorded", 1)
	e.clk.Advance(10 * time.Second) // past the first failure's backoff, within the second lease
	if _, err := e.d.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	releaseSecond()
	e.d.Wait()
	if n := r.requested(); n != 2 {
		t.Errorf("the receiver had %d requests, want 2", n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'`); n != 1 {
		t.Errorf("%d deliveries delivered, want 1", n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_attempts`); n != 2 {
		t.Errorf("%d attempts logged, want both", n)
	}
}

// flushUntil records what has ended until the attempt log has n rows,
// while other attempts are still in flight (Wait would wait for them).
func (e *env) flushUntil(what string, n int) {
	e.t.Helper()
	testsignal.Eventually(e.t, what, 10*time.Second, func() bool {
		if err := e.d.Flush(context.Background()); err != nil {
			e.t.Fatal(err)
		}
		return e.count(`SELECT count(*) FROM webhook_attempts`) == n
	})
}

// Due rows another session holds locked (another replica's lease in
// flight) are stepped over: the pass leases the endpoint's next ones.
func TestAPassStepsOverDueRowsLockedElsewhere(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	r := newReceiver(t)
	release := r.hold(t)
	defer e.d.Wait()
	defer release() // before Wait, which waits for the held attempts
	ep := e.endpoint(r.URL, webhook.NotificationCreated)
	e.exec(`INSERT INTO webhook_deliveries (endpoint_id, type, payload, next_attempt_at)
		SELECT $1, 'notification.created', '{}', now() - interval '1 hour' + g * interval '1 ms' FROM generate_series(1, 1000) g`, ep.ID)
	end := pgtest.HoldOpen(t, e.url, `SELECT 1 FROM webhook_deliveries WHERE id IN (
		SELECT id FROM webhook_deliveries ORDER BY next_attempt_at LIMIT 16) FOR UPDATE`)
	defer end()
	more, err := e.d.Pass(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !more {
		t.Error("the pass leased nothing past the 16 locked rows")
	}
	testsignal.Eventually(t, "the endpoint's share of 16 to be sent", 10*time.Second, func() bool { return r.requested() == webhook.DefaultPerEndpoint })
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE attempts > 0 AND id IN (
		SELECT id FROM webhook_deliveries ORDER BY next_attempt_at LIMIT 16)`); n != 0 {
		t.Errorf("%d of the locked rows were leased", n)
	}
}

// Replicas passing at the same moment share the due rows: together they
// lease as many as they have room for, none twice.
func TestReplicasPassingTogetherLeaseTheirRoomAndNothingTwice(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	r := newReceiver(t)
	release := r.hold(t)
	var eps []string
	for range 4 {
		eps = append(eps, e.endpoint(r.URL, webhook.NotificationCreated).ID)
	}
	for _, ep := range eps {
		e.exec(`INSERT INTO webhook_deliveries (endpoint_id, type, payload, next_attempt_at)
			SELECT $1, 'notification.created', '{}', now() - interval '1 hour' + g * interval '1 ms' FROM generate_series(1, 5000) g`, ep)
	}
	const replicas = 6
	ds := make([]*webhook.Deliverer, replicas)
	for i := range ds {
		ds[i] = e.replica(webhook.DelivererConfig{})
	}
	defer func() {
		release()
		for _, d := range ds {
			d.Wait()
		}
	}()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, d := range ds {
		wg.Go(func() {
			<-start
			if _, err := d.Pass(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	// 4 endpoints of 16 per replica: each replica's room of 32 is filled.
	want := replicas * webhook.DefaultConcurrency
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE attempts > 0`); n != want {
		t.Errorf("%d replicas passing at once leased %d rows, want their room of %d", replicas, n, want)
	}
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE attempts > 1`); n != 0 {
		t.Errorf("%d rows leased twice", n)
	}
}
