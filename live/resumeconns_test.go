package live_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/internal/wsclient"
	"github.com/spoolcast/spoolcast/live"
)

// inFlightDB counts the statements running on a pool at once (a query
// until its rows are closed, a row until it is scanned), each held a
// little longer than Postgres takes, as on a busy database.
type inFlightDB struct {
	pool     *pgxpool.Pool
	now, max atomic.Int64
}

func (d *inFlightDB) begin() {
	n := d.now.Add(1)
	for m := d.max.Load(); n > m && !d.max.CompareAndSwap(m, n); m = d.max.Load() {
	}
	time.Sleep(20 * time.Millisecond)
}

func (d *inFlightDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	d.begin()
	rows, err := d.pool.Query(ctx, sql, args...)
	if err != nil {
		d.now.Add(-1)
		return nil, err
	}
	return &countedRows{Rows: rows, done: func() { d.now.Add(-1) }}, nil
}

func (d *inFlightDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	d.begin()
	return countedRow{row: d.pool.QueryRow(ctx, sql, args...), done: func() { d.now.Add(-1) }}
}

type countedRows struct {
	pgx.Rows
	once sync.Once
	done func()
}

func (r *countedRows) Close() { r.Rows.Close(); r.once.Do(r.done) }

type countedRow struct {
	row  pgx.Row
	done func()
}

func (r countedRow) Scan(dest ...any) error { defer r.done(); return r.row.Scan(dest...) }

// A wave of reconnections (apps resuming with their cursors, and fresh
// ones) holds no more of the pool than ResumeConns at once, and every app
// still resumes whole: the rest of the pool stays with what shares it.
func TestAReconnectWaveHoldsNoMoreThanItsShareOfThePool(t *testing.T) {
	t.Parallel()
	db := &inFlightDB{}
	s := newStack(t, nil)
	db.pool = s.pool
	// The hub reads through db from here on: a second hub on the same
	// database, as a replica the apps move to.
	moved := serve(t, s.url, s.pool, func(c *live.Config) { c.DB, c.ReaderDB, c.ResumeConns = db, s.pool, 2 })
	const apps = 24
	cursors := make([]string, apps)
	for i := range apps {
		c := s.dial(fmt.Sprintf("u%d", i), "")
		_, cursors[i] = s.ready(c)
		c.Close()
		if i%2 == 1 {
			// Half in the form without a history (version 1), which the
			// handshake checks against Postgres: that check takes a turn too.
			cur, err := live.ParseCursor(cursors[i])
			if err != nil {
				t.Fatal(err)
			}
			cursors[i] = live.Cursor{Position: cur.Position, At: cur.At}.String()
		}
	}
	for i := range apps {
		s.ingest(s.pool, items(t, fmt.Sprintf("missed-u%d", i), fmt.Sprintf("u%d", i), 2))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*apps)
	for i := range apps {
		for _, after := range []string{cursors[i], ""} {
			wg.Go(func() {
				c, err := wsclient.Dial(context.Background(), moved.base, fmt.Sprintf("u%d", i), after)
				if err != nil {
					errs <- err
					return
				}
				defer c.Close()
				// The two missed come before ready (the resume) or after
				// it (live, when this replica's reader had not read them
				// yet); a fresh socket gets none.
				want := map[bool]int{true: 2, false: 0}[after != ""]
				got, ready := 0, false
				for !ready || got < want {
					m, err := c.Next(30 * time.Second)
					if err != nil {
						errs <- fmt.Errorf("u%d after %q: %d notifications, ready %v: %w", i, after, got, ready, err)
						return
					}
					switch m.Type {
					case "notification":
						got++
					case "ready":
						ready = true
					}
				}
				if got != want {
					errs <- fmt.Errorf("u%d after %q: %d notifications; want %d", i, after, got, want)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := db.max.Load(); n > 2 {
		t.Errorf("%d statements of the wave at once on the pool; want at most ResumeConns, 2", n)
	}
	if db.max.Load() == 0 {
		t.Error("no statement went through the counted pool: the test measures nothing")
	}
}
