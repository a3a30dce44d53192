package sync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/spool"
)

// Spool is what the forwarder needs of the relay's spool.
type Spool interface {
	NextBatch(ctx context.Context, afterSeq int64, limit int) ([]spool.Record, error)
	MarkForwarded(ctx context.Context, seqs []int64) error
	MarkFailed(ctx context.Context, seqs []int64) error
	MarkDead(ctx context.Context, seq int64, reason string) error
	Wake() <-chan struct{}
}

var _ Spool = (*spool.Spool)(nil)

// ForwarderConfig configures a forwarder.
type ForwarderConfig struct {
	// Spool is read from and acknowledged. Required.
	Spool Spool
	// DB is Postgres. Required.
	DB DB
	// BatchSize is the most rows sent in one ingest transaction. Default 500.
	BatchSize int
	// Workers is how many batches are in flight at once, each on its own
	// Postgres connection. Default 2.
	Workers int
	// MinBackoff is the first wait after an error. Default 100ms.
	MinBackoff time.Duration
	// MaxBackoff caps the wait between retries. Default 5s.
	MaxBackoff time.Duration
	// PollInterval is how often the spool is checked without a wake-up. Default 1s.
	PollInterval time.Duration
	// IngestTimeout bounds one ingest transaction. Default 30s.
	IngestTimeout time.Duration
	// WakeUpInterval is the least time between the NOTIFY wake-ups the
	// forwarder's transactions send; batches in between are covered by a
	// trailing wake-up. Notifying commits serialize in Postgres, so this bounds
	// that cost under load. Default 100ms; negative notifies on every batch.
	WakeUpInterval time.Duration
	// Metrics receives the forwarder's metrics. Default: not exported.
	Metrics *Metrics
	// Logger receives the forwarder's logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// AfterIngest, when set, runs after a batch is committed in Postgres and
	// before it is acknowledged in the spool: where a crash re-sends the batch.
	AfterIngest func()
}

// Validate reports the first setting a user must fix.
func (c ForwarderConfig) Validate() error {
	switch {
	case c.Spool == nil:
		return errors.New("forwarder: spool is required")
	case c.DB == nil:
		return errors.New("forwarder: database is required")
	case c.BatchSize < 0 || c.Workers < 0:
		return errors.New("forwarder: batch size and workers must not be negative")
	case c.MaxBackoff < 0 || c.MinBackoff < 0:
		return errors.New("forwarder: backoff must not be negative")
	}
	return nil
}

// Forwarder moves spooled events into Postgres: at least once from the spool's
// side, exactly once in effect thanks to Ingest's claim. Its workers take
// consecutive batches from a shared cursor, so several batches are in flight
// at once; a worker retries its own batch until every row has landed (or been
// set aside as dead), so nothing behind the cursor is left behind. When no
// batch is in flight, workers read from the top again, which also picks up
// rows whose acknowledgement failed or that an operator requeued.
type Forwarder struct {
	cfg      ForwarderConfig
	log      *slog.Logger
	cancel   context.CancelFunc // stops taking batches, waiting and backing off
	ioCtx    context.Context    // Postgres and spool I/O of batches in flight
	ioCancel context.CancelFunc // aborts that I/O once Stop's deadline passes
	workers  gosync.WaitGroup
	acks     gosync.WaitGroup
	kick     chan struct{}
	limiter  *logLimiter
	wake     *wakeHint
	once     gosync.Once
	landed   atomic.Int64 // unix nanoseconds when a batch last landed in Postgres

	mu       gosync.Mutex
	cursor   int64               // highest seq handed to a worker
	inflight int                 // batches handed out and not yet acknowledged
	refused  map[int64]time.Time // rows refused for good, not yet set aside: when first refused
}

// errRefusedEverything: Postgres refused every row it was given and nothing
// shows the rows are at fault; the batch is given back and tried again later.
var errRefusedEverything = errors.New("Postgres refuses every row of the batch")

// NewForwarder returns a forwarder; Start runs it.
func NewForwarder(cfg ForwarderConfig) (*Forwarder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 500)
	cfg.Workers = cmp.Or(cfg.Workers, 2)
	cfg.MinBackoff = cmp.Or(cfg.MinBackoff, 100*time.Millisecond)
	cfg.MaxBackoff = max(cmp.Or(cfg.MaxBackoff, 5*time.Second), cfg.MinBackoff)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, time.Second)
	cfg.IngestTimeout = cmp.Or(cfg.IngestTimeout, 30*time.Second)
	cfg.WakeUpInterval = cmp.Or(cfg.WakeUpInterval, 100*time.Millisecond)
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger.With("component", "forwarder")
	return &Forwarder{
		cfg:     cfg,
		log:     log,
		kick:    make(chan struct{}, cfg.Workers),
		limiter: newLogLimiter(10 * time.Second),
		wake:    newWakeHint(cfg.DB, cfg.WakeUpInterval, log),
		refused: map[int64]time.Time{},
	}, nil
}

// Start runs the forwarding workers in the background and returns at once.
func (f *Forwarder) Start(ctx context.Context) {
	f.ioCtx, f.ioCancel = context.WithCancel(context.WithoutCancel(ctx))
	ctx, f.cancel = context.WithCancel(ctx)
	for range f.cfg.Workers {
		f.workers.Go(func() { f.work(ctx) })
	}
}

// Stop stops taking new batches and lets the batches in flight finish, then
// forwards what is still pending, all until ctx ends. Safe to call twice.
func (f *Forwarder) Stop(ctx context.Context) error {
	var err error
	f.once.Do(func() {
		if f.cancel == nil {
			return
		}
		f.cancel()
		stopIO := context.AfterFunc(ctx, f.ioCancel)
		defer stopIO()
		defer f.ioCancel()
		defer f.wake.stop()
		if !waitFor(ctx, &f.workers) || !waitFor(ctx, &f.acks) {
			err = fmt.Errorf("final flush: %w", ctx.Err())
			return
		}
		// Batches the workers gave up on are still pending: start from the top.
		var after int64
		for ctx.Err() == nil {
			batch, ferr := f.cfg.Spool.NextBatch(ctx, after, f.cfg.BatchSize)
			if ferr == nil && len(batch) > 0 {
				_, ferr = f.forward(ctx, batch, &f.acks)
				after = batch[len(batch)-1].Seq
			}
			if ferr != nil {
				err = fmt.Errorf("final flush: %w", ferr)
				break
			}
			if len(batch) < f.cfg.BatchSize {
				break
			}
		}
		if !waitFor(ctx, &f.acks) && err == nil {
			err = fmt.Errorf("final flush: acknowledgements: %w", ctx.Err())
		}
	})
	return err
}

// waitFor waits for wg until ctx ends; false when ctx ended first.
func waitFor(ctx context.Context, wg *gosync.WaitGroup) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// take hands the next batch to a worker: after the shared cursor, or from the
// top when no batch is in flight.
func (f *Forwarder) take(ctx context.Context) ([]spool.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	after := f.cursor
	if f.inflight == 0 {
		after = 0
	}
	batch, err := f.cfg.Spool.NextBatch(ctx, after, f.cfg.BatchSize)
	if err != nil || len(batch) == 0 {
		return nil, err
	}
	f.cursor = batch[len(batch)-1].Seq
	f.inflight++
	if len(batch) == f.cfg.BatchSize {
		// More is waiting: wake an idle worker to take it.
		select {
		case f.kick <- struct{}{}:
		default:
		}
	}
	return batch, nil
}

// release ends a batch's time in flight, once its acknowledgements are in.
func (f *Forwarder) release(acks *gosync.WaitGroup) {
	f.acks.Go(func() {
		acks.Wait()
		f.mu.Lock()
		f.inflight--
		f.mu.Unlock()
	})
}

func (f *Forwarder) work(ctx context.Context) {
	poll := time.NewTicker(f.cfg.PollInterval)
	defer poll.Stop()
	for {
		batch, err := f.take(ctx)
		if err != nil {
			if !f.failed(ctx, err, 1) {
				return
			}
			continue
		}
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-f.cfg.Spool.Wake():
			case <-f.kick:
			case <-poll.C:
			}
			continue
		}
		// This worker owns the batch until every row has landed: retry with
		// backoff, leaving out the rows already handled.
		var acks gosync.WaitGroup
		for failures := 1; ; failures++ {
			handled, err := f.forward(f.ioCtx, batch, &acks)
			batch = without(batch, handled)
			if err == nil && len(batch) == 0 {
				if failures > 1 {
					f.log.Info("forwarding recovered", "after_failures", failures-1)
				}
				break
			}
			if err == nil {
				err = errors.New("rows left unsent")
			}
			if !f.failed(ctx, err, failures) {
				break // stopping: what is left stays pending for the final flush
			}
			if errors.Is(err, errRefusedEverything) {
				break // give it back: it is read again, with what came after it, once no batch is in flight
			}
		}
		f.release(&acks)
		if ctx.Err() != nil {
			return
		}
	}
}

func without(batch []spool.Record, handled map[int64]bool) []spool.Record {
	if len(handled) == 0 {
		return batch
	}
	rest := batch[:0:0]
	for _, rec := range batch {
		if !handled[rec.Seq] {
			rest = append(rest, rec)
		}
	}
	return rest
}

// failed counts and logs a failure and waits out its backoff; false when the
// forwarder is stopping.
func (f *Forwarder) failed(ctx context.Context, err error, failures int) bool {
	if ctx.Err() != nil {
		return false
	}
	f.cfg.Metrics.errors.Inc()
	wait := backoff(failures, f.cfg.MinBackoff, f.cfg.MaxBackoff)
	if suppressed, ok := f.limiter.allow(f.cfg.Now()); ok {
		f.log.Warn("forwarding failed; events stay in the spool and will be retried",
			"err", err, "attempt", failures, "retry_in", wait.Round(time.Millisecond), "suppressed", suppressed)
	}
	return sleep(ctx, wait)
}

// refusal is a row Postgres refused on its own.
type refusal struct {
	rec spool.Record
	err error
}

// forward writes a batch to Postgres and acknowledges what landed. It returns
// the seqs it handled: landed, or set aside as dead. A row Postgres refuses for
// good is found by halving the batch; it is set aside only when there is
// evidence that the row, not Postgres, is at fault: other rows of the batch
// landed, or other rows landed since the row was first refused. A refusal of
// everything (a schema change, say) is an error to retry, never a reason to
// bury every row.
func (f *Forwarder) forward(ctx context.Context, batch []spool.Record, acks *gosync.WaitGroup) (map[int64]bool, error) {
	handled := map[int64]bool{}
	sendable := make([]spool.Record, 0, len(batch))
	items := make([]Item, 0, len(batch))
	for _, rec := range batch {
		ev, err := event.Parse(rec.Payload)
		if err != nil {
			// The relay wrote this payload canonically; an unreadable one is a
			// damaged row, whatever Postgres would say.
			if err := f.bury(ctx, rec, err); err != nil {
				return handled, err
			}
			handled[rec.Seq] = true
			continue
		}
		sendable = append(sendable, rec)
		items = append(items, Item{Producer: rec.Producer, Event: ev, Hash: rec.Hash, ReceivedAt: rec.ReceivedAt})
	}
	landed, refused, err := f.send(ctx, sendable, items, acks)
	for _, seq := range landed {
		handled[seq] = true
	}
	if len(refused) == 0 || err != nil {
		return handled, err
	}
	var firstErr error
	for _, r := range refused {
		if !f.atFault(r.rec.Seq, len(landed) > 0) {
			firstErr = cmp.Or(firstErr, r.err)
			continue
		}
		if err := f.bury(ctx, r.rec, r.err); err != nil {
			return handled, err
		}
		handled[r.rec.Seq] = true
	}
	if firstErr != nil {
		return handled, fmt.Errorf("%w: %w", errRefusedEverything, firstErr)
	}
	return handled, nil
}

// forgetRefusals drops what was remembered of rows that have now landed.
func (f *Forwarder) forgetRefusals(seqs []int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.refused) == 0 {
		return
	}
	for _, seq := range seqs {
		delete(f.refused, seq)
	}
}

// atFault decides whether a refused row is to blame: rows beside it landed, or
// rows landed since it was first refused. Otherwise it remembers the refusal.
func (f *Forwarder) atFault(seq int64, othersLanded bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	first, seen := f.refused[seq]
	if othersLanded || (seen && f.landed.Load() > first.UnixNano()) {
		delete(f.refused, seq)
		return true
	}
	if !seen {
		f.refused[seq] = f.cfg.Now()
	}
	return false
}

// send writes rows in one ingest transaction, halving on a refusal for good to
// find the rows at fault. It returns the seqs that landed and the rows refused
// on their own; err is a failure worth retrying as it is.
func (f *Forwarder) send(ctx context.Context, rows []spool.Record, items []Item, acks *gosync.WaitGroup) (landed []int64, refused []refusal, err error) {
	if len(rows) == 0 {
		return nil, nil, nil
	}
	start := time.Now()
	seqs := make([]int64, len(rows))
	for i, rec := range rows {
		seqs[i] = rec.Seq
	}
	notify := f.wake.decide(time.Now())
	ingestFn := IngestWithoutWakeUp
	if notify {
		ingestFn = Ingest
	}
	ictx, cancel := context.WithTimeout(ctx, f.cfg.IngestTimeout)
	results, err := ingestFn(ictx, f.cfg.DB, items)
	cancel()
	f.wake.committed(notify, err == nil)
	if err != nil {
		if !refusedForGood(err) {
			if markErr := f.cfg.Spool.MarkFailed(ctx, seqs); markErr != nil {
				f.log.Debug("count failed attempt", "err", markErr)
			}
			return nil, nil, err
		}
		if len(rows) == 1 {
			return nil, []refusal{{rows[0], err}}, nil
		}
		mid := len(rows) / 2
		l1, r1, err := f.send(ctx, rows[:mid], items[:mid], acks)
		if err != nil {
			return l1, r1, err
		}
		l2, r2, err := f.send(ctx, rows[mid:], items[mid:], acks)
		return append(l1, l2...), append(r1, r2...), err
	}
	committed := f.cfg.Now()
	f.landed.Store(committed.UnixNano())
	f.forgetRefusals(seqs)
	if f.cfg.AfterIngest != nil {
		f.cfg.AfterIngest()
	}
	f.cfg.Metrics.observeBatch(rows, results, committed, time.Since(start))
	for i, r := range results {
		if r.Outcome == Conflict {
			f.log.Warn("event key reused with a different request; Postgres kept the first", "producer", rows[i].Producer, "key", rows[i].Key)
		}
	}
	// The rows are in Postgres. The worker moves on while the spool commits the
	// acknowledgement; if that fails, the rows are read again once no batch is
	// in flight, and re-sent harmlessly.
	acks.Go(func() {
		if err := f.cfg.Spool.MarkForwarded(context.WithoutCancel(ctx), seqs); err != nil {
			f.log.Warn("acknowledge forwarded batch; it will be sent again", "err", err)
		}
	})
	return seqs, nil, nil
}

// bury sets aside a row that can never be forwarded. It stays in the spool
// with the reason, for an operator (`spoolcast spool requeue --dead` puts it
// back); losing it silently would be worse.
func (f *Forwarder) bury(ctx context.Context, rec spool.Record, cause error) error {
	if err := f.cfg.Spool.MarkDead(ctx, rec.Seq, cause.Error()); err != nil {
		return fmt.Errorf("set aside dead row %d: %w", rec.Seq, err)
	}
	f.cfg.Metrics.dead.Inc()
	f.log.Error("Postgres refuses this event for good; it is kept in the spool as dead (spoolcast spool ls --dead)",
		"producer", rec.Producer, "key", rec.Key, "seq", rec.Seq, "err", cause)
	return nil
}

// refusedForGood reports whether Postgres refused a batch for its content —
// bad data, a broken constraint, a limit — so that sending it again as it is
// would fail again. Anything else (a connection, a timeout, a missing table)
// may pass later.
func refusedForGood(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "54": // data exception, program limit exceeded
		return true
	case "23": // integrity constraint violation, but for a race on a unique key
		return pgErr.Code != "23505"
	}
	return false
}

// backoff is exponential from min, capped at max, with full jitter on its upper half.
func backoff(failures int, minWait, maxWait time.Duration) time.Duration {
	d := minWait << min(failures-1, 30)
	if d <= 0 || d > maxWait {
		d = maxWait
	}
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// logLimiter lets one log line through per interval and counts the rest.
type logLimiter struct {
	mu         gosync.Mutex
	every      time.Duration
	last       time.Time
	suppressed int
}

func newLogLimiter(every time.Duration) *logLimiter { return &logLimiter{every: every} }

func (l *logLimiter) allow(now time.Time) (suppressed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.suppressed++
		return 0, false
	}
	suppressed, l.suppressed, l.last = l.suppressed, 0, now
	return suppressed, true
}
