package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/internal/clock"
)

// NotifyChannel is the Postgres channel ingest wakes live listeners on. A
// wake-up carries no payload: it is a hint to read committed rows, never the
// data itself.
const NotifyChannel = "spoolcast_notifications"

// DefaultWakeUpInterval is the least time between two wake-ups one Waker
// sends. A commit within it of the last wake-up waits for the trailing one,
// half of it on average: it is the one fixed wait between a producer's POST
// and the user's screen (benchmarks/README.md §16: at 200 events/s, commit
// → frame p50 20 ms at 20 ms, 13–17 ms at 5 ms in alternating runs). It
// bounds one ingress point's wake-ups to 200 a second, each a tiny
// asynchronous transaction.
const DefaultWakeUpInterval = 5 * time.Millisecond

// WakeUp sends one wake-up to the listeners, in a transaction of its own that
// commits asynchronously. A transaction that notifies holds a database-wide
// lock from its commit until the commit returns; with a synchronous commit
// that includes the WAL flush, so notifying transactions commit one at a
// time (measured: 2.1k one-row commits/s with a NOTIFY in the transaction
// against 7.8k without, 16 writers). The wake-up needs no durability: a lost
// one only delays a reader until its fallback interval. It keeps no session
// state, so it works through PgBouncer in transaction mode.
func WakeUp(ctx context.Context, db DB) error {
	var one int
	err := db.QueryRow(ctx, `SELECT 1 FROM (SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, '')) n`,
		pgx.QueryExecModeCacheDescribe, NotifyChannel).Scan(&one)
	if err != nil {
		return fmt.Errorf("wake up listeners: %w", err)
	}
	return nil
}

// Waker sends the wake-ups for one ingress point's commits: at once after a
// commit that inserted notifications, unless one went out less than the
// interval ago; then one trailing wake-up at the end of the interval covers
// every commit in between. So a listener hears of a commit within the
// interval, never before the commit, and one ingress point sends at most one
// wake-up per interval, however many transactions it commits.
type Waker struct {
	interval time.Duration
	db       DB
	clock    clock.Clock
	log      *slog.Logger
	sends    sync.WaitGroup

	mu      sync.Mutex
	last    time.Time // when the last wake-up went out
	owed    bool      // a commit has not been covered by a wake-up yet
	sending bool
	trailer clock.Timer
	stopped bool
}

// NewWaker returns a Waker sending over db at most once per interval (0:
// DefaultWakeUpInterval). A nil clock is the wall clock; a nil logger, slog.Default().
func NewWaker(db DB, interval time.Duration, clk clock.Clock, log *slog.Logger) *Waker {
	if interval <= 0 {
		interval = DefaultWakeUpInterval
	}
	if clk == nil {
		clk = clock.Real{}
	}
	if log == nil {
		log = slog.Default()
	}
	return &Waker{interval: interval, db: db, clock: clk, log: log}
}

// Committed records a commit that inserted notifications.
func (w *Waker) Committed() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.owed = true
	w.kick()
}

// kick sends what is owed now, or schedules it for the end of the interval.
// The caller holds mu.
func (w *Waker) kick() {
	if !w.owed || w.sending || w.trailer != nil || w.stopped {
		return
	}
	if wait := w.last.Add(w.interval).Sub(w.clock.Now()); wait > 0 {
		w.trailer = w.clock.AfterFunc(wait, func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.trailer = nil
			w.kick()
		})
		return
	}
	w.last, w.owed, w.sending = w.clock.Now(), false, true
	w.sends.Add(1)
	go func() {
		defer w.sends.Done()
		w.send()
		w.mu.Lock()
		defer w.mu.Unlock()
		w.sending = false
		w.kick()
	}()
}

// Stop cancels the trailing wake-up, sends what is owed at once and waits for
// sends in flight. Commits after Stop send nothing.
func (w *Waker) Stop() {
	w.mu.Lock()
	w.stopped = true
	if w.trailer != nil {
		w.trailer.Stop()
		w.trailer = nil
	}
	owed := w.owed
	w.owed = false
	w.mu.Unlock()
	w.sends.Wait()
	if owed {
		w.send()
	}
}

func (w *Waker) send() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := WakeUp(ctx, w.db); err != nil {
		// Only a hint: listeners read committed rows on their own schedule too.
		w.log.Debug("wake-up", "err", err)
	}
}
