package webhook

import (
	"context"
	"time"

	"github.com/spoolcast/spoolcast/internal/startstop"
)

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
