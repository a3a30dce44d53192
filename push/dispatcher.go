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
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/channel/webpush"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/startstop"
	"github.com/spoolcast/spoolcast/preferences"
	"github.com/spoolcast/spoolcast/push/policy"
)

// Sender sends push messages to Expo: an *expo.Client.
type Sender = expo.Sender

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
	// ExpoExperience is this app's Expo project, "@owner/slug": the
	// tokens of another project in a request are disabled
	// (expo.ChannelConfig.Experience). "": the project of most of a
	// request's tokens.
	ExpoExperience string
	// Preferences says which categories are off. Required.
	Preferences preferences.Source
	// Devices resolves and disables tokens. Required.
	Devices *devices.Store
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
	Throttle policy.Throttle
	// SuppressIfSeen holds the push of a user with an open stream this long
	// after its notification was created; read or seen on the stream
	// meanwhile, it is not sent (--push-suppress-if-seen). 0: off.
	// Critical pushes are not held.
	SuppressIfSeen time.Duration
	// WebPush sends to browsers' Web Push subscriptions; nil records their
	// dispatches failed, saying Web Push is not set up.
	WebPush *webpush.Sender
	// Channels are the providers behind the channel shape (APNs, FCM),
	// each reaching the devices registered with its Provider(). A device
	// of a provider not among them gets a failed dispatch saying so.
	Channels []channel.Channel
	// WebConcurrency caps Web Push requests in flight in this process.
	// Default DefaultWebConcurrency.
	WebConcurrency int
	// WebTTL is how long a push service keeps a message for a browser that
	// is offline (the TTL header). Default DefaultWebTTL.
	WebTTL time.Duration
	// WebTimeout bounds one Web Push request. Default DefaultWebTimeout.
	WebTimeout time.Duration
	// ClearOnRead sends, when a notification is read or archived (by item
	// or under a read-all or archive-all), a silent message to each of the
	// user's devices that got its push, so that its banner comes down
	// (--push-clear-on-read). Off, the clears are recorded skipped.
	ClearOnRead bool
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
	// lastClearSweep is when sweepClears last ran (UnixNano on the clock).
	lastClearSweep atomic.Int64

	// sends is the context of the passes' writes and requests to Expo once
	// they have taken their notifications: Stop leaves it running, and ends
	// it only when its own context is about to.
	mu         sync.Mutex
	sends      context.Context
	abortSends context.CancelFunc

	// Web Push sends run beside the passes: webSlots are the requests in
	// flight, webWaiting those started or waiting for a slot, webOrigins
	// and webUsers their shares per push service origin and per user,
	// webSends all of them, which Stop waits for (see sendSpread for the bounds).
	webSlots, webWaiting chan struct{}
	webOrigins, webUsers *shares
	webSends             sync.WaitGroup

	// channels are DispatcherConfig.Channels by provider; channelRetriers
	// hold, per provider, the one pass that may try it again until its
	// lease nearly ends (see sendChannel).
	channels        map[string]channel.Channel
	channelRetriers map[string]chan struct{}
	// refusals tells one device's refusal from a wrong setting's.
	refusals *refusalGuard
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
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	cfg.Clock = clock.Or(cfg.Clock)
	ex, err := expo.NewChannel(expo.ChannelConfig{Sender: cfg.Sender, Clock: cfg.Clock, Experience: cfg.ExpoExperience, OnResult: func(r string) { cfg.Metrics.sent.WithLabelValues(r).Inc() }})
	if err != nil {
		return nil, err
	}
	channels, retriers := map[string]channel.Channel{ProviderExpo: ex}, map[string]chan struct{}{ProviderExpo: make(chan struct{}, 1)}
	if cfg.WebPush != nil {
		web, err := webpush.NewChannel(webpush.ChannelConfig{Sender: cfg.WebPush, TTL: cfg.WebTTL, Timeout: cfg.WebTimeout, Clock: cfg.Clock,
			OnResult: func(o webpush.Outcome, took time.Duration) {
				cfg.Metrics.webSent.WithLabelValues(o.String()).Inc()
				cfg.Metrics.webTook.Observe(took.Seconds())
			}})
		if err != nil {
			return nil, err
		}
		channels[ProviderWebPush] = web
	}
	for _, ch := range cfg.Channels {
		p := ch.Provider()
		if p == ProviderExpo || p == ProviderWebPush || channels[p] != nil || !devices.ValidProvider(p) {
			return nil, fmt.Errorf("dispatcher: channel %q: a provider's name is lowercase, and each is set up once", p)
		}
		channels[p], retriers[p] = ch, make(chan struct{}, 1)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	for p := range channels {
		cfg.Metrics.initChannel(p)
	}
	return &Dispatcher{channels: channels, channelRetriers: retriers, refusals: newRefusalGuard(), cfg: cfg, log: cfg.Logger.With("component", "dispatcher"), failLog: lograte.New(10 * time.Second), kick: make(chan struct{}, cfg.Workers),
		inflight: map[uint64]struct{}{},
		webSlots: make(chan struct{}, cfg.WebConcurrency), webWaiting: make(chan struct{}, 2*cfg.WebConcurrency),
		webOrigins: newShares(2*cfg.WebConcurrency*3/4, cfg.WebConcurrency*3/4), webUsers: newShares(2*cfg.WebConcurrency/8, cfg.WebConcurrency/8)}, nil
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
	loops := make([]func(context.Context), 0, d.cfg.Workers+2)
	for range d.cfg.Workers {
		loops = append(loops, d.loop)
	}
	if !d.svc.Start(ctx, append(loops, d.gauges, d.clearLoop)...) && !d.svc.Started() {
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
