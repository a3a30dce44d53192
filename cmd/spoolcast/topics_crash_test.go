package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/oidctest"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/topics"
)

// startFanoutCentral runs `spoolcast central` writing topic fan-outs in
// small batches, so that a kill lands mid-batch.
func startFanoutCentral(t *testing.T, dbURL string) *proctest.Process {
	t.Helper()
	iss := oidctest.New(t)
	addr := proctest.FreeAddr(t)
	p := proctest.Start(t, nil, "central", "--listen", addr, "--database-url", dbURL, "--db-connect-timeout", "1s",
		"--oidc-issuer", iss.URL(), "--oidc-audience", oidctest.Audience, "--jwks-url", iss.JWKSURL(),
		"--push=false", "--maintenance-interval", "0", "--log-level", "error", "--topic-batch-size", "250")
	p.WaitHealthy("http://" + addr)
	return p
}

// topicFanoutReady fills topic "everyone" with n members and ingests one
// event to it; it returns a pool on dbURL.
func topicFanoutReady(t *testing.T, dbURL string, n int) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Connect(t, dbURL)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("member-%06d", i)
	}
	store := topics.NewStore(pool)
	for len(ids) > 0 {
		k := min(len(ids), topics.MaxChange)
		if _, err := store.ChangeMembers(ctx, "everyone", ids[:k], nil); err != nil {
			t.Fatal(err)
		}
		ids = ids[k:]
	}
	// Every hundredth member has a phone: their pushes are queued once each.
	if _, err := pool.Exec(ctx, `INSERT INTO devices (token, user_id, platform)
		SELECT 'ExponentPushToken[' || user_id || ']', user_id, 'ios' FROM topic_members WHERE topic = 'everyone' AND right(user_id, 2) = '00'`); err != nil {
		t.Fatal(err)
	}
	ev, err := event.Decode([]byte(`{"idempotency_key":"launch-1","type":"launch","title":"We launched","topics":["everyone"]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ingest.Ingest(ctx, pool, []ingest.Item{{Producer: "news", Event: ev}}); err != nil {
		t.Fatal(err)
	}
	return pool
}

// written reads how many members the fan-out has written; -1 while
// Postgres does not answer.
func written(pool *pgxpool.Pool) int {
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(sum(written), 0) FROM topic_fanout_ranges`).Scan(&n); err != nil {
		return -1
	}
	return n
}

// checkEveryMemberOnce fails unless the fan-out completed with each of the n
// members' notifications written exactly once, none skipped: a batch cut
// off by a crash left nothing behind to skip.
func checkEveryMemberOnce(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	testsignal.Eventually(t, "the fan-out to complete", 90*time.Second, func() bool {
		var state string
		err := pool.QueryRow(context.Background(), `SELECT state FROM topic_fanouts`).Scan(&state)
		return err == nil && state == topics.StateCompleted
	})
	if got := pgtest.Count(t, pool, `SELECT count(*) FROM notifications WHERE idempotency_key = 'launch-1'`); got != n {
		t.Errorf("%d notifications; want %d", got, n)
	}
	if got := pgtest.Count(t, pool, `SELECT count(DISTINCT user_id) FROM notifications WHERE idempotency_key = 'launch-1'`); got != n {
		t.Errorf("%d members reached; want %d", got, n)
	}
	if got := pgtest.Count(t, pool, `SELECT count(*) FROM push_queue`); got != n/100 {
		t.Errorf("%d pushes queued; want %d, one for each member with a phone", got, n/100)
	}
	var w, s int
	if err := pool.QueryRow(context.Background(), `SELECT sum(written), sum(skipped) FROM topic_fanout_ranges`).Scan(&w, &s); err != nil || w != n || s != 0 {
		t.Errorf("ranges say %d written, %d skipped (%v); want %d and 0", w, s, err, n)
	}
}

// Two central replicas share a fan-out; each is killed (SIGKILL) in the
// middle of it, a third comes up; every member gets the event once.
func TestATopicFanoutSurvivesReplicasKilledMidBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("runs central replicas as subprocesses")
	}
	t.Parallel()
	const members = 30_000
	dbURL := pgtest.DB(t)
	pool := topicFanoutReady(t, dbURL, members)
	a, b := startFanoutCentral(t, dbURL), startFanoutCentral(t, dbURL)
	testsignal.Eventually(t, "a fifth of the members written", 60*time.Second, func() bool { return written(pool) >= members/5 })
	a.Kill()
	c := startFanoutCentral(t, dbURL)
	at := written(pool)
	testsignal.Eventually(t, "more members written after the first kill", 60*time.Second, func() bool { return written(pool) >= at+members/5 })
	b.Kill()
	checkEveryMemberOnce(t, pool, members)
	c.Stop()
}

// The primary dies mid-fan-out and its synchronous standby is promoted:
// central writes on, on the promoted standby, from the last batch the
// primary committed, and every member gets the event once.
func TestATopicFanoutResumesOnThePromotedStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a primary, a standby and central as a subprocess")
	}
	t.Parallel()
	const members = 20_000
	pair := pgtest.Primary(t, true)
	pair.Migrate(t)
	pool := topicFanoutReady(t, pair.URL, members)
	central := startFanoutCentral(t, pair.URL)
	testsignal.Eventually(t, "a fifth of the members written", 60*time.Second, func() bool { return written(pool) >= members/5 })
	pair.FailOver(t)
	checkEveryMemberOnce(t, pool, members)
	central.Stop()
}
