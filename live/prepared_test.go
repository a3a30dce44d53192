package live_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/wsclient"
	"github.com/spoolcast/spoolcast/live"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// plans is what Postgres made of one prepared statement.
type plans struct{ generic, custom int }

// querier is a pool, or one of its connections.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// prepared answers, on conn, the plans of each statement it holds prepared.
func prepared(t *testing.T, conn querier) map[string]plans {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements`, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]plans{}
	for rows.Next() {
		var sql string
		var p plans
		if err := rows.Scan(&sql, &p.generic, &p.custom); err != nil {
			t.Fatal(err)
		}
		out[sql] = p
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// stream ingests n notifications for u1 one at a time, each read as a
// live frame on c, and returns their titles.
func (s *stack) stream(c *wsclient.Conn, prefix string, n int) []string {
	s.t.Helper()
	var out []string
	for i := range n {
		s.ingest(s.pool, items(s.t, fmt.Sprintf("%s%d", prefix, i), "u1", 1))
		out = append(out, titles(s.t, next(s.t, c, "notification", 1))...)
	}
	return out
}

// resume reconnects u1 from cursor and checks that it replays want.
func (s *stack) resume(cursor string, want int) {
	s.t.Helper()
	c := s.dial("u1", cursor)
	defer c.Close()
	if resumed, _ := s.ready(c); len(resumed) != want {
		s.t.Fatalf("resumed %d notifications, want %d", len(resumed), want)
	}
}

func TestOnADirectConnectionTheLiveStatementsRunPrepared(t *testing.T) {
	t.Parallel()
	url := pgtest.DB(t)
	s := newCentralStack(t, url, url)
	c := s.dial("u1", "")
	_, start := s.ready(c)
	s.stream(c, "p", 3)
	for range 6 { // past the five custom plans Postgres tries first
		s.resume(start, 3)
	}

	// The reader plans its reads once, for good: Postgres would keep
	// planning the notifications read at every run (its generic plan's
	// estimate looks worse than it runs).
	read := prepared(t, s.reader)
	for i, sql := range live.ReaderStatements() {
		p, ok := read[sql]
		switch {
		case !ok:
			t.Errorf("the reader's statement %d is not prepared on its connection", i)
		case p.custom != 0:
			t.Errorf("the reader's statement %d made %d custom plans; want generic plans only", i, p.custom)
		}
	}
	if p := read[live.ReaderStatements()[0]]; p.generic < 3 {
		t.Errorf("the notifications read ran %d times on a generic plan; want one at least per frame", p.generic)
	}
	// Every connection of the resumes' pool holds their statements.
	conns := s.resumes.AcquireAllIdle(context.Background())
	defer func() {
		for _, conn := range conns {
			conn.Release()
		}
	}()
	ran := 0
	for _, conn := range conns {
		got := prepared(t, conn)
		for i, sql := range live.ResumeStatements() {
			if _, ok := got[sql]; !ok {
				t.Errorf("resume statement %d is not prepared on a connection of the pool", i)
			}
		}
		p := got[live.ResumeStatements()[0]]
		ran += p.generic + p.custom
	}
	if ran < 6 {
		t.Errorf("the resumes ran their prepared statement %d times; want 6", ran)
	}
	fresh := 0 // the first socket, without a cursor, read where the stream stood
	for _, conn := range conns {
		p := prepared(t, conn)[live.ResumeStatements()[1]]
		fresh += p.generic + p.custom
	}
	if fresh < 1 {
		t.Error("a fresh socket's resume did not run its prepared statement")
	}
}

func TestPartitionsCreatedAndDroppedUnderThePreparedReadsBreakNothing(t *testing.T) {
	t.Parallel()
	url := pgtest.DB(t)
	s := newCentralStack(t, url, url)
	ctx := context.Background()
	ddl := func(sql string) {
		t.Helper()
		if _, err := s.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	c := s.dial("u1", "")
	_, start := s.ready(c)
	s.stream(c, "before", 2)

	// A week long past, created as a backfill would; the week furthest
	// ahead, detached and dropped as retention drops one; then the first.
	ddl(`CREATE TABLE notifications_20010101 PARTITION OF notifications FOR VALUES FROM ('2001-01-01') TO ('2001-01-08')`)
	s.stream(c, "created", 2)
	var newest string
	if err := s.pool.QueryRow(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'notifications'::regclass ORDER BY c.relname DESC LIMIT 1`).Scan(&newest); err != nil {
		t.Fatal(err)
	}
	ddl(`ALTER TABLE notifications DETACH PARTITION ` + newest)
	ddl(`DROP TABLE ` + newest)
	s.stream(c, "detached", 2)
	ddl(`DROP TABLE notifications_20010101`)
	s.stream(c, "dropped", 2)
	s.resume(start, 8)

	// Read-state changes too, through the reader's other prepared reads.
	store := feed.NewStore(s.pool, nil)
	through, _, err := store.MarkAllRead(ctx, "u1")
	if err != nil {
		t.Fatal(err)
	}
	if err := ingest.WakeUp(ctx, s.pool); err != nil {
		t.Fatal(err)
	}
	if m := next(t, c, "read", 1)[0]; m.Through != through.String() {
		t.Errorf("read-all frame %s, want through %s", m.Raw, through)
	}
	if n := testutil.ToFloat64(live.ReadErrors(s.metrics)); n != 0 {
		t.Errorf("%v reads failed; want none: Postgres re-plans a prepared statement after DDL on its tables", n)
	}
	if p := prepared(t, s.reader)[live.ReaderStatements()[0]]; p.generic == 0 || p.custom != 0 {
		t.Errorf("the notifications read made %d generic and %d custom plans; want it still prepared, with generic plans", p.generic, p.custom)
	}
}

// TestTheStreamAndResumesWorkThroughPgBouncerInTransactionMode runs the
// hub as central does with both its pools through the installed PgBouncer
// (1.18, transaction mode, server connections used in turn), where a named
// statement is lost when a client's next transaction runs on another
// server connection: nothing is prepared, and nothing fails.
func TestTheStreamAndResumesWorkThroughPgBouncerInTransactionMode(t *testing.T) {
	t.Parallel()
	url := pgtest.DB(t)
	bounced := pgtest.PgBouncer(t, url)
	s := newCentralStack(t, url, bounced)
	pgtest.HoldOpen(t, bounced, `SELECT 1`) // one server connection taken: the others take turns
	c := s.dial("u1", "")
	_, start := s.ready(c)
	s.stream(c, "bounced", 10)
	for range 6 {
		s.resume(start, 10)
	}
	fresh := s.dial("u1", "")
	if resumed, cursor := s.ready(fresh); len(resumed) != 0 || cursor == "" {
		t.Errorf("a fresh socket got %d frames before ready, cursor %q", len(resumed), cursor)
	}
	if n := testutil.ToFloat64(live.ReadErrors(s.metrics)); n != 0 {
		t.Errorf("%v reads failed through PgBouncer; want none", n)
	}
}
