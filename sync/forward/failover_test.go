package forward_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/internal/eventtest"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/spool"
	"github.com/spoolcast/spoolcast/sync/forward"
)

func TestAFailoverToASynchronousStandbyLosesNoAcceptedEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a primary, a standby and a relay subprocess")
	}
	t.Parallel()
	run := failover(t, true)
	if len(run.missing) > 0 {
		t.Errorf("the new primary lacks %d of %d events answered 202 or 200, for example %q; a synchronous standby must hold every one",
			len(run.missing), len(run.answered), run.missing[:min(5, len(run.missing))])
	}
}

// With asynchronous replication the standby lacks the primary's last
// commits, which the relay had acknowledged. The refeed window (on by
// default) forwards them again once the relay finds it is talking to
// another history; without it they are lost, which the test shows too, so
// that it can fail.
func TestAFailoverToAnAsynchronousStandbyLosesNothingWithinTheRefeedWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a primary, a standby and a relay subprocess")
	}
	t.Parallel()
	run := failover(t, false)
	if len(run.missing) > 0 {
		t.Errorf("the new primary lacks %d of %d events answered 202 or 200, for example %q; the refeed window must forward them again",
			len(run.missing), len(run.answered), run.missing[:min(5, len(run.missing))])
	}
}

func TestAFailoverToAnAsynchronousStandbyWithoutARefeedWindowLosesTheLastCommits(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a primary, a standby and a relay subprocess")
	}
	t.Parallel()
	run := failover(t, false, "--refeed-window", "0")
	if len(run.missing) == 0 {
		t.Error("nothing was lost without the refeed window: the test did not make the standby fall behind")
	}
	t.Logf("without a refeed window, the new primary lacks %d of the %d events answered 202 or 200", len(run.missing), len(run.answered))
}

func TestAForwarderPointedAtAStandbyRetriesUntilItIsPromoted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := pgtest.Primary(t, false)
	pair.Migrate(t)
	sp, err := spool.Open(ctx, spool.Config{Path: filepath.Join(t.TempDir(), "spool.db"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close(ctx) })
	pool, err := pgpool.New(ctx, pgpool.Config{URL: pair.Standby.URL, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h := &inProcess{t: t, sp: sp, pool: pool, reg: prometheus.NewRegistry()}
	for i := range 50 {
		ev := eventtest.Event(t, fmt.Sprintf("standby-%d", i), "u1", "u2")
		h.claim(ev.IdempotencyKey, ev.Canonical())
	}
	h.start(forward.Config{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	// Every batch is answered SQLSTATE 25006, read_only_sql_transaction.
	testsignal.Eventually(t, "the forwarder to retry against the standby", 30*time.Second, func() bool {
		return metricValue(t, h.reg, "spoolcast_sync_errors_total") >= 5
	})
	if st, _ := sp.Stats(ctx); st.Dead != 0 || st.Pending != 50 {
		t.Fatalf("spool while only a standby answers: %d dead, %d pending; want 0 and 50", st.Dead, st.Pending)
	}
	if err := pair.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	h.waitDrained(30 * time.Second)
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 100 {
		t.Errorf("notifications on the promoted standby = %d, want 100", n)
	}
	if got := metricValue(t, h.reg, "spoolcast_sync_dead_total"); got != 0 {
		t.Errorf("spoolcast_sync_dead_total = %v, want 0", got)
	}
}

// failoverRun is what a failover left behind.
type failoverRun struct {
	answered map[string]bool // keys answered 202 accepted or 200 duplicate
	missing  []string        // answered keys of which the new primary has no notification
}

// failover runs producers against a relay whose --database-url lists a
// primary and its standby with target_session_attrs=read-write; lets the
// standby fall behind and kills the primary (kill -9) while batches are in
// flight; promotes the standby; and
// waits for the relay, never restarted, to find the new primary and drain
// its spool. It checks what holds whatever the replication: every producer
// was answered, no event has two notifications for one recipient or only
// some of its recipients', no event was set aside as dead, nothing is left
// pending. It returns the answered keys the new primary lacks.
func failover(t *testing.T, synchronous bool, relayArgs ...string) failoverRun {
	t.Helper()
	ctx := context.Background()
	begin := time.Now()
	pair := pgtest.Primary(t, synchronous)
	pair.Migrate(t)
	oldPrimary, newPrimary := pgtest.Connect(t, pair.Primary.URL), pgtest.Connect(t, pair.Standby.URL)
	spoolPath := filepath.Join(t.TempDir(), "spool.db")
	relay := startRelayWith(t, pair.URL, spoolPath, relayArgs)
	t.Logf("primary, standby and relay up in %s", time.Since(begin).Round(time.Millisecond))

	var mu sync.Mutex
	answered := map[string]bool{}
	var posts, duplicates, refused atomic.Int64
	const recipients = 2
	stop := proctest.Load(8, func(g, n int) bool {
		key := fmt.Sprintf("g%d-n%d", g, n)
		if n%4 == 3 {
			key = fmt.Sprintf("g%d-n%d", g, n-1) // a producer's retry: answered 200 duplicate
		}
		s := relay.post(eventBody(key, "u1", fmt.Sprintf("u%d", g+2)))
		mu.Lock()
		defer mu.Unlock()
		if s == http.StatusAccepted || s == http.StatusOK {
			answered[key] = true
			if s == http.StatusOK {
				duplicates.Add(1)
			}
		} else {
			refused.Add(1)
		}
		posts.Add(1)
		return true
	})
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	// waitPosts waits for n more answers to the producers.
	waitPosts := func(what string, n int64) {
		t.Helper()
		from := posts.Load()
		testsignal.Eventually(t, what, 30*time.Second, func() bool { return posts.Load() >= from+n })
	}

	testsignal.Eventually(t, "forwarding to the primary under load", 30*time.Second, func() bool {
		return pgtest.Count(t, oldPrimary, "SELECT count(*) FROM notifications") >= 500
	})
	// The standby falls behind (its WAL sender stops), as it does when its
	// link is slow: an asynchronous primary goes on committing what the
	// standby lacks, a synchronous one holds the commits until the standby
	// has them. Then the primary dies.
	thaw, err := pair.Primary.FreezeWALSenders()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if thaw != nil {
			thaw()
		}
	}()
	if synchronous {
		testsignal.Eventually(t, "the relay's commits to wait for the standby", 30*time.Second, func() bool {
			return pgtest.Count(t, oldPrimary, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'") > 0
		})
	} else {
		ahead := pgtest.Count(t, oldPrimary, "SELECT count(*) FROM notifications") + 200
		testsignal.Eventually(t, "the primary to commit what the standby lacks", 30*time.Second, func() bool {
			return pgtest.Count(t, oldPrimary, "SELECT count(*) FROM notifications") >= ahead
		})
	}
	killed := time.Now()
	if err := pair.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	thaw = nil
	waitPosts("producers to be answered while no primary runs", 300)
	promoting := time.Now()
	if err := pair.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	before := pgtest.Count(t, newPrimary, "SELECT count(*) FROM notifications")
	testsignal.Eventually(t, "the relay to forward to the new primary by itself", 15*time.Second, func() bool {
		return pgtest.Count(t, newPrimary, "SELECT count(*) FROM notifications") > before
	})
	reconnected := time.Now()
	waitPosts("producers to be answered after the promotion", 300)
	stop()
	stopped = true
	testsignal.Eventually(t, "the spool to drain into the new primary", 60*time.Second, func() bool { return pendingIn(t, spoolPath) == 0 })
	drained := time.Now()
	t.Logf("killed the primary %s into the run; promoted the standby in %s, %s after the kill; the relay forwarded to it %s after the promotion and drained %s later (%d posts)",
		killed.Sub(begin).Round(time.Millisecond), promoted.Sub(promoting).Round(time.Millisecond), promoted.Sub(killed).Round(time.Millisecond),
		reconnected.Sub(promoted).Round(time.Millisecond), drained.Sub(reconnected).Round(time.Millisecond), posts.Load())

	if n := refused.Load(); n > 0 {
		t.Errorf("%d posts were not answered 202 or 200: a failover must never reach the producers", n)
	}
	rd, err := spool.OpenReadOnly(spoolPath)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	st, err := rd.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Dead != 0 || st.Pending != 0 {
		t.Errorf("spool after the failover: %d dead, %d pending; want none of either", st.Dead, st.Pending)
	}
	if n := pgtest.Count(t, newPrimary, `SELECT count(*) FROM (SELECT 1 FROM notifications GROUP BY idempotency_key, user_id HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d recipients have an event twice on the new primary", n)
	}
	rows, err := newPrimary.Query(ctx, `SELECT idempotency_key, count(*) FROM notifications WHERE producer = 'billing' GROUP BY idempotency_key`)
	if err != nil {
		t.Fatal(err)
	}
	landed := map[string]int{}
	for rows.Next() {
		var key string
		var n int
		if err := rows.Scan(&key, &n); err != nil {
			t.Fatal(err)
		}
		landed[key] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	run := failoverRun{answered: answered}
	for key := range answered {
		switch n := landed[key]; n {
		case 0:
			run.missing = append(run.missing, key)
		case recipients:
		default:
			t.Errorf("event %s has %d notifications on the new primary, want one for each of its %d recipients", key, n, recipients)
		}
	}
	for key := range landed {
		if !answered[key] {
			t.Errorf("event %s is on the new primary but no producer was answered for it", key)
		}
	}
	t.Logf("%d events answered 202 (%d of them again 200 duplicate), %d on the new primary", len(answered), duplicates.Load(), len(landed))
	relay.Stop()
	return run
}
