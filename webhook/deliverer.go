package webhook

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// Defaults of a Deliverer.
const (
	// DefaultTimeout is how long a receiver has to answer 2xx, as Standard
	// Webhooks asks receivers to answer quickly.
	DefaultTimeout      = 10 * time.Second
	DefaultRetryFor     = 72 * time.Hour
	DefaultDisableAfter = 120 * time.Hour
	DefaultRetention    = 7 * 24 * time.Hour
	DefaultConcurrency  = 32
	DefaultPerEndpoint  = 16
	// minRetry and maxRetry bound the backoff between attempts.
	minRetry = 5 * time.Second
	maxRetry = 6 * time.Hour
	// maxRetryAfter caps how long a receiver's Retry-After can hold a delivery.
	maxRetryAfter = 6 * time.Hour
	// bodyExcerpt is how much of a failed answer the log keeps.
	bodyExcerpt = 256
)

// DelivererConfig configures a Deliverer.
type DelivererConfig struct {
	// DB is Postgres. Required.
	DB DB
	// Client sends the deliveries. Default Client(Timeout, AllowPrivate, PerEndpoint).
	Client *http.Client
	// AllowPrivate: see Client.
	AllowPrivate bool
	// Timeout bounds one attempt. Default DefaultTimeout.
	Timeout time.Duration
	// RetryFor is how long a delivery is retried after it was created (or
	// replayed) before it ends failed. Default DefaultRetryFor.
	RetryFor time.Duration
	// DisableAfter disables an endpoint that has had no success for this
	// long since an attempt failed. Default DefaultDisableAfter.
	DisableAfter time.Duration
	// Retention is how long ended deliveries and the attempts log are kept,
	// the window replay can reach. Default DefaultRetention; at least RetryFor.
	Retention time.Duration
	// Concurrency caps attempts in flight in this replica; PerEndpoint caps
	// them per endpoint, so that a slow receiver holds only its own share.
	Concurrency, PerEndpoint int
	// Interval is how often due deliveries are looked for. Default 1s.
	Interval time.Duration
	Clock    clock.Clock
	Metrics  *Metrics
	Logger   *slog.Logger
}

// Deliverer sends due deliveries; Start runs it in the background.
type Deliverer struct {
	cfg     DelivererConfig
	log     *slog.Logger
	failLog *lograte.Limiter
	svc     startstop.Service

	mu       sync.Mutex
	inFlight map[string]int // by endpoint
	total    int
	sends    sync.WaitGroup
	freed    chan struct{} // a send ended: room for more
	// heldUntil: endpoints that answered they are overloaded, sent nothing
	// more by this replica until then.
	heldUntil map[string]time.Time

	recMu      sync.Mutex
	toRecord   []attempted   // attempts ended, not yet recorded
	recordKick chan struct{} // toRecord grew

	maintainKick chan struct{} // an endpoint was disabled: end its deliveries
}

// NewDeliverer returns a deliverer.
func NewDeliverer(cfg DelivererConfig) (*Deliverer, error) {
	if cfg.DB == nil {
		return nil, errors.New("webhook: a database is required")
	}
	if cfg.Timeout < 0 || cfg.RetryFor < 0 || cfg.DisableAfter < 0 || cfg.Retention < 0 || cfg.Concurrency < 0 || cfg.PerEndpoint < 0 || cfg.Interval < 0 {
		return nil, errors.New("webhook: durations and limits must not be negative")
	}
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.RetryFor = cmp.Or(cfg.RetryFor, DefaultRetryFor)
	cfg.DisableAfter = cmp.Or(cfg.DisableAfter, DefaultDisableAfter)
	cfg.Retention = cmp.Or(cfg.Retention, DefaultRetention)
	if cfg.Retention < cfg.RetryFor {
		return nil, fmt.Errorf("webhook: retention %s is shorter than the retry period %s", cfg.Retention, cfg.RetryFor)
	}
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	cfg.PerEndpoint = min(cmp.Or(cfg.PerEndpoint, DefaultPerEndpoint), cfg.Concurrency)
	cfg.Interval = cmp.Or(cfg.Interval, time.Second)
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Client == nil {
		cfg.Client = Client(cfg.Timeout, cfg.AllowPrivate, cfg.PerEndpoint)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Deliverer{cfg: cfg, log: cfg.Logger.With("component", "webhook"), failLog: lograte.New(10 * time.Second),
		inFlight: map[string]int{}, heldUntil: map[string]time.Time{}, freed: make(chan struct{}, 1), recordKick: make(chan struct{}, 1),
		maintainKick: make(chan struct{}, 1)}, nil
}

// Start runs the deliverer in the background.
func (d *Deliverer) Start(ctx context.Context) {
	d.svc.Start(ctx, d.loop, d.maintain, d.recorder)
}

// Stop stops taking deliveries and waits, until ctx ends, for the attempts
// in flight to end and be recorded: a rolling deploy does not cut a
// receiver off mid-answer. An attempt not recorded by then is sent again
// after its lease, with the same webhook-id.
func (d *Deliverer) Stop(ctx context.Context) error {
	return d.svc.Stop(ctx, func(ctx context.Context) error {
		if !startstop.Wait(ctx, &d.sends) {
			return ctx.Err()
		}
		return d.Flush(ctx)
	})
}

func (d *Deliverer) loop(ctx context.Context) {
	startstop.Every(ctx, startstop.Schedule{Interval: d.cfg.Interval, Kick: d.freed, Clock: d.cfg.Clock}, func(ctx context.Context) bool {
		more, err := d.Pass(ctx)
		if err != nil && ctx.Err() == nil {
			d.failLog.Do(func(suppressed int64) {
				d.log.Error("take due webhook deliveries; trying again", "err", err, "suppressed", suppressed)
			})
		}
		return more && err == nil
	})
}

// lease is one delivery taken for an attempt.
type lease struct {
	id, endpoint, typ, url string
	body                   []byte
	retryFrom              time.Time
	attempt                int
	secrets                []string
}

// Pass takes as many due deliveries as there is room for and starts their
// attempts; more is true when it took any (more may be due). Tests call it
// directly, then Wait.
func (d *Deliverer) Pass(ctx context.Context) (more bool, err error) {
	now := d.cfg.Clock.Now()
	d.mu.Lock()
	room := d.cfg.Concurrency - d.total
	for ep, until := range d.heldUntil {
		if !now.Before(until) {
			delete(d.heldUntil, ep)
		}
	}
	busy, counts := make([]string, 0, len(d.inFlight)), make([]int32, 0, len(d.inFlight))
	for ep, n := range d.inFlight {
		if _, held := d.heldUntil[ep]; !held {
			busy, counts = append(busy, ep), append(counts, int32(n))
		}
	}
	// A held endpoint counts as full, so the lease reads none of its rows.
	for ep := range d.heldUntil {
		busy, counts = append(busy, ep), append(counts, int32(d.cfg.PerEndpoint))
	}
	d.mu.Unlock()
	if room <= 0 {
		return false, nil
	}
	leases, err := d.lease(ctx, room, busy, counts)
	if err != nil {
		return false, err
	}
	d.start(leases)
	// Any taken: look again at once, for rows that came due meanwhile. None:
	// wait for a kick or the interval.
	return len(leases) > 0, nil
}

// lease takes up to room due deliveries, the oldest due first, of enabled
// endpoints, at most PerEndpoint in flight per endpoint counting those
// already in flight (busy, counts).
func (d *Deliverer) lease(ctx context.Context, room int, busy []string, counts []int32) (leases []lease, err error) {
	now := d.cfg.Clock.Now()
	// The lease: next_attempt_at moves past the attempt's end, so another
	// replica takes it only if this one dies before recording it.
	leaseFor := d.cfg.Timeout + 30*time.Second
	// Each enabled endpoint below its cap offers its oldest due rows, read
	// from its own end of the due index (at most MaxEndpoints probes): an
	// endpoint at its cap is not read at all, however long its backlog, nor
	// are disabled endpoints' rows, which Maintain ends. Rows another
	// replica's lease holds are skipped and the next ones read. Each offers
	// (and locks, until the statement ends) up to PerEndpoint or room,
	// whichever is less, a constant the planner can count on (a limit
	// computed per endpoint would be estimated at a tenth of the table, and
	// JIT-compiled); its share past those in flight is cut after.
	rows, err := d.cfg.DB.Query(ctx, `WITH busy AS (
			SELECT * FROM unnest($4::text[], $5::int[]) AS b(endpoint_id, n)
		), candidates AS (
			SELECT c.id, c.endpoint_id, c.next_attempt_at, coalesce(b.n, 0) AS busy FROM webhook_endpoints e
				LEFT JOIN busy b ON b.endpoint_id = e.id
				CROSS JOIN LATERAL (
					SELECT w.id, w.endpoint_id, w.next_attempt_at FROM webhook_deliveries w
					WHERE w.endpoint_id = e.id AND w.state = 'pending' AND w.next_attempt_at <= greatest(now(), $1)
					ORDER BY w.next_attempt_at LIMIT least($6::int, $2::int)
					FOR UPDATE OF w SKIP LOCKED
				) c
			WHERE e.enabled AND coalesce(b.n, 0) < $6
		), chosen AS (
			SELECT id FROM (SELECT id, next_attempt_at,
					busy + row_number() OVER (PARTITION BY endpoint_id ORDER BY next_attempt_at, id) AS nth FROM candidates) r
			WHERE nth <= $6
			ORDER BY next_attempt_at, id LIMIT $2
		)
		UPDATE webhook_deliveries w SET next_attempt_at = greatest(now(), $1) + $3::interval, attempts = w.attempts + 1
		FROM chosen c, webhook_endpoints e
		WHERE w.id = c.id AND e.id = w.endpoint_id AND e.enabled
		RETURNING w.id::text, w.endpoint_id, w.type, w.payload::text, coalesce(w.replayed_at, w.created_at), w.attempts,
			e.url, e.secret, CASE WHEN e.previous_secret_until > $1 THEN e.previous_secret END`,
		now, room, leaseFor, busy, counts, d.cfg.PerEndpoint)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var l lease
		var body string
		var previous *string
		var secret string
		if err := rows.Scan(&l.id, &l.endpoint, &l.typ, &body, &l.retryFrom, &l.attempt, &l.url, &secret, &previous); err != nil {
			return nil, err
		}
		l.body = []byte(body)
		l.secrets = []string{secret}
		if previous != nil {
			l.secrets = append(l.secrets, *previous)
		}
		leases = append(leases, l)
	}
	return leases, rows.Err()
}

// start counts the leases in flight and starts their attempts.
func (d *Deliverer) start(leases []lease) {
	d.mu.Lock()
	for _, l := range leases {
		d.inFlight[l.endpoint]++
		d.total++
		d.sends.Add(1)
	}
	d.mu.Unlock()
	for _, l := range leases {
		go d.attempt(l)
	}
}

// Wait waits for the attempts in flight to end and records them (tests).
func (d *Deliverer) Wait() {
	d.sends.Wait()
	if err := d.Flush(context.Background()); err != nil {
		d.log.Error("record webhook attempts", "err", err)
	}
}

// attempt sends one delivery and queues its outcome for the recorder. It
// runs to its end whatever Stop does: its own timeout bounds it.
func (d *Deliverer) attempt(l lease) {
	defer func() {
		d.mu.Lock()
		if d.inFlight[l.endpoint]--; d.inFlight[l.endpoint] == 0 {
			delete(d.inFlight, l.endpoint)
		}
		d.total--
		d.mu.Unlock()
		d.sends.Done()
		select {
		case d.freed <- struct{}{}:
		default:
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Timeout)
	res := d.send(ctx, l)
	cancel()
	if res.hold > 0 { // before its slot is freed, so no pass sends in between
		until := d.cfg.Clock.Now().Add(res.hold)
		d.mu.Lock()
		if until.After(d.heldUntil[l.endpoint]) {
			d.heldUntil[l.endpoint] = until
		}
		d.mu.Unlock()
	}
	d.cfg.Metrics.attempts.WithLabelValues(res.outcome).Inc()
	d.cfg.Metrics.duration.Observe(res.took.Seconds())
	d.queueRecord(attempted{l: l, r: res, at: d.cfg.Clock.Now()})
}
