package sync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	gosync "sync"
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
	// that cost under load. Default 25ms; negative notifies on every batch.
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
// at once; a worker retries its own batch until it lands, so nothing behind the
// cursor is left pending while the forwarder runs.
type Forwarder struct {
	cfg     ForwarderConfig
	log     *slog.Logger
	cancel  context.CancelFunc
	workers gosync.WaitGroup
	kick    chan struct{}
	acks    gosync.WaitGroup
	limiter *logLimiter
	wake    *wakeHint
	once    gosync.Once

	mu     gosync.Mutex
	cursor int64 // highest seq handed to a worker
}

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
	}, nil
}

// Start runs the forwarding workers in the background and returns at once.
func (f *Forwarder) Start(ctx context.Context) {
	ctx, f.cancel = context.WithCancel(ctx)
	for range f.cfg.Workers {
		f.workers.Go(func() { f.work(ctx) })
	}
}

// Stop stops the workers, then forwards what is still pending until ctx ends.
// Safe to call twice.
func (f *Forwarder) Stop(ctx context.Context) error {
	var err error
	f.once.Do(func() {
		if f.cancel == nil {
			return
		}
		f.cancel()
		f.workers.Wait()
		f.acks.Wait()
		defer f.acks.Wait() // the final flush's acknowledgements
		defer f.wake.stop(ctx)
		// Batches the workers gave up on are still pending: start from the top.
		var after int64
		for ctx.Err() == nil {
			batch, ferr := f.cfg.Spool.NextBatch(ctx, after, f.cfg.BatchSize)
			if ferr == nil && len(batch) > 0 {
				ferr = f.forward(ctx, batch)
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
	})
	return err
}

// take hands the next batch after the shared cursor to a worker.
func (f *Forwarder) take(ctx context.Context) ([]spool.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	batch, err := f.cfg.Spool.NextBatch(ctx, f.cursor, f.cfg.BatchSize)
	if err != nil || len(batch) == 0 {
		return nil, err
	}
	f.cursor = batch[len(batch)-1].Seq
	if len(batch) == f.cfg.BatchSize {
		// More is waiting: wake an idle worker to take it.
		select {
		case f.kick <- struct{}{}:
		default:
		}
	}
	return batch, nil
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
		// This worker owns the batch until it lands: retry with backoff.
		for failures := 1; ; failures++ {
			err := f.forward(ctx, batch)
			if err == nil {
				if failures > 1 {
					f.log.Info("forwarding recovered", "after_failures", failures-1)
				}
				break
			}
			if !f.failed(ctx, err, failures) {
				return
			}
		}
	}
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

// forward sends one batch to Postgres and acknowledges it in the spool. A row
// Postgres refuses for good is found by halving the batch and set aside as
// dead, so it never holds up the rows around it.
func (f *Forwarder) forward(ctx context.Context, batch []spool.Record) error {
	start := time.Now()
	items := make([]Item, 0, len(batch))
	sendable := make([]spool.Record, 0, len(batch))
	for _, rec := range batch {
		ev, err := event.Parse(rec.Payload)
		if err != nil {
			if err := f.bury(ctx, rec, err); err != nil {
				return err
			}
			continue
		}
		items = append(items, Item{Producer: rec.Producer, Event: ev, Hash: event.HashCanonical(rec.Payload), ReceivedAt: rec.ReceivedAt})
		sendable = append(sendable, rec)
	}
	if len(sendable) == 0 {
		return nil
	}
	seqs := make([]int64, len(sendable))
	for i, rec := range sendable {
		seqs[i] = rec.Seq
	}
	ictx, cancel := context.WithTimeout(ctx, f.cfg.IngestTimeout)
	ingestFn := IngestWithoutWakeUp
	if f.wake.take(time.Now()) {
		ingestFn = Ingest
	}
	results, err := ingestFn(ictx, f.cfg.DB, items)
	cancel()
	if err != nil {
		if refusedForGood(err) {
			if len(sendable) == 1 {
				return f.bury(ctx, sendable[0], err)
			}
			mid := len(sendable) / 2
			if err := f.forward(ctx, sendable[:mid]); err != nil {
				return err
			}
			return f.forward(ctx, sendable[mid:])
		}
		if markErr := f.cfg.Spool.MarkFailed(context.WithoutCancel(ctx), seqs); markErr != nil {
			f.log.Debug("count failed attempt", "err", markErr)
		}
		return err
	}
	committed := f.cfg.Now()
	if f.cfg.AfterIngest != nil {
		f.cfg.AfterIngest()
	}
	f.cfg.Metrics.observeBatch(sendable, results, committed, time.Since(start))
	for i, r := range results {
		if r.Outcome == Conflict {
			f.log.Warn("event key reused with a different request; Postgres kept the first", "producer", sendable[i].Producer, "key", sendable[i].Key)
		}
	}
	// The batch is in Postgres. The worker moves on while the spool commits the
	// acknowledgement; if that fails, the rows are read again from the top and
	// re-sent, harmlessly.
	f.acks.Go(func() {
		if err := f.cfg.Spool.MarkForwarded(context.WithoutCancel(ctx), seqs); err != nil {
			f.log.Warn("acknowledge forwarded batch; it will be sent again", "err", err)
			f.mu.Lock()
			f.cursor = 0
			f.mu.Unlock()
		}
	})
	return nil
}

// bury sets aside a row that can never be forwarded. It stays in the spool
// with the reason, for an operator; losing it silently would be worse.
func (f *Forwarder) bury(ctx context.Context, rec spool.Record, cause error) error {
	f.cfg.Metrics.dead.Inc()
	f.log.Error("Postgres refuses this event for good; it is kept in the spool as dead (spoolcast spool ls --dead)",
		"producer", rec.Producer, "key", rec.Key, "seq", rec.Seq, "err", cause)
	if err := f.cfg.Spool.MarkDead(context.WithoutCancel(ctx), rec.Seq, cause.Error()); err != nil {
		return fmt.Errorf("set aside dead row %d: %w", rec.Seq, err)
	}
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
