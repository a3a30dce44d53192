package webhook

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

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
	DefaultPerEndpoint  = 4
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
	// Client sends the deliveries. Default Client(Timeout, AllowPrivate).
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
		cfg.Client = Client(cfg.Timeout, cfg.AllowPrivate)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Deliverer{cfg: cfg, log: cfg.Logger.With("component", "webhook"), failLog: lograte.New(10 * time.Second),
		inFlight: map[string]int{}, freed: make(chan struct{}, 1)}, nil
}

// Start runs the deliverer in the background.
func (d *Deliverer) Start(ctx context.Context) {
	d.svc.Start(ctx, d.loop, d.maintain)
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
		return nil
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
	d.mu.Lock()
	room := d.cfg.Concurrency - d.total
	busy := make([]string, 0, len(d.inFlight))
	counts := make([]int32, 0, len(d.inFlight))
	for ep, n := range d.inFlight {
		busy, counts = append(busy, ep), append(counts, int32(n))
	}
	d.mu.Unlock()
	if room <= 0 {
		return false, nil // a send ending kicks the loop
	}
	now := d.cfg.Clock.Now()
	// The lease: next_attempt_at moves past the attempt's end, so another
	// replica takes it only if this one dies before recording it.
	leaseFor := d.cfg.Timeout + 30*time.Second
	rows, err := d.cfg.DB.Query(ctx, `WITH candidates AS (
			SELECT id, endpoint_id, next_attempt_at FROM webhook_deliveries
			WHERE state = 'pending' AND next_attempt_at <= greatest(now(), $1)
			ORDER BY next_attempt_at LIMIT $2 * 4 FOR UPDATE SKIP LOCKED
		), busy AS (
			SELECT * FROM unnest($4::text[], $5::int[]) AS b(endpoint_id, n)
		), chosen AS (
			SELECT c.id FROM (SELECT id, endpoint_id, next_attempt_at,
					row_number() OVER (PARTITION BY endpoint_id ORDER BY next_attempt_at, id) AS n FROM candidates) c
				LEFT JOIN busy b USING (endpoint_id)
			WHERE c.n + coalesce(b.n, 0) <= $6
			ORDER BY c.next_attempt_at LIMIT $2
		)
		UPDATE webhook_deliveries w SET next_attempt_at = greatest(now(), $1) + $3::interval, attempts = w.attempts + 1
		FROM chosen c, webhook_endpoints e
		WHERE w.id = c.id AND e.id = w.endpoint_id AND e.enabled
		RETURNING w.id::text, w.endpoint_id, w.type, w.payload::text, coalesce(w.replayed_at, w.created_at), w.attempts,
			e.url, e.secret, CASE WHEN e.previous_secret_until > $1 THEN e.previous_secret END`,
		now, room, leaseFor, busy, counts, d.cfg.PerEndpoint)
	if err != nil {
		return false, err
	}
	var leases []lease
	for rows.Next() {
		var l lease
		var body, secret string
		var previous *string
		if err := rows.Scan(&l.id, &l.endpoint, &l.typ, &body, &l.retryFrom, &l.attempt, &l.url, &secret, &previous); err != nil {
			rows.Close()
			return false, err
		}
		l.body = []byte(body)
		l.secrets = []string{secret}
		if previous != nil {
			l.secrets = append(l.secrets, *previous)
		}
		leases = append(leases, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, err
	}
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
	// Any taken: look again at once, for other endpoints' rows or the ones
	// past this pass's per-endpoint share. None: wait for a kick or the interval.
	return len(leases) > 0, nil
}

// Wait waits for the attempts in flight to be recorded (tests).
func (d *Deliverer) Wait() { d.sends.Wait() }

// attempt sends one delivery and records what became of it. It runs to
// its end whatever Stop does: its own timeout bounds it.
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
	d.cfg.Metrics.attempts.WithLabelValues(res.outcome).Inc()
	d.cfg.Metrics.duration.Observe(res.took.Seconds())
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.record(ctx, l, res); err != nil {
		d.failLog.Do(func(suppressed int64) {
			d.log.Error("record a webhook attempt; it is sent again after its lease", "endpoint", l.endpoint, "delivery", l.id, "err", err, "suppressed", suppressed)
		})
	}
}

// result is what one attempt came to.
type result struct {
	outcome    string
	status     int
	err        string
	retryAfter time.Duration
	took       time.Duration
}

// send makes one attempt: a POST of the body with the three Standard
// Webhooks headers, signed at the attempt's own time.
func (d *Deliverer) send(ctx context.Context, l lease) result {
	start := time.Now()
	ts := d.cfg.Clock.Now().Unix()
	sig, err := Sign(l.secrets, l.id, ts, l.body)
	if err != nil {
		return result{outcome: OutcomeClient, err: err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.url, bytes.NewReader(l.body))
	if err != nil {
		return result{outcome: OutcomeNetwork, err: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "spoolcast-webhooks/1")
	req.Header.Set("webhook-id", l.id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := d.cfg.Client.Do(req)
	took := time.Since(start)
	if err != nil {
		r := result{outcome: OutcomeNetwork, err: err.Error(), took: took}
		switch {
		case errors.Is(err, ErrPrivateTarget):
			r.outcome = OutcomeRefused
		case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
			r.outcome, r.err = OutcomeTimeout, fmt.Sprintf("no answer within %s", d.cfg.Timeout)
		}
		return r
	}
	excerpt, _ := io.ReadAll(io.LimitReader(resp.Body, bodyExcerpt))
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	resp.Body.Close()
	r := result{status: resp.StatusCode, took: took}
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		r.outcome = OutcomeDelivered
		return r
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		r.outcome = OutcomeRedirect
		r.err = fmt.Sprintf("%d redirect to %q not followed", resp.StatusCode, resp.Header.Get("Location"))
		return r
	case resp.StatusCode < 500:
		r.outcome = OutcomeClient
	default:
		r.outcome = OutcomeServer
	}
	r.err = fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(excerpt))
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		r.retryAfter = retryAfter(resp.Header.Get("Retry-After"), d.cfg.Clock.Now())
	}
	return r
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// retryAfter reads a Retry-After header, seconds or an HTTP date; 0 when
// absent or unreadable. It is capped at maxRetryAfter.
func retryAfter(h string, now time.Time) time.Duration {
	if h == "" {
		return 0
	}
	var d time.Duration
	if secs, err := strconv.ParseInt(h, 10, 64); err == nil && secs > 0 {
		d = time.Duration(min(secs, int64(maxRetryAfter/time.Second))) * time.Second
	} else if t, err := http.ParseTime(h); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), maxRetryAfter)
}

// record writes an attempt's outcome in one transaction: the log row, the
// delivery's state, and the endpoint's health.
func (d *Deliverer) record(ctx context.Context, l lease, r result) error {
	now := d.cfg.Clock.Now()
	tx, err := d.cfg.DB.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	var status *int
	if r.status != 0 {
		status = &r.status
	}
	var errText *string
	if r.err != "" {
		errText = &r.err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO webhook_attempts (delivery_id, endpoint_id, attempted_at, status, error, duration_ms)
		VALUES ($1, $2, $3, $4, $5, $6)`, l.id, l.endpoint, now, status, errText, r.took.Milliseconds()); err != nil {
		return err
	}
	if r.outcome == OutcomeDelivered {
		if _, err := tx.Exec(ctx, `UPDATE webhook_deliveries SET state = 'delivered', ended_at = $2, last_attempt_at = $2,
			last_status = $3, last_error = NULL WHERE id = $1 AND state = 'pending'`, l.id, now, status); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE webhook_endpoints SET failing_since = NULL WHERE id = $1 AND failing_since IS NOT NULL`, l.endpoint); err != nil {
			return err
		}
		d.cfg.Metrics.ended.WithLabelValues("delivered").Inc()
		return tx.Commit(ctx)
	}
	wait := max(startstop.Backoff(l.attempt, minRetry, maxRetry), r.retryAfter)
	next := now.Add(wait)
	state := "pending"
	if next.Sub(l.retryFrom) > d.cfg.RetryFor {
		state = "failed"
	}
	if _, err := tx.Exec(ctx, `UPDATE webhook_deliveries SET state = $2, next_attempt_at = $3, last_attempt_at = $4,
			last_status = $5, last_error = $6, ended_at = CASE WHEN $2 = 'failed' THEN $4::timestamptz END
		WHERE id = $1 AND state = 'pending'`, l.id, state, next, now, status, errText); err != nil {
		return err
	}
	if state == "failed" {
		d.cfg.Metrics.ended.WithLabelValues("failed").Inc()
		d.log.Warn("webhook delivery failed: retries ran out", "endpoint", l.endpoint, "delivery", l.id, "type", l.typ,
			"attempts", l.attempt, "last_error", r.err)
	}
	var failingSince time.Time
	if err := tx.QueryRow(ctx, `UPDATE webhook_endpoints SET failing_since = coalesce(failing_since, $2)
		WHERE id = $1 RETURNING failing_since`, l.endpoint, now).Scan(&failingSince); err != nil {
		return err
	}
	// 410 Gone is the receiver saying it wants no more (Standard Webhooks).
	var reason string
	switch {
	case r.status == http.StatusGone:
		reason = "the receiver answered 410 Gone"
	case now.Sub(failingSince) >= d.cfg.DisableAfter:
		reason = fmt.Sprintf("every attempt failed since %s; last: %s", failingSince.UTC().Format(time.RFC3339), r.err)
	}
	if reason != "" {
		if err := disable(ctx, tx, l.endpoint, reason, now); err != nil {
			return err
		}
		d.cfg.Metrics.disabled.Inc()
		d.log.Warn("webhook endpoint disabled; replay turns it back on", "endpoint", l.endpoint, "reason", reason)
	}
	return tx.Commit(ctx)
}

// disable turns an endpoint off and ends its pending deliveries failed;
// replay sends them again.
func disable(ctx context.Context, tx pgx.Tx, endpoint, reason string, now time.Time) error {
	if _, err := tx.Exec(ctx, `UPDATE webhook_endpoints SET enabled = false, disabled_reason = $2, disabled_at = $3, updated_at = $3
		WHERE id = $1 AND enabled`, endpoint, reason, now); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE webhook_deliveries SET state = 'failed', ended_at = $2,
			last_error = coalesce(last_error || '; ', '') || 'endpoint disabled'
		WHERE endpoint_id = $1 AND state = 'pending'`, endpoint, now)
	return err
}

// maintain deletes what retention no longer keeps and refreshes the gauges.
func (d *Deliverer) maintain(ctx context.Context) {
	startstop.Every(ctx, startstop.Schedule{Interval: 15 * time.Second, Clock: d.cfg.Clock}, func(ctx context.Context) bool {
		more, err := d.Maintain(ctx)
		if err != nil && ctx.Err() == nil {
			d.failLog.Do(func(suppressed int64) {
				d.log.Error("webhook retention and gauges; trying again", "err", err, "suppressed", suppressed)
			})
		}
		return more && err == nil
	})
}

// retentionBatch caps the rows one retention statement deletes.
const retentionBatch = 5000

// Maintain runs one step of retention and refreshes the gauges; more is
// true when a batch was full.
func (d *Deliverer) Maintain(ctx context.Context) (more bool, err error) {
	now := d.cfg.Clock.Now()
	cutoff := now.Add(-d.cfg.Retention)
	tag, err := d.cfg.DB.Exec(ctx, `DELETE FROM webhook_deliveries WHERE id IN (
		SELECT id FROM webhook_deliveries WHERE created_at < $1 AND state <> 'pending'
			AND coalesce(replayed_at, created_at) < $1 LIMIT $2)`, cutoff, retentionBatch)
	if err != nil {
		return false, err
	}
	more = tag.RowsAffected() == retentionBatch
	tag, err = d.cfg.DB.Exec(ctx, `DELETE FROM webhook_attempts WHERE id IN (
		SELECT id FROM webhook_attempts WHERE attempted_at < $1 ORDER BY attempted_at LIMIT $2)`, cutoff, retentionBatch)
	if err != nil {
		return false, err
	}
	more = more || tag.RowsAffected() == retentionBatch
	// A delivery its trigger wrote while the endpoint was being disabled or
	// deleted (it read the endpoint before that committed) ends here.
	if _, err := d.cfg.DB.Exec(ctx, `UPDATE webhook_deliveries w SET state = 'failed', ended_at = $1, last_error = 'endpoint disabled'
		WHERE state = 'pending' AND NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = w.endpoint_id AND e.enabled)`, now); err != nil {
		return false, err
	}
	var age float64
	var fresh, retrying, healthy, failing, disabled int64
	err = d.cfg.DB.QueryRow(ctx, `SELECT
			coalesce((SELECT extract(epoch FROM $1 - min(coalesce(replayed_at, created_at))) FROM webhook_deliveries WHERE state = 'pending' AND attempts = 0), 0),
			(SELECT count(*) FROM webhook_deliveries WHERE state = 'pending' AND attempts = 0),
			(SELECT count(*) FROM webhook_deliveries WHERE state = 'pending' AND attempts > 0),
			count(*) FILTER (WHERE enabled AND failing_since IS NULL),
			count(*) FILTER (WHERE enabled AND failing_since IS NOT NULL),
			count(*) FILTER (WHERE NOT enabled)
		FROM webhook_endpoints`, now).Scan(&age, &fresh, &retrying, &healthy, &failing, &disabled)
	if err != nil {
		return more, err
	}
	m := d.cfg.Metrics
	m.age.Set(max(age, 0))
	m.pending.WithLabelValues("new").Set(float64(fresh))
	m.pending.WithLabelValues("retrying").Set(float64(retrying))
	m.endpoints.WithLabelValues("healthy").Set(float64(healthy))
	m.endpoints.WithLabelValues("failing").Set(float64(failing))
	m.endpoints.WithLabelValues("disabled").Set(float64(disabled))
	return more, nil
}
