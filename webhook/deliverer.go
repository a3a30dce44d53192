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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
		inFlight: map[string]int{}, freed: make(chan struct{}, 1), recordKick: make(chan struct{}, 1),
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
	d.mu.Lock()
	room := d.cfg.Concurrency - d.total
	busy, counts := make([]string, 0, len(d.inFlight)), make([]int32, 0, len(d.inFlight))
	for ep, n := range d.inFlight {
		busy, counts = append(busy, ep), append(counts, int32(n))
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
	r.err = fmt.Sprintf("%d %s", resp.StatusCode, loggable(bytes.TrimSpace(excerpt)))
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		r.retryAfter = retryAfter(resp.Header.Get("Retry-After"), d.cfg.Clock.Now())
	}
	return r
}

// loggable is a receiver's answer as text Postgres takes: a NUL or invalid
// UTF-8 (a binary body, or one cut mid-character) would fail the whole
// recording transaction, every outcome in it.
func loggable(b []byte) string {
	return strings.ToValidUTF8(strings.ReplaceAll(string(b), "\x00", ""), "\uFFFD")
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

// recordBatch caps the attempts one recording transaction writes;
// maxUnrecorded caps the outcomes kept while recording fails. Past it the
// oldest are dropped: their leases send them again.
const (
	recordBatch   = 500
	maxUnrecorded = 20 * recordBatch
)

// queueRecord adds an attempt to the next recording and wakes the
// recorder. Recording many in one transaction is what lets one endpoint
// take thousands a second: the attempt's slot is free again once the
// receiver answered, not once Postgres committed. Until it is recorded its
// lease holds it.
func (d *Deliverer) queueRecord(a attempted) {
	a.l.body, a.l.secrets = nil, nil // not recorded: the backlog stays small
	d.recMu.Lock()
	d.toRecord = append(d.toRecord, a)
	d.recMu.Unlock()
	select {
	case d.recordKick <- struct{}{}:
	default:
	}
}

// recorder writes the queued attempts as they come, a batch at a time, and
// tries a failed recording again after a backoff: nothing else may come to
// kick it. It runs until Stop, whose final step records the rest.
func (d *Deliverer) recorder(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.recordKick:
		}
		for failures := 1; ; failures++ {
			err := d.Flush(ctx)
			if err == nil || ctx.Err() != nil {
				break
			}
			d.failLog.Do(func(suppressed int64) {
				d.log.Error("record webhook attempts; trying again", "err", err, "suppressed", suppressed)
			})
			if !startstop.Sleep(ctx, d.cfg.Clock, startstop.Backoff(failures, 100*time.Millisecond, 10*time.Second)) {
				return
			}
		}
	}
}

// Flush records every attempt that ended, in transactions of up to
// recordBatch. A batch whose recording failed goes back to the front, to
// be tried again, unless Postgres refused its data (retrying cannot help).
// Tests call it after Wait.
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
		if err == nil {
			continue
		}
		if refused(err) {
			d.log.Error("webhook attempts dropped: Postgres refused their record; they are sent again after their lease",
				"attempts", n, "err", err)
			return err
		}
		d.recMu.Lock()
		d.toRecord = append(batch, d.toRecord...)
		dropped := max(len(d.toRecord)-maxUnrecorded, 0)
		d.toRecord = d.toRecord[dropped:]
		d.recMu.Unlock()
		if dropped > 0 {
			d.log.Warn("webhook attempts not recorded for too long: the oldest dropped; they are sent again after their lease",
				"dropped", dropped, "kept", maxUnrecorded)
		}
		return err
	}
}

// refused says whether Postgres rejected the statement's data or a
// constraint (classes 22, 23), which the same batch would meet again; a lost
// connection, a timeout or a deadlock is worth retrying.
func refused(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (strings.HasPrefix(pg.Code, "22") || strings.HasPrefix(pg.Code, "23"))
}

// record writes attempts' outcomes in one transaction: the log rows, the
// deliveries' states, and the endpoints' health. It writes only what the
// batch is about, so that it stays short however large an endpoint's
// backlog: a disabled endpoint's pending deliveries are ended by Maintain.
func (d *Deliverer) record(ctx context.Context, batch []attempted) error {
	n := len(batch)
	ids, endpoints, states, errs := make([]string, n), make([]string, n), make([]string, n), make([]*string, n)
	ats, nexts, retryFroms := make([]time.Time, n), make([]time.Time, n), make([]time.Time, n)
	statuses, took, attempts := make([]*int32, n), make([]int32, n), make([]int32, n)
	byID := make(map[string]attempted, n)
	succeeded := map[string]bool{}
	failedAt := map[string]time.Time{}
	gone := map[string]bool{}
	lastErr := map[string]string{}
	for i, a := range batch {
		ids[i], endpoints[i], ats[i], took[i] = a.l.id, a.l.endpoint, a.at, int32(a.r.took.Milliseconds())
		attempts[i], retryFroms[i] = int32(a.l.attempt), a.l.retryFrom
		byID[a.l.id] = a
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
			continue
		}
		nexts[i] = a.at.Add(max(startstop.Backoff(a.l.attempt, minRetry, maxRetry), a.r.retryAfter))
		states[i] = "pending"
		if nexts[i].Sub(a.l.retryFrom) > d.cfg.RetryFor {
			states[i] = "failed"
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
	// The batch's endpoints are locked first, in id order, as Replay and
	// Delete lock an endpoint before its deliveries: another replica's
	// recording of the same endpoints waits here rather than deadlocking
	// against this one in the updates below.
	if _, err := tx.Exec(ctx, `SELECT id FROM webhook_endpoints WHERE id = ANY($1) ORDER BY id FOR UPDATE`, slices.Compact(slices.Sorted(slices.Values(endpoints)))); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO webhook_attempts (delivery_id, endpoint_id, attempted_at, status, error, duration_ms)
		SELECT * FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::int[], $5::text[], $6::int[])`,
		ids, endpoints, ats, statuses, errs, took); err != nil {
		return err
	}
	// An outcome applies to the run it was made in, not to one a replay
	// started meanwhile; and, but for a success (the receiver has it), only
	// to its own lease: a failure whose lease ran out must not move the
	// next attempt of the lease taken after it.
	rows, err := tx.Query(ctx, `UPDATE webhook_deliveries w SET state = u.state, next_attempt_at = u.next, last_attempt_at = u.at,
			last_status = u.status, last_error = u.error, ended_at = CASE WHEN u.state <> 'pending' THEN u.at END
		FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::int[], $6::text[], $7::int[], $8::timestamptz[])
			AS u(id, state, next, at, status, error, attempt, retry_from)
		WHERE w.id = u.id AND w.state = 'pending' AND coalesce(w.replayed_at, w.created_at) = u.retry_from
			AND (w.attempts = u.attempt OR u.state = 'delivered')
		RETURNING w.id::text, w.state`, ids, states, nexts, ats, statuses, errs, attempts, retryFroms)
	if err != nil {
		return err
	}
	var ended []attempted // by the state they ended in
	var endedStates []string
	for rows.Next() {
		var id, state string
		if err := rows.Scan(&id, &state); err != nil {
			rows.Close()
			return err
		}
		if state != "pending" {
			ended, endedStates = append(ended, byID[id]), append(endedStates, state)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
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
	var disabling, reasons []string
	now := d.cfg.Clock.Now()
	if len(down) > 0 {
		rows, err := tx.Query(ctx, `UPDATE webhook_endpoints e SET failing_since = coalesce(e.failing_since, u.since)
			FROM unnest($1::text[], $2::timestamptz[]) AS u(id, since) WHERE e.id = u.id AND e.enabled
			RETURNING e.id, e.failing_since`, down, downSince)
		if err != nil {
			return err
		}
		for rows.Next() {
			var ep string
			var since time.Time
			if err := rows.Scan(&ep, &since); err != nil {
				rows.Close()
				return err
			}
			switch {
			case gone[ep]:
				disabling, reasons = append(disabling, ep), append(reasons, "the receiver answered 410 Gone")
			case now.Sub(since) >= d.cfg.DisableAfter:
				disabling = append(disabling, ep)
				reasons = append(reasons, fmt.Sprintf("every attempt failed since %s; last: %s", since.UTC().Format(time.RFC3339), lastErr[ep]))
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	var disabled []string
	if len(disabling) > 0 {
		if disabled, err = disable(ctx, tx, disabling, reasons, now); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	for i, a := range ended {
		d.cfg.Metrics.ended.WithLabelValues(endedStates[i]).Inc()
		if endedStates[i] == "failed" {
			d.log.Warn("webhook delivery failed: retries ran out", "endpoint", a.l.endpoint, "delivery", a.l.id, "type", a.l.typ,
				"attempts", a.l.attempt, "last_error", a.r.err)
		}
	}
	for i, ep := range disabling {
		if slices.Contains(disabled, ep) {
			d.cfg.Metrics.disabled.Inc()
			d.log.Warn("webhook endpoint disabled; replay turns it back on", "endpoint", ep, "reason", reasons[i])
		}
	}
	if len(disabled) > 0 {
		select { // its pending deliveries end now, not at the next round
		case d.maintainKick <- struct{}{}:
		default:
		}
	}
	return nil
}

// disable turns endpoints off, each with its reason, and returns those it
// turned off. Their pending deliveries are no longer taken; Maintain ends
// them failed, a batch at a time, and replay sends them again.
func disable(ctx context.Context, tx pgx.Tx, endpoints, reasons []string, now time.Time) ([]string, error) {
	rows, err := tx.Query(ctx, `UPDATE webhook_endpoints e SET enabled = false, disabled_reason = u.reason, disabled_at = $3, updated_at = $3
		FROM unnest($1::text[], $2::text[]) AS u(id, reason) WHERE e.id = u.id AND e.enabled
		RETURNING e.id`, endpoints, reasons, now)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// maintain deletes what retention no longer keeps and refreshes the gauges.
func (d *Deliverer) maintain(ctx context.Context) {
	startstop.Every(ctx, startstop.Schedule{Interval: 15 * time.Second, Kick: d.maintainKick, Clock: d.cfg.Clock}, func(ctx context.Context) bool {
		more, err := d.Maintain(ctx)
		if err != nil && ctx.Err() == nil {
			d.failLog.Do(func(suppressed int64) {
				d.log.Error("webhook retention and gauges; trying again", "err", err, "suppressed", suppressed)
			})
		}
		return more && err == nil
	})
}

// endpointsOf is a recursive query's eps(id): the endpoint ids of table's
// rows t that match where, found by skipping along an index led by
// endpoint_id, one probe per endpoint, not by reading the rows. Its last row
// is NULL.
func endpointsOf(table, where string) string {
	return `eps(id) AS (
		(SELECT endpoint_id FROM ` + table + ` t WHERE ` + where + ` ORDER BY endpoint_id LIMIT 1)
		UNION ALL
		SELECT (SELECT endpoint_id FROM ` + table + ` t WHERE ` + where + ` AND t.endpoint_id > eps.id ORDER BY endpoint_id LIMIT 1)
		FROM eps WHERE eps.id IS NOT NULL)`
}

// retentionBatch caps the rows one maintenance statement deletes or ends.
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
	// A deleted endpoint's deliveries and log go here, a batch at a time.
	// Its id is found by skipping along the endpoint indexes, one probe per
	// endpoint, not by reading the tables.
	for _, table := range []string{"webhook_deliveries", "webhook_attempts"} {
		tag, err = d.cfg.DB.Exec(ctx, `WITH RECURSIVE `+endpointsOf(table, "true")+`,
			gone AS (SELECT id FROM eps WHERE id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = eps.id))
			DELETE FROM `+table+` WHERE id IN (SELECT id FROM `+table+` WHERE endpoint_id IN (SELECT id FROM gone) LIMIT $1)`, retentionBatch)
		if err != nil {
			return false, err
		}
		more = more || tag.RowsAffected() == retentionBatch
	}
	// A disabled endpoint's pending deliveries end here, a batch at a time,
	// as do those a trigger wrote while the endpoint was being disabled or
	// deleted (it read the endpoint before that committed). The endpoints
	// with pending rows are found by skipping along the due index, one probe
	// each, so that with none to end this reads no backlog.
	tag, err = d.cfg.DB.Exec(ctx, `WITH RECURSIVE `+endpointsOf("webhook_deliveries", "t.state = 'pending'")+`,
			off AS (SELECT id FROM eps WHERE id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = eps.id AND e.enabled))
		UPDATE webhook_deliveries w SET state = 'failed', ended_at = $1,
			last_error = coalesce(w.last_error || '; ', '') || 'endpoint disabled'
		WHERE w.id IN (SELECT id FROM webhook_deliveries p WHERE p.state = 'pending' AND p.endpoint_id IN (SELECT id FROM off)
				LIMIT $2 FOR UPDATE SKIP LOCKED)
			AND w.state = 'pending'`, now, retentionBatch)
	if err != nil {
		return false, err
	}
	d.cfg.Metrics.ended.WithLabelValues("failed").Add(float64(tag.RowsAffected()))
	more = more || tag.RowsAffected() == retentionBatch
	// Stages by the attempts recorded, not attempts (counted at the lease):
	// a first attempt in flight is still new, not a receiver failing.
	var age float64
	var fresh, retrying, healthy, failing, disabled int64
	err = d.cfg.DB.QueryRow(ctx, `SELECT
			coalesce((SELECT extract(epoch FROM $1 - min(coalesce(replayed_at, created_at))) FROM webhook_deliveries WHERE state = 'pending' AND attempts = 0), 0),
			(SELECT count(*) FROM webhook_deliveries WHERE state = 'pending' AND last_attempt_at IS NULL),
			(SELECT count(*) FROM webhook_deliveries WHERE state = 'pending' AND last_attempt_at IS NOT NULL),
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
