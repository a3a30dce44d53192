package push

// This file holds the push queue's leases: a pass's claim and its token,
// giving rows back, and the sweep of leases left by passes that ended.

import (
	"github.com/spoolcast/spoolcast/push/policy"

	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

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

// claim leases up to BatchSize queue rows no one holds, with their
// notifications' text, under the pass's token: the due direct rows first,
// oldest first, then a broadcast's (a topic fan-out's), so that direct
// pushes never wait behind a broadcast's hundreds of thousands. A row
// claimed before keeps claimed_by when it is given back or its lease runs
// out: that is how a dispatcher knows it was retaken.
func (d *Dispatcher) claim(ctx context.Context, token string) ([]queued, error) {
	direct, err := d.claimLane(ctx, claimDirectSQL, token, d.cfg.BatchSize, false)
	if err != nil || len(direct) == d.cfg.BatchSize {
		return direct, err
	}
	broadcast, err := d.claimLane(ctx, claimBroadcastSQL, token, d.cfg.BatchSize-len(direct), true)
	if err != nil && ctx.Err() == nil {
		// The direct rows are claimed: sent now, the broadcast's next pass.
		d.log.Warn("claim a broadcast's pushes", "err", err)
	}
	return append(direct, broadcast...), nil
}

// The claim of each lane: the direct one reads its own partial index
// (migration 24), so that due broadcast rows ahead of it cost nothing.
var (
	claimDirectSQL    = fmt.Sprintf(claimSQL, "NOT broadcast")
	claimBroadcastSQL = fmt.Sprintf(claimSQL, "broadcast")
)

const claimSQL = `WITH c AS (
			UPDATE push_queue q SET claimed_until = now() + $3::interval, claimed_by = $2
			FROM (SELECT notification_id, claimed_by FROM push_queue
			      WHERE %s AND due_at <= greatest(now(), $4) AND (claimed_until IS NULL OR claimed_until < now())
			      ORDER BY due_at, notification_id LIMIT $1 FOR UPDATE SKIP LOCKED) t
			WHERE q.notification_id = t.notification_id
			RETURNING q.notification_id, q.notification_created_at, q.enqueued_at, q.user_id, q.category,
			          t.claimed_by IS NOT NULL AS retaken, q.due_at, q.priority, q.digest_key, q.digest_window, q.digest_count, q.seen_waited, q.decided
		)
		SELECT c.notification_id, coalesce(c.notification_created_at, '-infinity'), c.enqueued_at, c.user_id, c.category,
		       coalesce(n.title, ''), coalesce(n.body, ''), c.retaken, c.due_at, c.priority, coalesce(c.digest_key, ''),
		       coalesce(extract(epoch FROM c.digest_window), 0)::int8, coalesce(c.digest_count, 0), c.seen_waited, c.decided
		FROM c LEFT JOIN LATERAL (
			-- One probe of the primary key per claimed row (LIMIT keeps
			-- the planner from joining the whole week's partition by hash:
			-- it did, 6 ms a claim at 4,000 rows and growing with them).
			SELECT n.title, n.body FROM notifications n
			WHERE n.id = c.notification_id AND n.created_at = c.notification_created_at LIMIT 1) n ON true
		ORDER BY c.due_at, c.notification_id`

// claimLane claims up to n due rows of one lane (claimDirectSQL or
// claimBroadcastSQL).
func (d *Dispatcher) claimLane(ctx context.Context, sql, token string, n int, broadcast bool) ([]queued, error) {
	// Rows are due when either clock says so: Postgres's (rows queued by
	// ingest) or the dispatcher's (rows deferred to a time it computed).
	rows, err := d.cfg.DB.Query(ctx, sql, n, token, d.cfg.Lease, d.cfg.Clock.Now())
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
			q.title, q.body = policy.DigestTitle(q.digestCount, q.digestKey), q.title
		}
		q.claimedBy, q.broadcast = token, broadcast
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
