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

	recMu      sync.Mutex
	toRecord   []attempted   // attempts ended, not yet recorded
	recordKick chan struct{} // toRecord grew
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
		inFlight: map[string]int{}, freed: make(chan struct{}, 1), recordKick: make(chan struct{}, 1)}, nil
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
	d.cfg.Metrics.attempts.WithLabelValues(res.outcome).Inc()
	d.cfg.Metrics.duration.Observe(res.took.Seconds())
	d.queueRecord(attempted{l: l, r: res, at: d.cfg.Clock.Now()})
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

// attempted is an attempt's outcome, waiting to be recorded.
type attempted struct {
	l  lease
	r  result
	at time.Time
}

// recordBatch caps the attempts one recording transaction writes.
const recordBatch = 500

// queueRecord adds an attempt to the next recording and wakes the
// recorder. Recording many in one transaction is what lets one endpoint
// take thousands a second: the attempt's slot is free again once the
// receiver answered, not once Postgres committed. Until it is recorded its
// lease holds it.
func (d *Deliverer) queueRecord(a attempted) {
	d.recMu.Lock()
	d.toRecord = append(d.toRecord, a)
	d.recMu.Unlock()
	select {
	case d.recordKick <- struct{}{}:
	default:
	}
}

// recorder writes the queued attempts as they come, a batch at a time. It
// runs until Stop, whose final step records the rest.
func (d *Deliverer) recorder(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.recordKick:
		}
		if err := d.Flush(ctx); err != nil && ctx.Err() == nil {
			d.failLog.Do(func(suppressed int64) {
				d.log.Error("record webhook attempts; they are sent again after their lease", "err", err, "suppressed", suppressed)
			})
		}
	}
}

// Flush records every attempt that ended, in transactions of up to
// recordBatch. Tests call it after Wait.
func (d *Deliverer) Flush(ctx context.Context) error {
	for {
		d.recMu.Lock()
		n := min(len(d.toRecord), recordBatch)
		batch := d.toRecord[:n:n]
		d.toRecord = d.toRecord[n:]
		d.recMu.Unlock()
		if n == 0 {
			return nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := d.record(rctx, batch)
		cancel()
		if err != nil {
			return err
		}
	}
}

// record writes attempts' outcomes in one transaction: the log rows, the
// deliveries' states, and the endpoints' health.
func (d *Deliverer) record(ctx context.Context, batch []attempted) error {
	n := len(batch)
	ids, endpoints, states, errs := make([]string, n), make([]string, n), make([]string, n), make([]*string, n)
	ats, nexts := make([]time.Time, n), make([]time.Time, n)
	statuses, took := make([]*int32, n), make([]int32, n)
	succeeded := map[string]bool{}
	failedAt := map[string]time.Time{}
	gone := map[string]bool{}
	lastErr := map[string]string{}
	ended := map[string]int{}
	for i, a := range batch {
		ids[i], endpoints[i], ats[i], took[i] = a.l.id, a.l.endpoint, a.at, int32(a.r.took.Milliseconds())
		if a.r.status != 0 {
			st := int32(a.r.status)
			statuses[i] = &st
		}
		if a.r.err != "" {
			e := a.r.err
			errs[i] = &e
		}
		if a.r.outcome == OutcomeDelivered {
			states[i], nexts[i] = "delivered", a.at
			succeeded[a.l.endpoint] = true
			ended["delivered"]++
			continue
		}
		nexts[i] = a.at.Add(max(startstop.Backoff(a.l.attempt, minRetry, maxRetry), a.r.retryAfter))
		states[i] = "pending"
		if nexts[i].Sub(a.l.retryFrom) > d.cfg.RetryFor {
			states[i] = "failed"
			ended["failed"]++
			d.log.Warn("webhook delivery failed: retries ran out", "endpoint", a.l.endpoint, "delivery", a.l.id, "type", a.l.typ,
				"attempts", a.l.attempt, "last_error", a.r.err)
		}
		if t, ok := failedAt[a.l.endpoint]; !ok || a.at.Before(t) {
			failedAt[a.l.endpoint] = a.at
		}
		lastErr[a.l.endpoint] = a.r.err
		// 410 Gone is the receiver saying it wants no more (Standard Webhooks).
		if a.r.status == http.StatusGone {
			gone[a.l.endpoint] = true
		}
	}
	tx, err := d.cfg.DB.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO webhook_attempts (delivery_id, endpoint_id, attempted_at, status, error, duration_ms)
		SELECT * FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::int[], $5::text[], $6::int[])`,
		ids, endpoints, ats, statuses, errs, took); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE webhook_deliveries w SET state = u.state, next_attempt_at = u.next, last_attempt_at = u.at,
			last_status = u.status, last_error = u.error, ended_at = CASE WHEN u.state <> 'pending' THEN u.at END
		FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::int[], $6::text[]) AS u(id, state, next, at, status, error)
		WHERE w.id = u.id AND w.state = 'pending'`, ids, states, nexts, ats, statuses, errs); err != nil {
		return err
	}
	// A receiver that took any of the batch is up; one that took none of
	// it has been failing since its first failure, unless it was already.
	var up, down []string
	var downSince []time.Time
	for ep := range succeeded {
		up = append(up, ep)
	}
	for ep, at := range failedAt {
		if !succeeded[ep] {
			down, downSince = append(down, ep), append(downSince, at)
		}
	}
	if len(up) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE webhook_endpoints SET failing_since = NULL WHERE id = ANY($1) AND failing_since IS NOT NULL`, up); err != nil {
			return err
		}
	}
	type disabling struct{ endpoint, reason string }
	var disabled []disabling
	if len(down) > 0 {
		rows, err := tx.Query(ctx, `UPDATE webhook_endpoints e SET failing_since = coalesce(e.failing_since, u.since)
			FROM unnest($1::text[], $2::timestamptz[]) AS u(id, since) WHERE e.id = u.id AND e.enabled
			RETURNING e.id, e.failing_since`, down, downSince)
		if err != nil {
			return err
		}
		now := d.cfg.Clock.Now()
		for rows.Next() {
			var ep string
			var since time.Time
			if err := rows.Scan(&ep, &since); err != nil {
				rows.Close()
				return err
			}
			switch {
			case gone[ep]:
				disabled = append(disabled, disabling{ep, "the receiver answered 410 Gone"})
			case now.Sub(since) >= d.cfg.DisableAfter:
				disabled = append(disabled, disabling{ep, fmt.Sprintf("every attempt failed since %s; last: %s", since.UTC().Format(time.RFC3339), lastErr[ep])})
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, x := range disabled {
			if err := disable(ctx, tx, x.endpoint, x.reason, now); err != nil {
				return err
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	for state, n := range ended {
		d.cfg.Metrics.ended.WithLabelValues(state).Add(float64(n))
	}
	for _, x := range disabled {
		d.cfg.Metrics.disabled.Inc()
		d.log.Warn("webhook endpoint disabled; replay turns it back on", "endpoint", x.endpoint, "reason", x.reason)
	}
	return nil
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
