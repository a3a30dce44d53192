package webhook

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/internal/startstop"
)

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
	// A 410 disables its endpoint even beside a success in the batch: the
	// receiver said it wants no more, whatever it answered a moment before.
	var disabling, reasons []string
	for _, ep := range slices.Sorted(maps.Keys(gone)) {
		disabling, reasons = append(disabling, ep), append(reasons, "the receiver answered 410 Gone")
	}
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
			if !gone[ep] && now.Sub(since) >= d.cfg.DisableAfter {
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
