package forward

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/startstop"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/spool"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// Spool is what the forwarder needs of the relay's spool.
type Spool interface {
	NextBatch(ctx context.Context, afterSeq int64, lim spool.BatchLimit) ([]spool.Record, error)
	MarkForwarded(ctx context.Context, seqs []int64) error
	MarkFailed(ctx context.Context, seqs []int64) error
	MarkDead(ctx context.Context, seq int64, reason string) error
	Wake() <-chan struct{}
	// The refeed window: what Postgres's history was, and sending again what
	// was forwarded before it changed.
	History(ctx context.Context) (string, error)
	SetHistory(ctx context.Context, history string) error
	Refeed(ctx context.Context, since time.Time) (int64, error)
}

var _ Spool = (*spool.Spool)(nil)

// Config configures a forwarder.
type Config struct {
	// Spool is read from and acknowledged. Required.
	Spool Spool
	// DB is Postgres. Required.
	DB ingest.DB
	// BatchSize is the most events sent in one ingest transaction. Default 500.
	BatchSize int
	// BatchRecipients is the most recipient rows (notifications) in one
	// ingest transaction; an event with more goes alone. Default 5,000.
	BatchRecipients int
	// BatchBytes is the most payload bytes in one ingest transaction; an
	// event with more goes alone. Default 4 MiB.
	BatchBytes int64
	// Workers is how many batches are in flight at once, each on its own
	// Postgres connection. Default 2.
	Workers int
	// MinBackoff is the first wait after an error. Default 100ms.
	MinBackoff time.Duration
	// MaxBackoff caps the wait between retries. Default 5s.
	MaxBackoff time.Duration
	// PollInterval is how often the spool is checked without a wake-up. Default 1s.
	PollInterval time.Duration
	// IngestTimeout bounds one ingest transaction; a batch that runs past it
	// is sent in halves. Default 30s.
	IngestTimeout time.Duration
	// WakeUpInterval is the least time between the wake-ups the forwarder
	// sends after its commits; commits in between are covered by a trailing
	// wake-up, so it is also the longest a live reader waits for a hint.
	// Default ingest.DefaultWakeUpInterval (5ms).
	WakeUpInterval time.Duration
	// Metrics receives the forwarder's metrics. Default: not exported.
	Metrics *Metrics
	// Logger receives the forwarder's logs. Default slog.Default().
	Logger *slog.Logger
	// Clock times backoffs, polls and wake-ups. Default the wall clock.
	Clock clock.Clock
	// HistoryInterval is the least time between two reads of Postgres's
	// history (system identifier and timeline) after commits: a change means
	// a failover or a restore, and the events forwarded within the spool's
	// refeed window are forwarded again. Default 1s.
	HistoryInterval time.Duration
	// AfterIngest, when set, runs after a batch is committed in Postgres and
	// before it is acknowledged in the spool: where a crash re-sends the batch.
	AfterIngest func()
}

// Validate reports the first setting a user must fix.
func (c Config) Validate() error {
	switch {
	case c.Spool == nil:
		return errors.New("forwarder: spool is required")
	case c.DB == nil:
		return errors.New("forwarder: database is required")
	case c.BatchSize < 0 || c.BatchRecipients < 0 || c.BatchBytes < 0 || c.Workers < 0:
		return errors.New("forwarder: batch limits and workers must not be negative")
	case c.MaxBackoff < 0 || c.MinBackoff < 0:
		return errors.New("forwarder: backoff must not be negative")
	case c.PollInterval < 0 || c.IngestTimeout < 0 || c.WakeUpInterval < 0 || c.HistoryInterval < 0:
		return errors.New("forwarder: poll interval, ingest timeout, wake-up and history intervals must not be negative")
	}
	return nil
}

// Forwarder moves spooled events into Postgres: at least once from the spool's
// side, exactly once in effect thanks to Ingest's claim. Its workers take
// consecutive batches from a shared cursor, so several batches are in flight
// at once. When no batch is in flight, workers read from the top again, which
// also picks up rows whose acknowledgement failed or that an operator
// requeued. A spooled cancellation is applied only after the events spooled
// before it (cancels.go).
//
// The spool leaves oldest first, also after a failure: a notification's
// created_at is when its batch reached Postgres, so a batch that lands after
// a newer one sits above it in the feed. A failed attempt gives its batch
// back and holds every newer batch: until a batch taken from the top lands
// whole, one batch at a time is in flight, the oldest pending, taken no
// sooner than the backoff allows. Only a batch already in flight when
// another failed can land ahead of it.
type Forwarder struct {
	cfg       Config
	log       *slog.Logger
	clock     clock.Clock
	svc       startstop.Service  // the workers; stopping them stops taking batches, waiting and backing off
	ioCtx     context.Context    // Postgres and spool I/O of batches in flight
	ioCancel  context.CancelFunc // aborts that I/O once Stop's deadline passes
	acks      sync.WaitGroup
	kick      chan struct{}
	take1     chan struct{} // one take at a time, so batches never overlap
	failLog   *lograte.Limiter
	wake      *ingest.Waker
	landed    atomic.Int64 // unix nanoseconds when a batch last landed in Postgres
	historyAt atomic.Int64 // unix nanoseconds when Postgres's history was last read
	rewind    atomic.Bool  // a refeed put rows back below the cursor: the next take reads from the top

	mu       sync.Mutex
	cursor   int64               // highest seq handed to a worker
	inflight int                 // batches handed out and not yet acknowledged
	refused  map[int64]time.Time // rows refused for good, not yet set aside: when first refused
	streak   int                 // whole-batch refusals in a row with nothing landing
	// After a failed attempt, until a batch taken from the top lands whole:
	// how many attempts failed, since when, when the next may be taken,
	// and the statement size a statement that ran too long left (0: whole
	// batches).
	failures int
	failedAt time.Time
	retryAt  time.Time
	chunk    int
	// A take held back a cancellation for the batches in flight ahead of
	// it: the release that leaves none in flight kicks a worker.
	cancelWaits bool

	// One line per interval for each outcome of a cancellation worth a warning.
	unknownLog, tooLateLog *lograte.Limiter

	testSignals forwarderTestSignals
}

// forwarderTestSignals tell tests what the forwarder just did.
type forwarderTestSignals struct {
	backoff testsignal.Signal[time.Duration] // a worker began to wait out this backoff
	landed  testsignal.Signal[int]           // a statement committed this many events
	held    testsignal.Signal[int64]         // a take held back the cancellation of this seq
}

// New returns a forwarder; Start runs it.
func New(cfg Config) (*Forwarder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 500)
	cfg.BatchRecipients = cmp.Or(cfg.BatchRecipients, 5000)
	cfg.BatchBytes = cmp.Or(cfg.BatchBytes, 4<<20)
	cfg.Workers = cmp.Or(cfg.Workers, 2)
	cfg.MinBackoff = cmp.Or(cfg.MinBackoff, 100*time.Millisecond)
	cfg.MaxBackoff = max(cmp.Or(cfg.MaxBackoff, 5*time.Second), cfg.MinBackoff)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, time.Second)
	cfg.IngestTimeout = cmp.Or(cfg.IngestTimeout, 30*time.Second)
	cfg.WakeUpInterval = cmp.Or(cfg.WakeUpInterval, ingest.DefaultWakeUpInterval)
	cfg.HistoryInterval = cmp.Or(cfg.HistoryInterval, time.Second)
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Clock = clock.Or(cfg.Clock)
	log := cfg.Logger.With("component", "forwarder")
	ioCtx, ioCancel := context.WithCancel(context.Background())
	return &Forwarder{
		ioCtx:      ioCtx,
		ioCancel:   ioCancel,
		cfg:        cfg,
		log:        log,
		clock:      cfg.Clock,
		kick:       make(chan struct{}, cfg.Workers),
		take1:      make(chan struct{}, 1),
		failLog:    lograte.New(10 * time.Second),
		unknownLog: lograte.New(10 * time.Second),
		tooLateLog: lograte.New(10 * time.Second),
		wake:       ingest.NewWaker(cfg.DB, cfg.WakeUpInterval, cfg.Clock, log),
		refused:    map[int64]time.Time{},
	}, nil
}

// Start runs the forwarding workers in the background and returns at once.
// Only the first call starts them.
func (f *Forwarder) Start(ctx context.Context) {
	workers := make([]func(context.Context), f.cfg.Workers)
	for i := range workers {
		workers[i] = f.work
	}
	f.svc.Start(ctx, workers...)
}

// Stop stops taking new batches and lets the batches in flight finish, then
// forwards what is still pending, all until ctx ends. Safe to call twice: the
// second call returns the first one's answer.
func (f *Forwarder) Stop(ctx context.Context) error {
	stopIO := context.AfterFunc(ctx, f.ioCancel)
	defer stopIO()
	err := f.svc.Stop(ctx, f.flush)
	if err != nil && err == ctx.Err() { // the workers outlasted ctx
		err = fmt.Errorf("final flush: %w", err)
	}
	f.ioCancel()
	f.wake.Stop()
	return err
}

// flush is the last step of Stop, once the workers have returned: it waits
// for their acknowledgements, then forwards what is still pending (batches
// the workers gave up on), from the top.
func (f *Forwarder) flush(ctx context.Context) error {
	if !startstop.Wait(ctx, &f.acks) {
		return fmt.Errorf("final flush: %w", ctx.Err())
	}
	var after int64
	var acks batchAcks
	var err error
	for ctx.Err() == nil {
		var batch []spool.Record
		batch, err = f.cfg.Spool.NextBatch(ctx, after, f.limit())
		if err == nil && len(batch) > 0 {
			chunk := len(batch)
			_, err = f.forward(ctx, batch, &acks, &chunk)
			after = batch[len(batch)-1].Seq
		}
		if err != nil {
			err = fmt.Errorf("final flush: %w", err)
			break
		}
		if len(batch) == 0 {
			break
		}
	}
	if !startstop.Wait(ctx, &acks.wg) && err == nil {
		err = fmt.Errorf("final flush: acknowledgements: %w", ctx.Err())
	}
	return err
}

func (f *Forwarder) limit() spool.BatchLimit {
	return spool.BatchLimit{Rows: f.cfg.BatchSize, Fanout: f.cfg.BatchRecipients, Bytes: f.cfg.BatchBytes}
}

// take hands the next batch to a worker: after the shared cursor, or from the
// top when no batch is in flight. Takes run one at a time so that two batches
// never overlap; waiting for the turn honours ctx. A cancellation goes out
// only in a batch taken alone, from the top (see cancels.go): otherwise the
// batch ends before it, and a batch it would begin waits.
//
// After a failure, take hands out nothing while a batch is in flight or
// before the backoff ends, and then reads from the top: that batch is the
// probe, whose landing ends the failure.
func (f *Forwarder) take(ctx context.Context) (batch []spool.Record, probe bool, err error) {
	select {
	case f.take1 <- struct{}{}:
		defer func() { <-f.take1 }()
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	f.mu.Lock()
	if f.heldBack() {
		f.mu.Unlock()
		return nil, false, nil
	}
	probe = f.failures > 0
	after := f.cursor
	// Only takes add batches in flight, and they run one at a time: alone
	// stays true until this one hands out its batch.
	alone := f.inflight == 0
	if alone || f.rewind.Swap(false) {
		after = 0
	}
	f.mu.Unlock()
	batch, err = f.cfg.Spool.NextBatch(ctx, after, f.limit())
	if err != nil || len(batch) == 0 {
		return nil, false, err
	}
	var held int64
	if i := slices.IndexFunc(batch, isCancel); i >= 0 && !alone {
		held, batch = batch[i].Seq, batch[:i]
	}
	f.mu.Lock()
	if len(batch) == 0 {
		// The batch would begin with a cancellation while others are in
		// flight ahead of it. Once none is, a worker takes from the top.
		if f.inflight == 0 {
			f.kickIdle()
		} else {
			f.cancelWaits = true
		}
		f.mu.Unlock()
		f.testSignals.held.Signal(held)
		return nil, false, nil
	}
	if !probe && f.failures > 0 {
		// A batch in flight failed while this one was read: it goes first.
		f.mu.Unlock()
		return nil, false, nil
	}
	f.cursor = batch[len(batch)-1].Seq
	f.inflight++
	f.mu.Unlock()
	// More may be waiting: wake an idle worker to look.
	f.kickIdle()
	return batch, probe, nil
}

// kickIdle wakes an idle worker, if one is not already being woken.
func (f *Forwarder) kickIdle() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// batchAcks are the spool acknowledgements of one batch, running while its
// worker moves on.
type batchAcks struct {
	wg      sync.WaitGroup
	started atomic.Bool
}

// Go runs an acknowledgement in the background.
func (a *batchAcks) Go(fn func()) {
	a.started.Store(true)
	a.wg.Go(fn)
}

// release ends a batch's time in flight once its acknowledgements are in: at
// once when nothing of it landed (a batch given back is then read again from
// the top on the worker's next take).
func (f *Forwarder) release(acks *batchAcks) {
	done := func() {
		f.mu.Lock()
		f.inflight--
		// A cancellation, or the batch a failure gave back, waits for none
		// to be in flight.
		wake := f.inflight == 0 && (f.cancelWaits || f.failures > 0)
		if wake {
			f.cancelWaits = false
		}
		f.mu.Unlock()
		if wake {
			f.kickIdle()
		}
	}
	if !acks.started.Load() {
		done()
		return
	}
	f.acks.Go(func() {
		acks.wg.Wait()
		done()
	})
}

// work takes batches until ctx ends: at once while there are more, on a
// spool commit, another worker's kick, or the poll interval when idle.
func (f *Forwarder) work(ctx context.Context) {
	schedule := startstop.Schedule{Interval: f.cfg.PollInterval, Wake: f.cfg.Spool.Wake(), Kick: f.kick, Clock: f.clock}
	startstop.Every(ctx, schedule, func(ctx context.Context) bool {
		batch, probe, err := f.take(ctx)
		switch {
		case err != nil:
			return f.failed(ctx, err, 1) // waited out its backoff: try again at once
		case len(batch) == 0:
			return false
		default:
			f.own(ctx, batch, probe)
			return true
		}
	})
}

// own sends a batch once: what lands is acknowledged, what is left goes back
// to the spool. A failure holds every newer batch back until the oldest rows
// pending, read again from the top, have landed (see Forwarder); the worker
// waits out the backoff, which grows with each failed attempt until then. A
// batch Postgres refuses whole is given back without holding the others,
// whose landing shows its rows at fault; the wait before its next try grows
// with each such refusal until something lands, so a refusal that repeats
// backs off to MaxBackoff rather than restarting its search every MinBackoff.
func (f *Forwarder) own(ctx context.Context, batch []spool.Record, probe bool) {
	var acks batchAcks
	f.mu.Lock()
	chunk := len(batch)
	if f.chunk > 0 {
		chunk = min(chunk, f.chunk)
	}
	f.mu.Unlock()
	handled, err := f.forward(f.ioCtx, batch, &acks, &chunk)
	batch = without(batch, handled)
	if err == nil && len(batch) == 0 {
		f.release(&acks)
		if probe {
			f.recovered()
		}
		return
	}
	if err == nil {
		err = errors.New("rows left unsent")
	}
	if errors.Is(err, errRefusedEverything) {
		f.mu.Lock()
		f.streak++
		streak := f.streak
		f.mu.Unlock()
		f.failed(ctx, err, streak)
		f.release(&acks) // read again, with what came after it, once no batch is in flight
		return
	}
	// Recorded before the batch is released, so that no newer batch is taken
	// in between.
	smaller := 0
	if errors.Is(err, errTooSlow) {
		smaller = chunk
	}
	wait, failures := f.holdBack(smaller)
	f.release(&acks)
	f.backOff(ctx, err, failures, wait) // stopping: what is left stays pending for the final flush
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

// forward writes a batch to Postgres, in statements of at most *chunk events,
// and acknowledges what landed. It returns the seqs it handled: landed, or set
// aside as dead. A payload that no longer parses is set aside at once. A row
// Postgres refuses for good is found by halving its statement; it is set aside
// only when there is evidence that the row, not Postgres, is at fault: other
// rows of the statement landed, or other rows landed since the row was first
// refused. A refusal of everything (a schema change, say) is an error to
// retry, never a reason to bury every row. A statement that runs too long
// halves *chunk for the next attempt. A cancellation is applied on its own,
// in its place among the events, and is retried or set aside as they are.
func (f *Forwarder) forward(ctx context.Context, batch []spool.Record, acks *batchAcks, chunk *int) (map[int64]bool, error) {
	handled := map[int64]bool{}
	rows := make([]spool.Record, 0, len(batch))
	items := make([]ingest.Item, 0, len(batch))
	for _, rec := range batch {
		if isCancel(rec) {
			rows = append(rows, rec)
			items = append(items, ingest.Item{}) // not an event: applied by cancel
			continue
		}
		ev, err := event.Parse(rec.Payload)
		if err != nil {
			if err := f.bury(ctx, rec, deadInvalid, err); err != nil {
				return handled, err
			}
			handled[rec.Seq] = true
			continue
		}
		rows = append(rows, rec)
		items = append(items, ingest.Item{Producer: rec.Producer, Event: ev, Hash: rec.Hash, ReceivedAt: rec.ReceivedAt})
	}
	var unproven error
	for len(rows) > 0 {
		if isCancel(rows[0]) {
			if unproven != nil {
				break // an event refused ahead of it goes first: the batch is tried again
			}
			rec := rows[0]
			refused, err := f.cancel(ctx, rec, acks)
			switch {
			case err != nil:
				return handled, err
			case refused == nil:
				handled[rec.Seq] = true
			case !f.atFault(rec.Seq, false):
				unproven = cmp.Or(unproven, refused)
			default:
				if err := f.bury(ctx, rec, deadRefused, refused); err != nil {
					return handled, err
				}
				handled[rec.Seq] = true
			}
			rows, items = rows[1:], items[1:]
			continue
		}
		// The events up to the next cancellation, in statements of *chunk.
		n := min(max(1, *chunk), len(rows))
		if i := slices.IndexFunc(rows[:n], isCancel); i >= 0 {
			n = i
		}
		landed, refused, err := f.send(ctx, rows[:n], items[:n], acks)
		for _, seq := range landed {
			handled[seq] = true
		}
		if err != nil {
			if errors.Is(err, errTooSlow) && n > 1 {
				*chunk = n / 2
			}
			return handled, err
		}
		for _, r := range refused {
			if !f.atFault(r.rec.Seq, len(landed) > 0) {
				unproven = cmp.Or(unproven, r.err)
				continue
			}
			if err := f.bury(ctx, r.rec, deadRefused, r.err); err != nil {
				return handled, err
			}
			handled[r.rec.Seq] = true
		}
		rows, items = rows[n:], items[n:]
	}
	if unproven != nil {
		return handled, fmt.Errorf("%w: %w", errRefusedEverything, unproven)
	}
	return handled, nil
}
