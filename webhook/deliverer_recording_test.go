package webhook_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/webhook"
)

// tapDB is the pool with a tap on the transactions a deliverer opens: a
// statement can be held before it runs, a commit made to fail, and every
// transaction that ended without committing is counted.
type tapDB struct {
	*pgxpool.Pool
	before     func(sql string) // before each statement in a transaction
	commit     func() error     // before each commit; an error fails it
	rolledBack atomic.Int32
}

func (db *tapDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &tapTx{Tx: tx, db: db}, nil
}

type tapTx struct {
	pgx.Tx
	db        *tapDB
	committed bool
}

func (t *tapTx) statement(sql string) {
	if t.db.before != nil {
		t.db.before(sql)
	}
}

func (t *tapTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.statement(sql)
	return t.Tx.Exec(ctx, sql, args...)
}

func (t *tapTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t.statement(sql)
	return t.Tx.Query(ctx, sql, args...)
}

func (t *tapTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	t.statement(sql)
	return t.Tx.QueryRow(ctx, sql, args...)
}

func (t *tapTx) Commit(ctx context.Context) error {
	if t.db.commit != nil {
		if err := t.db.commit(); err != nil {
			return errors.Join(err, t.Rollback(ctx))
		}
	}
	err := t.Tx.Commit(ctx)
	t.committed = err == nil
	return err
}

func (t *tapTx) Rollback(ctx context.Context) error {
	if !t.committed {
		t.committed = true // counted once: Rollback is also deferred after a failed Commit
		t.db.rolledBack.Add(1)
	}
	return t.Tx.Rollback(ctx)
}

// failCommits makes the tap's next n commits fail, as a connection lost at
// commit does (the transaction is rolled back), and returns how many did.
func (db *tapDB) failCommits(n int32) (failed *atomic.Int32) {
	var left atomic.Int32
	left.Store(n)
	failed = &atomic.Int32{}
	db.commit = func() error {
		if left.Add(-1) >= 0 {
			failed.Add(1)
			return errors.New("connection lost at commit")
		}
		return nil
	}
	return failed
}

// A recording that fails (here its commit) keeps its outcomes for the
// next: the attempt log has every attempt, and what was delivered is not
// sent again when its lease runs out.
func TestAFailedRecordingIsTriedAgainNotLost(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	tap := &tapDB{Pool: e.pool}
	failed := tap.failCommits(1)
	e.d = e.replica(webhook.DelivererConfig{DB: tap})
	r := newReceiver(t)
	e.endpoint(r.URL, webhook.NotificationCreated)
	e.ingest("k", "alice", "bob", "carol")
	e.pass()
	if failed.Load() != 1 {
		t.Fatalf("%d commits failed, want the first", failed.Load())
	}
	e.clk.Advance(time.Hour) // past every lease
	e.pass()
	if n := len(r.deliveries()); n != 3 {
		t.Errorf("the receiver got %d deliveries, want 3, each once", n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_attempts`); n != 3 {
		t.Errorf("%d attempts logged, want 3", n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'`); n != 3 {
		t.Errorf("%d deliveries delivered, want 3", n)
	}
}

// The running deliverer tries a failed recording again by itself, with
// nothing new to record to wake it.
func TestTheRecorderTriesAFailedRecordingAgain(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	tap := &tapDB{Pool: e.pool}
	failed := tap.failCommits(1)
	// A lease far longer than the clock moves here: a delivery recorded
	// is the first attempt's, not a second one's after the lease.
	e.d = e.replica(webhook.DelivererConfig{DB: tap, Timeout: time.Hour})
	r := newReceiver(t)
	e.endpoint(r.URL, webhook.NotificationCreated)
	e.ingest("k", "alice")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.d.Start(ctx)
	defer e.d.Stop(context.Background())
	testsignal.Eventually(t, "the first recording to fail", 10*time.Second, func() bool { return failed.Load() == 1 })
	testsignal.Eventually(t, "the attempt to be recorded", 10*time.Second, func() bool {
		e.clk.Advance(100 * time.Millisecond) // the recorder's backoff is on the clock
		return e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'`) == 1
	})
	if n := e.count(`SELECT count(*) FROM webhook_attempts`); n != 1 {
		t.Errorf("%d attempts logged, want 1", n)
	}
	if n := len(r.deliveries()); n != 1 {
		t.Errorf("the receiver got %d deliveries, want 1", n)
	}
}

// A receiver's answer that is not text Postgres takes (binary, NUL, cut
// mid-character) is logged mangled, and the rest of its batch is recorded.
func TestABinaryAnswerDoesNotFailItsBatch(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	binary, up := newReceiver(t), newReceiver(t)
	binary.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		w.Write([]byte("oops \xff\xfe\x00 \xe2\x82"))
	})
	e.endpoint(binary.URL, webhook.NotificationCreated)
	e.endpoint(up.URL, webhook.NotificationCreated)
	e.ingest("k", "alice")
	e.pass()
	if n := e.count(`SELECT count(*) FROM webhook_attempts`); n != 2 {
		t.Errorf("%d attempts logged, want both", n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_attempts WHERE status = 500 AND error LIKE '500 oops %'`); n != 1 {
		t.Errorf("%d attempts logged with the 500's excerpt, want 1", n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'`); n != 1 {
		t.Errorf("%d deliveries delivered, want the other endpoint's", n)
	}
}

// rendezvous holds each replica's recording before the statement that
// marks endpoints failing until every replica has reached it too, or one
// waits on a lock (a recording ahead of it holds what it needs): with the
// locks each took before it, the interleaving two replicas can meet in.
type rendezvous struct {
	pool    *pgxpool.Pool
	parties int
	arrived atomic.Int32
	stuck   atomic.Bool // a replica gave up waiting
}

func (r *rendezvous) at(sql string) {
	if !strings.Contains(sql, "SET failing_since = coalesce") {
		return
	}
	r.arrived.Add(1)
	deadline := time.Now().Add(20 * time.Second)
	for int(r.arrived.Load()) < r.parties {
		var waiting int
		if err := r.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err == nil && waiting > 0 {
			return
		}
		if time.Now().After(deadline) {
			r.stuck.Store(true)
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Two replicas recording at once, each a success at the endpoint where
// the other had a failure, take the endpoints' locks in one order: neither
// recording fails on a deadlock.
func TestTwoReplicasRecordingTheSameEndpointsDoNotDeadlock(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	x, y := newReceiver(t), newReceiver(t)
	e.endpoint(x.URL, webhook.NotificationCreated)
	e.endpoint(y.URL, webhook.NotificationCreated)
	// Both have been failing: a success clears failing_since, a write.
	e.exec(`UPDATE webhook_endpoints SET failing_since = now()`)
	rv := &rendezvous{pool: e.pool, parties: 2}
	tapA, tapB := &tapDB{Pool: e.pool, before: rv.at}, &tapDB{Pool: e.pool, before: rv.at}
	a, b := e.replica(webhook.DelivererConfig{DB: tapA}), e.replica(webhook.DelivererConfig{DB: tapB})
	run := func(d *webhook.Deliverer, done chan<- struct{}) {
		defer close(done)
		if _, err := d.Pass(context.Background()); err != nil {
			t.Error(err)
		}
		d.Wait()
	}

	x.set(0, 0)
	y.set(http.StatusInternalServerError, 0)
	e.ingest("a", "alice")
	doneA := make(chan struct{})
	go run(a, doneA)
	// A's attempts have ended once its recording reaches the rendezvous.
	testsignal.Eventually(t, "replica A's recording to reach the rendezvous", 10*time.Second, func() bool { return rv.arrived.Load() == 1 })
	x.set(http.StatusInternalServerError, 0)
	y.set(0, 0)
	e.ingest("b", "alice")
	doneB := make(chan struct{})
	go run(b, doneB)
	<-doneA
	<-doneB

	if rv.stuck.Load() || rv.arrived.Load() != 2 {
		t.Fatalf("rendezvous: %d arrived, stuck %v; want both replicas through it", rv.arrived.Load(), rv.stuck.Load())
	}
	if n := tapA.rolledBack.Load() + tapB.rolledBack.Load(); n != 0 {
		t.Errorf("%d recording transactions rolled back, want none", n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_attempts`); n != 4 {
		t.Errorf("%d attempts logged, want 4", n)
	}
}
