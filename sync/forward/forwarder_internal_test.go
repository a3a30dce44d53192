package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/spool"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// forwarderHarness is a spool and a database for a forwarder built in the test.
type forwarderHarness struct {
	t    *testing.T
	sp   *spool.Spool
	pool *pgxpool.Pool
}

func newForwarderHarness(t *testing.T, dbURL string) *forwarderHarness {
	t.Helper()
	sp, err := spool.Open(context.Background(), spool.Config{Path: filepath.Join(t.TempDir(), "spool.db"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close(context.Background()) })
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &forwarderHarness{t: t, sp: sp, pool: pool}
}

func (h *forwarderHarness) claim(key string, payload []byte) {
	h.t.Helper()
	if _, err := h.sp.Claim(context.Background(), spool.Entry{Producer: "p", Key: key, Hash: event.HashCanonical(payload), Payload: payload, Fanout: 1}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *forwarderHarness) claimGood(n int) {
	h.t.Helper()
	for i := range n {
		ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":"good-%d","type":"t","recipients":["u1"]}`, i), "")
		if err != nil {
			h.t.Fatal(err)
		}
		h.claim(ev.IdempotencyKey, ev.Canonical())
	}
}

func (h *forwarderHarness) forwarder(cfg Config) *Forwarder {
	h.t.Helper()
	cfg.Spool, cfg.DB, cfg.Logger = h.sp, h.pool, slog.New(slog.DiscardHandler)
	f, err := New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { f.Stop(context.Background()) })
	return f
}

func (h *forwarderHarness) count(query string) int {
	h.t.Helper()
	var n int
	if err := h.pool.QueryRow(context.Background(), query).Scan(&n); err != nil {
		h.t.Fatal(err)
	}
	return n
}

func TestARepeatedWholeRefusalBacksOffToTheMaximum(t *testing.T) {
	t.Parallel()
	h := newForwarderHarness(t, pgtest.DB(t))
	for i := range 3 { // jsonb holds no NUL: Postgres refuses every row
		h.claim(fmt.Sprintf("nul-%d", i), fmt.Appendf(nil, `{"idempotency_key":"nul-%d","type":"t","category":"c","recipients":["u1"],"data":{"a":"\u0000"}}`, i))
	}
	clk := clock.NewFake(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	const minWait, maxWait = 100 * time.Millisecond, 3200 * time.Millisecond
	f := h.forwarder(Config{Workers: 1, MinBackoff: minWait, MaxBackoff: maxWait, PollInterval: time.Hour, Clock: clk})
	f.testSignals.backoff.Init()
	f.testSignals.landed.Init()
	f.Start(context.Background())
	var waits []time.Duration
	for range 8 {
		wait, err := f.testSignals.backoff.Wait(30 * time.Second)
		if err != nil {
			t.Fatalf("after waits %v: %v", waits, err)
		}
		waits = append(waits, wait)
		clk.Advance(wait)
	}
	// Each try gives the batch back; the wait still doubles until it reaches
	// the maximum (full jitter on its upper half).
	if last := waits[len(waits)-1]; last < maxWait/2 {
		t.Errorf("waits between whole refusals = %v; want them to grow to at least %v", waits, maxWait/2)
	}
	for i, w := range waits[:3] {
		if lo := (minWait << i) / 2; w < lo || w > minWait<<i {
			t.Errorf("wait %d = %v, want within [%v, %v]", i+1, w, lo, minWait<<i)
		}
	}
	if dead, _ := h.sp.List(context.Background(), spool.DeadRows, 0); len(dead) != 0 {
		t.Errorf("%d rows buried although Postgres took nothing at all", len(dead))
	}
	// Once a row lands, the streak ends and the refused rows are shown to be at fault.
	h.claimGood(1)
	clk.Advance(maxWait)
	for {
		n, err := f.testSignals.landed.Wait(50 * time.Millisecond)
		if err == nil && n > 0 {
			break
		}
		clk.Advance(maxWait) // the worker may be waiting out a backoff or its poll
	}
	testsignal.Eventually(t, "the refused rows to be set aside", 30*time.Second, func() bool {
		dead, _ := h.sp.List(context.Background(), spool.DeadRows, 0)
		return len(dead) == 3
	})
}

func TestAStatementThatRunsTooLongIsSentInHalves(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.DB(t)
	h := newForwarderHarness(t, dbURL+"&options=-c%20statement_timeout%3D1000")
	// Postgres takes statements of up to 100 notifications; a bigger one
	// stalls until statement_timeout cancels it.
	for _, q := range []string{
		`CREATE FUNCTION stall_big_statements() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN IF (SELECT count(*) FROM new_rows) > 100 THEN PERFORM pg_sleep(30); END IF; RETURN NULL; END $$`,
		`CREATE TRIGGER stall_big_statements AFTER INSERT ON notifications REFERENCING NEW TABLE AS new_rows
		 FOR EACH STATEMENT EXECUTE FUNCTION stall_big_statements()`,
	} {
		if _, err := h.pool.Exec(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
	h.claimGood(400)
	f := h.forwarder(Config{Workers: 1, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	f.testSignals.landed.Init()
	f.Start(context.Background())
	landed := 0
	for landed < 400 {
		n, err := f.testSignals.landed.Wait(60 * time.Second)
		if err != nil {
			t.Fatalf("after %d landed: %v", landed, err)
		}
		if n > 100 {
			t.Errorf("a statement of %d events landed past the stall", n)
		}
		landed += n
	}
	if n := h.count("SELECT count(*) FROM notifications"); n != 400 {
		t.Errorf("notifications = %d, want 400", n)
	}
}

func TestStartAndStopAreSafeToRepeat(t *testing.T) {
	t.Parallel()
	h := newForwarderHarness(t, pgtest.DB(t))
	f := h.forwarder(Config{Workers: 2})
	f.Start(context.Background())
	f.Start(context.Background())
	h.claimGood(3)
	if err := f.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := f.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if n := h.count("SELECT count(*) FROM notifications"); n != 3 {
		t.Errorf("notifications = %d after Stop's final flush, want 3", n)
	}
	unstarted := h.forwarder(Config{})
	if err := unstarted.Stop(context.Background()); err != nil {
		t.Errorf("Stop of a forwarder never started: %v", err)
	}
}

func TestWhatCountsAsRefusedForGood(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		good bool
	}{
		{&pgconn.PgError{Code: "22P05"}, true}, // data exception
		{&pgconn.PgError{Code: "23505"}, true}, // every claim uses ON CONFLICT: no race makes this
		{&pgconn.PgError{Code: "23503"}, true}, // foreign key
		{&pgconn.PgError{Code: "54000"}, true}, // program limit
		{fmt.Errorf("ingest: %w", errors.New("message body too large")), true},
		{&pgconn.PgError{Code: "57014"}, false}, // statement timeout: split, never bury
		{&pgconn.PgError{Code: "42P01"}, false}, // a missing table: the schema, not the row
		{&pgconn.PgError{Code: "40001"}, false},
		{context.DeadlineExceeded, false},
	} {
		if got := refusedForGood(tc.err); got != tc.good {
			t.Errorf("refusedForGood(%v) = %v, want %v", tc.err, got, tc.good)
		}
	}
}

// TestAServerGoneOrReadOnlyIsNeverARefusalForGood: during a failover the
// forwarder meets standbys, fenced primaries, dead ones and broken
// connections; each is a reason to back off and retry, never to set an
// event aside.
func TestAServerGoneOrReadOnlyIsNeverARefusalForGood(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.DB(t)

	// Real answers: the ingest statement on a read-only server, and
	// connections that cannot be made, one of them refused with a class-22
	// code in its startup answer.
	readOnly, err := pgxpool.New(ctx, dbURL+"&options=-c%20default_transaction_read_only%3Don")
	if err != nil {
		t.Fatal(err)
	}
	defer readOnly.Close()
	ev, err := event.Decode([]byte(`{"idempotency_key":"k","type":"t","recipients":["u1"]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	_, ingestReadOnly := ingest.Ingest(ctx, readOnly, []ingest.Item{{Producer: "p", Event: ev}})
	_, badOption := pgconn.Connect(ctx, dbURL+"&options=-c%20statement_timeout%3Dbogus")
	_, refused := pgconn.Connect(ctx, "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2")
	if pgErr := (*pgconn.PgError)(nil); !errors.As(ingestReadOnly, &pgErr) || pgErr.Code != "25006" {
		t.Fatalf("ingest on a read-only server: %v, want SQLSTATE 25006", ingestReadOnly)
	}
	if pgErr := (*pgconn.PgError)(nil); !errors.As(badOption, &pgErr) || pgErr.Code[:2] != "22" {
		t.Fatalf("a connection with a bad option: %v, want a class-22 answer", badOption)
	}

	for _, tc := range []struct {
		name string
		err  error
	}{
		{"the ingest statement on a read-only server", ingestReadOnly},
		{"a standby's read_only_sql_transaction", &pgconn.PgError{Code: "25006"}},
		{"any invalid transaction state", &pgconn.PgError{Code: "25P02"}},
		{"a connection failure", &pgconn.PgError{Code: "08006"}},
		{"PgBouncer's lost server", &pgconn.PgError{Code: "08P01"}},
		{"an admin shutdown", &pgconn.PgError{Code: "57P01"}},
		{"a crash shutdown", &pgconn.PgError{Code: "57P02"}},
		{"a server starting up", &pgconn.PgError{Code: "57P03"}},
		{"a connection refused", refused},
		{"a connection refused for a bad option, with a class-22 answer", badOption},
		{"a dial refused", fmt.Errorf("ingest: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})},
		{"a connection reset", fmt.Errorf("ingest: %w", syscall.ECONNRESET)},
		{"an unexpected EOF", fmt.Errorf("ingest 3 events: %w", io.ErrUnexpectedEOF)},
		{"an EOF", io.EOF},
	} {
		if refusedForGood(tc.err) {
			t.Errorf("%s (%v) counts as refused for good: the event would be set aside as dead", tc.name, tc.err)
		}
	}
}
