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

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/spool"
)

// Spool is what the forwarder needs of the relay's spool.
type Spool interface {
	NextBatch(ctx context.Context, limit int) ([]spool.Record, error)
	MarkForwarded(ctx context.Context, seqs []int64) error
	MarkFailed(ctx context.Context, seqs []int64) error
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
	// MinBackoff is the first wait after an error. Default 100ms.
	MinBackoff time.Duration
	// MaxBackoff caps the wait between retries. Default 5s.
	MaxBackoff time.Duration
	// PollInterval is how often the spool is checked without a wake-up. Default 1s.
	PollInterval time.Duration
	// IngestTimeout bounds one ingest transaction. Default 30s.
	IngestTimeout time.Duration
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
	case c.BatchSize < 0:
		return fmt.Errorf("forwarder: batch size %d must not be negative", c.BatchSize)
	case c.MaxBackoff < 0 || c.MinBackoff < 0:
		return errors.New("forwarder: backoff must not be negative")
	}
	return nil
}

// Forwarder moves spooled events into Postgres: at least once from the spool's
// side, exactly once in effect thanks to Ingest's claim.
type Forwarder struct {
	cfg    ForwarderConfig
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}
	once   gosync.Once
}

// NewForwarder returns a forwarder; Start runs it.
func NewForwarder(cfg ForwarderConfig) (*Forwarder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 500)
	cfg.MinBackoff = cmp.Or(cfg.MinBackoff, 100*time.Millisecond)
	cfg.MaxBackoff = max(cmp.Or(cfg.MaxBackoff, 5*time.Second), cfg.MinBackoff)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, time.Second)
	cfg.IngestTimeout = cmp.Or(cfg.IngestTimeout, 30*time.Second)
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Forwarder{cfg: cfg, log: cfg.Logger.With("component", "forwarder"), done: make(chan struct{})}, nil
}

// Start runs the forwarding loop in the background and returns at once.
func (f *Forwarder) Start(ctx context.Context) {
	ctx, f.cancel = context.WithCancel(ctx)
	go f.run(ctx)
}

// Stop stops the loop, then forwards what is still pending until ctx ends.
// Safe to call twice.
func (f *Forwarder) Stop(ctx context.Context) error {
	var err error
	f.once.Do(func() {
		if f.cancel == nil {
			return
		}
		f.cancel()
		<-f.done
		for ctx.Err() == nil {
			n, ferr := f.forwardOnce(ctx)
			if ferr != nil {
				err = fmt.Errorf("final flush: %w", ferr)
				break
			}
			if n < f.cfg.BatchSize {
				break
			}
		}
	})
	return err
}

func (f *Forwarder) run(ctx context.Context) {
	defer close(f.done)
	poll := time.NewTicker(f.cfg.PollInterval)
	defer poll.Stop()
	var failures int
	limiter := newLogLimiter(10 * time.Second)
	for {
		n, err := f.forwardOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures++
			f.cfg.Metrics.errors.Inc()
			wait := backoff(failures, f.cfg.MinBackoff, f.cfg.MaxBackoff)
			if suppressed, ok := limiter.allow(f.cfg.Now()); ok {
				f.log.Warn("forwarding failed; events stay in the spool and will be retried",
					"err", err, "attempt", failures, "retry_in", wait.Round(time.Millisecond), "suppressed", suppressed)
			}
			if !sleep(ctx, wait) {
				return
			}
			continue
		case failures > 0:
			f.log.Info("forwarding recovered", "after_failures", failures)
			failures = 0
		}
		if n == f.cfg.BatchSize {
			continue // more is waiting
		}
		select {
		case <-ctx.Done():
			return
		case <-f.cfg.Spool.Wake():
		case <-poll.C:
		}
	}
}

// forwardOnce sends the next pending batch and acknowledges it. It returns how
// many rows the batch held.
func (f *Forwarder) forwardOnce(ctx context.Context) (int, error) {
	batch, err := f.cfg.Spool.NextBatch(ctx, f.cfg.BatchSize)
	if err != nil || len(batch) == 0 {
		return 0, err
	}
	start := time.Now()
	items := make([]Item, 0, len(batch))
	seqs := make([]int64, 0, len(batch))
	for _, rec := range batch {
		ev, err := event.Parse(rec.Payload)
		if err != nil {
			// The relay wrote this payload canonically; an unreadable one is a
			// damaged spool, not a reason to drop it.
			return 0, fmt.Errorf("spool row %d (key %q): %w", rec.Seq, rec.Key, err)
		}
		items = append(items, Item{Producer: rec.Producer, Event: ev, Hash: event.HashCanonical(rec.Payload), ReceivedAt: rec.ReceivedAt})
		seqs = append(seqs, rec.Seq)
	}
	ictx, cancel := context.WithTimeout(ctx, f.cfg.IngestTimeout)
	results, err := Ingest(ictx, f.cfg.DB, items)
	cancel()
	if err != nil {
		if markErr := f.cfg.Spool.MarkFailed(context.WithoutCancel(ctx), seqs); markErr != nil {
			f.log.Debug("count failed attempt", "err", markErr)
		}
		return 0, err
	}
	committed := f.cfg.Now()
	if f.cfg.AfterIngest != nil {
		f.cfg.AfterIngest()
	}
	f.cfg.Metrics.observeBatch(batch, results, committed, time.Since(start))
	for i, r := range results {
		if r.Outcome == Conflict {
			f.log.Warn("event key reused with a different request; Postgres kept the first", "producer", batch[i].Producer, "key", batch[i].Key)
		}
	}
	// The batch is in Postgres; a failed ack only means it is sent again, harmlessly.
	if err := f.cfg.Spool.MarkForwarded(context.WithoutCancel(ctx), seqs); err != nil {
		return len(batch), fmt.Errorf("acknowledge forwarded batch: %w", err)
	}
	return len(batch), nil
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
	every      time.Duration
	last       time.Time
	suppressed int
}

func newLogLimiter(every time.Duration) *logLimiter { return &logLimiter{every: every} }

func (l *logLimiter) allow(now time.Time) (suppressed int, ok bool) {
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.suppressed++
		return 0, false
	}
	suppressed, l.suppressed, l.last = l.suppressed, 0, now
	return suppressed, true
}
