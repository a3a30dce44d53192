package push

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/spoolcast/spoolcast/expo"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/startstop"
	"github.com/spoolcast/spoolcast/push/webpush"
)

// Sender sends push messages: an *expo.Client.
type Sender interface {
	Send(ctx context.Context, msgs []expo.Message) ([]expo.Ticket, error)
}

var _ Sender = (*expo.Client)(nil)

// Dispatch states.
const (
	StateQueued         = "queued"
	StateSent           = "sent"
	StateDelivered      = "delivered"
	StateReceiptError   = "receipt_error"
	StateReceiptMissing = "receipt_missing"
	StateFailed         = "failed"
	StateSkipped        = "skipped"
)

// DispatcherConfig configures a dispatcher.
type DispatcherConfig struct {
	// DB is Postgres. Required.
	DB DB
	// Sender sends to Expo. Required.
	Sender Sender
	// Preferences says which categories are off. Required.
	Preferences Preferences
	// Devices resolves and disables tokens. Required.
	Devices *Devices
	// Wake receives ingest's wake-ups; nil leaves the dispatcher to its interval.
	Wake <-chan struct{}
	// Interval is how often the queue is checked without a wake-up. Default 1s.
	Interval time.Duration
	// BatchSize caps the notifications one pass takes. Default 500.
	BatchSize int
	// Workers is how many passes run at once in this process. Default 2.
	Workers int
	// Lease is how long a pass holds the queue rows it took; past it another
	// dispatcher may take them (a stop gives them back at once). Default 2m.
	Lease time.Duration
	// MaxAge is the oldest notification still pushed: older ones (left by a
	// long stop of every dispatcher) are recorded skipped. Default 1h.
	MaxAge time.Duration
	// Replica names this process in the queue's leases. Default host-pid-random.
	Replica string
	// Throttle caps the pushes per user and category in a window
	// (--push-throttle); the zero Throttle is off. Critical pushes pass it.
	Throttle Throttle
	// SuppressIfSeen holds the push of a user with an open stream this long
	// after its notification was created; read or seen on the stream
	// meanwhile, it is not sent (--push-suppress-if-seen). 0: off.
	// Critical pushes are not held.
	SuppressIfSeen time.Duration
	// WebPush sends to browsers' Web Push subscriptions; nil records their
	// dispatches failed, saying Web Push is not set up.
	WebPush *webpush.Sender
	// WebConcurrency caps Web Push requests in flight in this process.
	// Default DefaultWebConcurrency.
	WebConcurrency int
	// WebTTL is how long a push service keeps a message for a browser that
	// is offline (the TTL header). Default DefaultWebTTL.
	WebTTL time.Duration
	// WebTimeout bounds one Web Push request. Default DefaultWebTimeout.
	WebTimeout time.Duration
	// Clock times the interval and the gauges and tells which notifications
	// are past MaxAge. Default the wall clock.
	Clock clock.Clock
	// Metrics and Logger: defaults not exported, slog.Default().
	Metrics *Metrics
	Logger  *slog.Logger
}

// Dispatcher drains the push queue: any number of them, in any replicas,
// share it, and each notification is dispatched once.
type Dispatcher struct {
	cfg     DispatcherConfig
	log     *slog.Logger
	failLog *lograte.Limiter
	kick    chan struct{} // a worker that took a full batch wakes another
	svc     startstop.Service
	// passes numbers each pass's claim (claimToken); inflight holds the
	// numbers of the passes running, and lastSweep when releaseOrphans last
	// ran (UnixNano on the clock).
	passes    atomic.Uint64
	passMu    sync.Mutex
	inflight  map[uint64]struct{}
	lastSweep atomic.Int64

	// sends is the context of the passes' writes and requests to Expo once
	// they have taken their notifications: Stop leaves it running, and ends
	// it only when its own context is about to.
	mu         sync.Mutex
	sends      context.Context
	abortSends context.CancelFunc

	// Web Push sends run beside the passes: webSlots are the requests in
	// flight, webWaiting those started or waiting for a slot, webByOrigin
	// those per push service origin, webSends all of them, which Stop
	// waits for (see sendWeb for the bounds).
	webSlots, webWaiting chan struct{}
	webMu                sync.Mutex
	webByOrigin          map[string]*originSends
	webSends             sync.WaitGroup
}

// gaugesInterval is how often the in-flight gauges are refreshed.
const gaugesInterval = 15 * time.Second

// finishReserve is the part of Stop's time kept, at most, for recording what
// the sends it cut off came to and giving back what they had not sent.
const finishReserve = 2 * time.Second

// NewDispatcher returns a dispatcher; Start runs it.
func NewDispatcher(cfg DispatcherConfig) (*Dispatcher, error) {
	switch {
	case cfg.DB == nil || cfg.Sender == nil || cfg.Preferences == nil || cfg.Devices == nil:
		return nil, errors.New("dispatcher: a database, a sender, preferences and devices are required")
	case cfg.Interval < 0 || cfg.BatchSize < 0 || cfg.Workers < 0 || cfg.Lease < 0 || cfg.MaxAge < 0:
		return nil, errors.New("dispatcher: interval, batch size, workers, lease and max age must not be negative")
	case cfg.Throttle.Limit < 0 || (cfg.Throttle.Limit > 0 && cfg.Throttle.Window < time.Second):
		return nil, errors.New("dispatcher: a throttle needs a limit of at least 1 and a window of at least 1s")
	}
	cfg.Interval = cmp.Or(cfg.Interval, time.Second)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 500)
	cfg.Workers = cmp.Or(cfg.Workers, 2)
	cfg.Lease = cmp.Or(cfg.Lease, 2*time.Minute)
	cfg.MaxAge = cmp.Or(cfg.MaxAge, time.Hour)
	if cfg.WebConcurrency < 0 || cfg.WebTTL < 0 || cfg.WebTimeout < 0 {
		return nil, errors.New("dispatcher: Web Push concurrency, TTL and timeout must not be negative")
	}
	cfg.WebConcurrency = cmp.Or(cfg.WebConcurrency, DefaultWebConcurrency)
	cfg.WebTTL = cmp.Or(cfg.WebTTL, DefaultWebTTL)
	cfg.WebTimeout = cmp.Or(cfg.WebTimeout, DefaultWebTimeout)
	if cfg.Replica == "" {
		cfg.Replica = replicaName()
	}
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Dispatcher{cfg: cfg, log: cfg.Logger.With("component", "dispatcher"), failLog: lograte.New(10 * time.Second), kick: make(chan struct{}, cfg.Workers),
		inflight: map[uint64]struct{}{},
		webSlots: make(chan struct{}, cfg.WebConcurrency), webWaiting: make(chan struct{}, 2*cfg.WebConcurrency), webByOrigin: map[string]*originSends{}}, nil
}

func replicaName() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// Start runs the dispatcher's workers in the background; only the first call
// does. Ending ctx stops them at once, sends in flight included; Stop stops
// them gracefully.
func (d *Dispatcher) Start(ctx context.Context) {
	d.mu.Lock()
	if d.sends == nil {
		d.sends, d.abortSends = context.WithCancel(ctx)
	}
	d.mu.Unlock()
	loops := make([]func(context.Context), 0, d.cfg.Workers+1)
	for range d.cfg.Workers {
		loops = append(loops, d.loop)
	}
	if !d.svc.Start(ctx, append(loops, d.gauges)...) && !d.svc.Started() {
		d.abort() // a Start after Stop: nothing runs, and nothing may send
	}
}

// Stop stops the dispatcher gracefully (a rolling deploy's SIGTERM): it
// claims nothing more; a pass that has written its dispatches sends them and
// records the tickets, until ctx is about to end; one that has not gives its
// notifications back to the queue, for any replica to take at once. Shortly
// before ctx ends (finishReserve, or half of what is left), the sends still
// waiting for the rate limit or a connection are given up and given back the
// same way, and requests Expo has not answered are cut off: their dispatches
// end failed, outcome unknown. Safe to call twice, and before Start.
func (d *Dispatcher) Stop(ctx context.Context) error {
	actx, cancel := abortContext(ctx)
	defer cancel()
	defer context.AfterFunc(actx, d.abort)()
	// The Web Push sends the passes started end too, cut off with the rest.
	err := d.svc.Stop(ctx, func(ctx context.Context) error {
		if !startstop.Wait(ctx, &d.webSends) {
			return ctx.Err()
		}
		return nil
	})
	d.abort()
	return err
}

// abort ends the sends' context.
func (d *Dispatcher) abort() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.abortSends != nil {
		d.abortSends()
	}
}

// sendContext is the sends' context; the workers run after Start set it.
func (d *Dispatcher) sendContext() context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sends
}

// abortContext ends when the sends of a stop with ctx must be cut off: a
// reserve before ctx's deadline (on the wall clock, as deadlines are), so
// that what they came to is recorded before ctx ends; without a deadline,
// when ctx ends.
func abortContext(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	reserve := min(finishReserve, clock.Until(clock.Real{}, deadline)/2)
	return context.WithDeadline(ctx, deadline.Add(-reserve))
}

// loop is one worker: a pass every Interval, on a wake-up from ingest or a
// kick from another worker, and at once after a full batch.
func (d *Dispatcher) loop(ctx context.Context) {
	startstop.Every(ctx, startstop.Schedule{Interval: d.cfg.Interval, Wake: d.cfg.Wake, Kick: d.kick, Clock: d.cfg.Clock}, d.workerPass)
}

// workerPass runs one pass and reports whether it took a full batch.
func (d *Dispatcher) workerPass(ctx context.Context) (again bool) {
	n, err := d.pass(ctx, d.sendContext())
	if err != nil && ctx.Err() == nil {
		d.failLog.Do(func(suppressed int64) {
			d.log.Error("dispatch pass failed; its notifications are taken again after the lease", "err", err, "suppressed", suppressed)
		})
	}
	if n == d.cfg.BatchSize && err == nil {
		select { // more is waiting: let another worker look too
		case d.kick <- struct{}{}:
		default:
		}
		return true
	}
	return false
}

// gauges refreshes the in-flight gauges every few seconds with cheap queries
// (partial indexes), whatever the dispatch history holds.
func (d *Dispatcher) gauges(ctx context.Context) {
	startstop.Every(ctx, startstop.Schedule{Interval: gaugesInterval, Clock: d.cfg.Clock}, func(ctx context.Context) bool {
		var queued, sent, deferred, digested, throttled, suppressed, cancelled int64
		var oldest float64
		now := d.cfg.Clock.Now()
		err := d.cfg.DB.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM push_dispatches WHERE state = 'queued'),
				(SELECT count(*) FROM push_dispatches WHERE state = 'sent' AND sent_at > now() - interval '24 hours'),
				coalesce((SELECT extract(epoch FROM greatest(now(), $1) - greatest(enqueued_at, due_at)) FROM push_queue
				          WHERE due_at <= greatest(now(), $1) ORDER BY due_at, notification_id LIMIT 1), 0),
				(SELECT count(*) FROM push_queue WHERE due_at > greatest(now(), $1)),
				-- The policies' final states of the last 24 hours, from the state index.
				(SELECT count(*) FROM push_dispatches WHERE state = 'digested' AND created_at > now() - interval '24 hours'),
				(SELECT count(*) FROM push_dispatches WHERE state = 'throttled' AND created_at > now() - interval '24 hours'),
				(SELECT count(*) FROM push_dispatches WHERE state = 'suppressed' AND created_at > now() - interval '24 hours'),
				(SELECT count(*) FROM push_dispatches WHERE state = 'cancelled' AND created_at > now() - interval '24 hours')`,
			now).Scan(&queued, &sent, &oldest, &deferred, &digested, &throttled, &suppressed, &cancelled)
		if err == nil {
			d.cfg.Metrics.dispatches.WithLabelValues(StateQueued).Set(float64(queued))
			d.cfg.Metrics.dispatches.WithLabelValues(StateSent).Set(float64(sent))
			d.cfg.Metrics.dispatches.WithLabelValues(StateDeferred).Set(float64(deferred))
			d.cfg.Metrics.dispatches.WithLabelValues(StateDigested).Set(float64(digested))
			d.cfg.Metrics.dispatches.WithLabelValues(StateThrottled).Set(float64(throttled))
			d.cfg.Metrics.dispatches.WithLabelValues(StateSuppressed).Set(float64(suppressed))
			d.cfg.Metrics.dispatches.WithLabelValues(StateCancelled).Set(float64(cancelled))
			d.cfg.Metrics.queueOldest.Set(max(0, oldest))
		}
		if th := d.cfg.Throttle; th.Limit > 0 {
			if err := expireThrottles(ctx, d.cfg.DB, now.Truncate(th.Window)); err != nil {
				d.log.Warn("delete the throttle's past windows", "err", err)
			}
		}
		return false
	})
}

// queued is a notification taken from the push queue.
type queued struct {
	id         int64
	createdAt  time.Time
	enqueuedAt time.Time
	user       string
	category   string
	title      string
	body       string
	// dueAt is when the row became due: its enqueuing, or the end of the
	// quiet hours that deferred it.
	dueAt    time.Time
	priority string
	// digestKey and digestWindow: the notification's digest. A digest's own
	// push (digestCount > 0) gathers digestCount notifications.
	digestKey    string
	digestWindow time.Duration
	digestCount  int
	// seenWaited: the push was held once for its user to see it.
	seenWaited bool
	// decided: the delivery policies let the push through before it was
	// given back to the queue; they are not decided again.
	decided bool
	// retaken: the queue row had been claimed before, by a dispatcher whose
	// lease ran out or that gave it back, and may have dispatched it to
	// some of the devices already.
	retaken bool
	// claimedBy is the pass's claim token (claimToken), which its later
	// statements name.
	claimedBy string
}

func (q *queued) critical() bool { return q.priority == "critical" }

// digestMember reports whether the notification joins a digest rather than
// being pushed alone.
func (q *queued) digestMember() bool { return q.digestKey != "" && q.digestCount == 0 }

// since is when the push became due: what --push-max-age counts from.
func (q *queued) since() time.Time {
	if q.dueAt.After(q.createdAt) {
		return q.dueAt
	}
	return q.createdAt
}

// dispatchRow is a dispatch to write.
type dispatchRow struct {
	n     *queued
	token *string
	state string
	err   *string
}

// Pass takes up to BatchSize notifications from the queue and dispatches
// them: it records one row per device (or one skipped row), sends, and
// records the tickets. It returns how many notifications it took. A ctx that
// ends mid-pass gives back to the queue what was not sent.
func (d *Dispatcher) Pass(ctx context.Context) (int, error) { return d.pass(ctx, ctx) }

// pass is Pass with two contexts: stop ends the taking — a pass stopped
// before it has written its dispatches gives its notifications back — and
// sends is the context of everything after the claim: the lookups, the
// writes and the requests to Expo.
func (d *Dispatcher) pass(stop, sends context.Context) (n int, err error) {
	d.releaseOrphans(stop)
	token, ended := d.claimToken()
	defer ended()
	claimed, err := d.claim(stop, token)
	if err != nil && !pgconn.SafeToRetry(err) {
		// The claim may have committed though its answer was lost: give
		// back what this pass may hold, or its rows wait out the lease.
		if perr := d.persist(stop, func(ctx context.Context) error { return d.unclaimAll(ctx, token) }); perr != nil {
			d.log.Warn("give back the push queue's rows of a failed claim; they are taken again after the lease", "err", perr)
		}
	}
	if err != nil || len(claimed) == 0 {
		return 0, err
	}
	ctx := sends // from here on, a stop lets the pass finish
	written := false
	defer func() {
		// A pass stopped or failed before writing its dispatches gives its
		// rows back at once, rather than leave them leased for the lease's
		// length.
		if !written && err != nil && len(claimed) > 0 {
			// Written again until Postgres answers: a pass that failed
			// because Postgres went away (a failover) would otherwise leave
			// its rows leased, and their pushes late, for the lease's length.
			if uerr := d.persist(context.WithoutCancel(ctx), func(ctx context.Context) error { return d.unclaim(ctx, claimed) }); uerr != nil {
				d.log.Warn("give back the push queue's rows; they are taken again after the lease", "err", uerr)
			}
		}
	}()
	users := make([]string, 0, len(claimed))
	seen := map[string]bool{}
	for _, q := range claimed {
		if !seen[q.user] {
			seen[q.user] = true
			users = append(users, q.user)
		}
	}
	off := d.cfg.Preferences.PushOff(ctx, users)
	tokens, err := d.cfg.Devices.enabledTokens(ctx, users)
	if err != nil {
		return len(claimed), err
	}
	done, err := d.dispatched(ctx, claimed)
	if err != nil {
		return len(claimed), err
	}
	if stop.Err() != nil {
		// Stopping, and nothing written yet: another replica may take them
		// now (given back above).
		return 0, stop.Err()
	}
	now := d.cfg.Clock.Now()
	quiet, qerr := quietHours(ctx, d.cfg.DB, users)
	if qerr != nil {
		d.failLog.Do(func(suppressed int64) {
			d.log.Warn("quiet hours unreadable; pushing (fail open)", "err", qerr, "suppressed", suppressed)
		})
	}
	seenNow := d.seenState(ctx, claimed, users, now)
	var p plan
	var invalid []string
	oldest := now.Add(-d.cfg.MaxAge)
	for i := range claimed {
		q := &claimed[i]
		// A notification dispatched before, in part (see dispatched), goes
		// only to the devices it has not been dispatched to.
		before, dispatchedBefore := done[q.id]
		var skipped string
		var sends []dispatchRow
		switch {
		case q.since().Before(oldest):
			skipped = fmt.Sprintf("expired: due more than %s ago (--push-max-age)", d.cfg.MaxAge)
		case off[q.user][q.category]:
			skipped = fmt.Sprintf("push is off for category %q", q.category)
		default:
			for _, t := range tokens[q.user] {
				switch {
				case !ValidToken(t):
					invalid = append(invalid, t)
				case !before[t]:
					sends = append(sends, dispatchRow{n: q, token: &t, state: StateQueued})
				}
			}
			if len(sends) == 0 {
				skipped = "no enabled device"
			}
		}
		switch {
		case skipped != "":
			if !dispatchedBefore { // no skipped row beside earlier dispatches
				p.rows = append(p.rows, dispatchRow{n: q, state: StateSkipped, err: &skipped})
			}
		case q.decided && !q.critical() && p.deferInQuiet(q, quiet[q.user], now):
			// Decided, then given back (a stop, a 429's Retry-After, a busy
			// push service), and come again in quiet hours that began
			// meanwhile: held until they end, still decided.
		case dispatchedBefore || q.decided:
			// Its policies were decided when it was first dispatched.
			p.rows = append(p.rows, sends...)
		default:
			p.decide(q, sends, quiet[q.user], now, qerr != nil, d.cfg.Throttle, seenNow)
		}
	}
	if err := d.cfg.Devices.disableTokens(ctx, invalid, DisabledInvalid); err != nil {
		d.log.Warn("disable invalid tokens", "err", err)
	}
	created, err := d.write(ctx, claimed, &p, now)
	if err != nil {
		// The write may have committed though its answer was lost (Postgres
		// went away during the commit, which a synchronous standby kept):
		// then its dispatches are queued and no one else will send them.
		var committed bool
		if perr := d.persist(ctx, func(ctx context.Context) (err error) {
			created, committed, err = d.written(ctx, claimed)
			return err
		}); perr != nil || !committed {
			return len(claimed), err
		}
		d.log.Warn("the dispatches' write had committed though its answer was lost; sending them", "err", err)
	} else {
		p.count(d.cfg.Metrics)
	}
	written = true
	d.send(ctx, created)
	return len(claimed), nil
}

// written tells whether a write of claimed's dispatches (create) committed,
// and if so returns its queued dispatches. The write deletes the claimed
// queue rows in the same statement: either all are gone or none is. Its
// dispatches are read from those still queued and written within the lease.
func (d *Dispatcher) written(ctx context.Context, claimed []queued) ([]created, bool, error) {
	ids := make([]int64, len(claimed))
	byKey := map[string]*queued{}
	for i := range claimed {
		ids[i] = claimed[i].id
		byKey[fmt.Sprint(claimed[i].id)] = &claimed[i]
	}
	var left int
	if err := d.cfg.DB.QueryRow(ctx, `SELECT count(*) FROM push_queue WHERE notification_id = ANY($1) AND claimed_by = $2`, ids, claimed[0].claimedBy).Scan(&left); err != nil {
		return nil, false, err
	}
	if left > 0 {
		return nil, false, nil
	}
	rows, err := d.cfg.DB.Query(ctx, `SELECT id, created_at, notification_id, coalesce(token, ''), state FROM push_dispatches
		WHERE state = 'queued' AND created_at > now() - $2::interval AND notification_id = ANY($1)`, ids, 2*d.cfg.Lease)
	if err != nil {
		return nil, false, err
	}
	out, err := collectCreated(rows, byKey)
	return out, err == nil, err
}

// claimToken names one pass's claim in claimed_by: the replica and the
// pass's number, so that a pass can give back exactly the rows it holds
// even when it never learned which (unclaimAll). The pass is in flight
// until ended is called.
func (d *Dispatcher) claimToken() (token string, ended func()) {
	d.passMu.Lock()
	n := d.passes.Add(1)
	d.inflight[n] = struct{}{}
	d.passMu.Unlock()
	return d.cfg.Replica + "/" + strconv.FormatUint(n, 10), func() {
		d.passMu.Lock()
		delete(d.inflight, n)
		d.passMu.Unlock()
	}
}

// orphanSweepInterval is how often a dispatcher looks for orphaned leases
// (releaseOrphans).
const orphanSweepInterval = 15 * time.Second

// releaseOrphans gives back, at most every orphanSweepInterval, the queue
// rows leased to passes of this process that have ended. A pass ends only
// after deleting its rows (with the write of their dispatches) or giving
// them back, so such a lease is left by a write that Postgres acknowledged
// and then lost: a failover to an asynchronous standby, or a restore. Its
// pushes are then dispatched again at once rather than after the lease; the
// rows keep claimed_by, so the pass that takes them knows they were retaken.
func (d *Dispatcher) releaseOrphans(ctx context.Context) {
	now := d.cfg.Clock.Now().UnixNano()
	last := d.lastSweep.Load()
	if now-last < int64(orphanSweepInterval) || !d.lastSweep.CompareAndSwap(last, now) {
		return
	}
	d.passMu.Lock()
	below := d.passes.Load() + 1 // every pass numbered below has begun
	running := make([]int64, 0, len(d.inflight))
	for n := range d.inflight {
		running = append(running, int64(n))
	}
	d.passMu.Unlock()
	tag, err := d.cfg.DB.Exec(ctx, `UPDATE push_queue SET claimed_until = NULL
		WHERE claimed_until > now() AND starts_with(claimed_by, $1)
		  AND CASE WHEN substr(claimed_by, length($1) + 1) ~ '^[0-9]{1,18}$'
		      THEN substr(claimed_by, length($1) + 1)::int8 < $2 AND substr(claimed_by, length($1) + 1)::int8 <> ALL($3) END`,
		d.cfg.Replica+"/", int64(below), running)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("look for the push queue's orphaned leases", "err", err)
		}
		return
	}
	if n := tag.RowsAffected(); n > 0 {
		d.cfg.Metrics.orphans.Add(float64(n))
		d.log.Warn("gave back push queue rows leased to passes that had ended: Postgres lost writes it had acknowledged (a failover to an asynchronous standby, or a restore); their pushes are dispatched again, and some may arrive twice",
			"rows", n)
	}
}

// unclaimAll gives back the rows a pass's claim (token) holds, whether or
// not it committed.
func (d *Dispatcher) unclaimAll(ctx context.Context, token string) error {
	tag, err := d.cfg.DB.Exec(ctx, `UPDATE push_queue SET claimed_until = NULL WHERE claimed_by = $1 AND claimed_until IS NOT NULL`, token)
	if err == nil {
		d.cfg.Metrics.released.Add(float64(tag.RowsAffected()))
	}
	return err
}

// claim leases up to BatchSize queue rows no one holds, oldest first, with
// their notifications' text, under the pass's token. A row claimed before
// keeps claimed_by when it is given back or its lease runs out: that is how
// a dispatcher knows it was retaken.
func (d *Dispatcher) claim(ctx context.Context, token string) ([]queued, error) {
	// Rows are due when either clock says so: Postgres's (rows queued by
	// ingest) or the dispatcher's (rows deferred to a time it computed).
	rows, err := d.cfg.DB.Query(ctx, `WITH c AS (
			UPDATE push_queue q SET claimed_until = now() + $3::interval, claimed_by = $2
			FROM (SELECT notification_id, claimed_by FROM push_queue
			      WHERE due_at <= greatest(now(), $4) AND (claimed_until IS NULL OR claimed_until < now())
			      ORDER BY due_at, notification_id LIMIT $1 FOR UPDATE SKIP LOCKED) t
			WHERE q.notification_id = t.notification_id
			RETURNING q.notification_id, q.notification_created_at, q.enqueued_at, q.user_id, q.category,
			          t.claimed_by IS NOT NULL AS retaken, q.due_at, q.priority, q.digest_key, q.digest_window, q.digest_count, q.seen_waited, q.decided
		)
		SELECT c.notification_id, coalesce(c.notification_created_at, '-infinity'), c.enqueued_at, c.user_id, c.category,
		       coalesce(n.title, ''), coalesce(n.body, ''), c.retaken, c.due_at, c.priority, coalesce(c.digest_key, ''),
		       coalesce(extract(epoch FROM c.digest_window), 0)::int8, coalesce(c.digest_count, 0), c.seen_waited, c.decided
		FROM c LEFT JOIN notifications n ON n.id = c.notification_id AND n.created_at = c.notification_created_at
		ORDER BY c.due_at, c.notification_id`, d.cfg.BatchSize, token, d.cfg.Lease, d.cfg.Clock.Now())
	if err != nil {
		return nil, fmt.Errorf("claim the push queue: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (queued, error) {
		var q queued
		var created pgtype.Timestamptz // -infinity for a row queued before notifications had partitions
		var windowSeconds int64
		err := r.Scan(&q.id, &created, &q.enqueuedAt, &q.user, &q.category, &q.title, &q.body, &q.retaken,
			&q.dueAt, &q.priority, &q.digestKey, &windowSeconds, &q.digestCount, &q.seenWaited, &q.decided)
		if created.InfinityModifier == pgtype.Finite {
			q.createdAt = created.Time
		}
		q.digestWindow = time.Duration(windowSeconds) * time.Second
		if q.digestCount > 1 {
			// A digest's push says how many it gathers, with the latest title.
			q.title, q.body = digestTitle(q.digestCount, q.digestKey), q.title
		}
		q.claimedBy = token
		return q, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim the push queue: %w", err)
	}
	return out, nil
}

// dispatched returns, for the retaken notifications among claimed that
// have dispatches already (a dispatcher stopped after sending to some of
// their devices), the tokens they were dispatched to. Only retaken rows are
// looked up: the others cannot have any.
func (d *Dispatcher) dispatched(ctx context.Context, claimed []queued) (map[int64]map[string]bool, error) {
	var ids []int64
	var users []string
	var since time.Time
	for _, q := range claimed {
		if q.retaken {
			if len(ids) == 0 || q.createdAt.Before(since) {
				since = q.createdAt
			}
			ids, users = append(ids, q.id), append(users, q.user)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	// A notification's dispatches are written after it: created_at bounds
	// the partitions and the user index's range.
	rows, err := d.cfg.DB.Query(ctx, `SELECT notification_id, coalesce(token, '') FROM push_dispatches
		WHERE user_id = ANY($1) AND created_at >= $2 AND notification_id = ANY($3)
		  AND state NOT IN ('deferred', 'digested')`, users, since, ids)
	if err != nil {
		return nil, fmt.Errorf("read earlier dispatches: %w", err)
	}
	defer rows.Close()
	out := map[int64]map[string]bool{}
	for rows.Next() {
		var id int64
		var token string
		if err := rows.Scan(&id, &token); err != nil {
			return nil, fmt.Errorf("read earlier dispatches: %w", err)
		}
		if out[id] == nil {
			out[id] = map[string]bool{}
		}
		out[id][token] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read earlier dispatches: %w", err)
	}
	return out, nil
}

// unclaim gives claimed rows back to the queue, for any dispatcher to take at once.
func (d *Dispatcher) unclaim(ctx context.Context, claimed []queued) error {
	ids := make([]int64, len(claimed))
	for i, q := range claimed {
		ids[i] = q.id
	}
	tag, err := d.cfg.DB.Exec(ctx, `UPDATE push_queue SET claimed_until = NULL
		WHERE notification_id = ANY($1) AND claimed_by = $2`, ids, claimed[0].claimedBy)
	if err != nil {
		return err
	}
	d.cfg.Metrics.released.Add(float64(tag.RowsAffected()))
	return nil
}

// created is a queued dispatch, written.
type created struct {
	id        int64
	createdAt time.Time
	n         *queued
	token     string
}

// create writes the dispatch rows and takes the notifications out of the
// queue, in one statement: only those still leased to this dispatcher (a
// pass that outlived its lease writes nothing for rows another has taken).
func create(ctx context.Context, tx pgx.Tx, claimed []queued, rows []dispatchRow) ([]created, error) {
	ids := make([]int64, len(claimed))
	for i, q := range claimed {
		ids[i] = q.id
	}
	var nid []int64
	var ncreated []time.Time
	var users []string
	var tokens, errs []*string
	var states []string
	for _, r := range rows {
		nid, ncreated, users = append(nid, r.n.id), append(ncreated, r.n.createdAt), append(users, r.n.user)
		tokens, states, errs = append(tokens, r.token), append(states, r.state), append(errs, r.err)
	}
	byKey := map[string]*queued{}
	for i := range claimed {
		byKey[fmt.Sprint(claimed[i].id)] = &claimed[i]
	}
	res, err := tx.Query(ctx, `WITH released AS (
			DELETE FROM push_queue WHERE notification_id = ANY($1) AND claimed_by = $2
			RETURNING notification_id
		)
		INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, token, state, error)
		SELECT r.nid, r.ncreated, r.user_id, r.token, r.state, r.error
		FROM unnest($3::int8[], $4::timestamptz[], $5::text[], $6::text[], $7::text[], $8::text[])
		     AS r(nid, ncreated, user_id, token, state, error)
		WHERE r.nid IN (SELECT notification_id FROM released)
		RETURNING id, created_at, notification_id, coalesce(token, ''), state`,
		ids, claimed[0].claimedBy, nid, ncreated, users, tokens, states, errs)
	if err != nil {
		return nil, err
	}
	return collectCreated(res, byKey)
}

func collectCreated(rows pgx.Rows, byKey map[string]*queued) ([]created, error) {
	defer rows.Close()
	var out []created
	for rows.Next() {
		var c created
		var nid int64
		var state string
		if err := rows.Scan(&c.id, &c.createdAt, &nid, &c.token, &state); err != nil {
			return nil, err
		}
		if state != StateQueued {
			continue
		}
		c.n = byKey[fmt.Sprint(nid)]
		out = append(out, c)
	}
	return out, rows.Err()
}
