package central_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
)

// TestReadinessFailsWhileOnlyAReadOnlyServerAnswersAndPassesOnTheNewPrimary
// runs a switchover under two replicas of central: one whose URL lists both
// servers with target_session_attrs=read-write, one whose URL names only the
// standby. The old primary is fenced read-only, keeping its connections
// open, before the standby is promoted.
func TestReadinessFailsWhileOnlyAReadOnlyServerAnswersAndPassesOnTheNewPrimary(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary and a standby of its own")
	}
	t.Parallel()
	ctx := context.Background()
	r := pgtest.Primary(t, false)
	r.Migrate(t)
	newReplica := func(url string) *harness {
		pool, err := pgpool.New(ctx, pgpool.Config{URL: url, MaxConns: 4, ConnectTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return newHarness(t, options{pool: pool})
	}
	following, onStandby := newReplica(r.URL), newReplica(r.Standby.URL)
	ready := func(h *harness) bool {
		return h.request(http.MethodGet, "/readyz", "", "").status == http.StatusOK
	}

	if !ready(following) {
		t.Fatal("a replica on the primary is not ready")
	}
	// Several connections, all to the primary, sit in the pool.
	token := following.iss.Token("alice")
	for range 4 {
		if s := following.request(http.MethodGet, "/v1/notifications", token, "").status; s != http.StatusOK {
			t.Fatalf("feed before the switch = %d", s)
		}
	}
	resp := onStandby.request(http.MethodGet, "/readyz", "", "")
	if resp.status != http.StatusServiceUnavailable || !strings.Contains(string(resp.raw), "read-only") {
		t.Errorf("readiness on a standby = %d %s; want 503 saying Postgres answers read-only", resp.status, resp.raw)
	}

	fence := pgtest.Connect(t, r.Primary.URL)
	for _, q := range []string{`ALTER SYSTEM SET default_transaction_read_only = on`, `SELECT pg_reload_conf()`} {
		if _, err := fence.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	testsignal.Eventually(t, "readiness to fail while only read-only servers answer", 10*time.Second, func() bool { return !ready(following) })
	if ready(following) || ready(onStandby) {
		t.Fatal("a replica is ready while no server takes writes")
	}

	start := time.Now()
	if err := r.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	testsignal.Eventually(t, "readiness to pass on the new primary", 10*time.Second, func() bool { return ready(following) && ready(onStandby) })
	t.Logf("ready again %s after the promotion began", time.Since(start).Round(time.Millisecond))

	// What made it ready is a pool on the new primary: writes land there.
	emit, _ := auth.SignServiceToken(serviceSecret, "billing", []string{"push:emit"}, time.Now(), time.Minute)
	body := `{"idempotency_key":"after-switch","type":"t","recipients":["alice"],"title":"t"}`
	if s := following.request(http.MethodPost, "/internal/v1/events", emit, body).status; s != http.StatusAccepted {
		t.Errorf("ingest after the switch = %d, want 202", s)
	}
	if n := pgtest.Count(t, pgtest.Connect(t, r.Standby.URL), `SELECT count(*) FROM notifications WHERE idempotency_key = 'after-switch'`); n != 1 {
		t.Errorf("the new primary holds %d notifications of the event ingested after the switch, want 1", n)
	}
}
