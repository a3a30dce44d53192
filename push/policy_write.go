package push

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/internal/weekly"
	"github.com/spoolcast/spoolcast/push/policy"
)

// plan is what a pass decided for the notifications it took, before the
// throttle's counters are read: it is written in one transaction (write).
type plan struct {
	rows       []dispatchRow // written as they are
	deferrals  []deferral    // quiet hours: back to the queue, due later
	members    []*queued     // join their digests
	candidates []candidate   // pushes the throttle decides
	counts     map[string]int
}

type deferral struct {
	q   *queued
	end time.Time
	// seenWait: held for its user to see it, not for quiet hours: not
	// logged, and not held for that again.
	seenWait bool
}

type candidate struct {
	q     *queued
	sends []dispatchRow
}

// decide records what the policies decided for a notification that would
// be pushed to sends.
func (p *plan) decide(q *queued, sends []dispatchRow, quiet policy.QuietHours, now time.Time, quietFailed bool, th policy.Throttle, seen policy.Seen) {
	d := policy.Decide(q.policyPush(), quiet, quietFailed, th, seen, now)
	p.record(q, sends, d)
}

// deferInQuiet defers a push given back after it was decided, if quiet
// hours hold it now (policy.DeferInQuiet).
func (p *plan) deferInQuiet(q *queued, quiet policy.QuietHours, now time.Time) bool {
	d, ok := policy.DeferInQuiet(q.policyPush(), quiet, now)
	if ok {
		p.record(q, nil, d)
	}
	return ok
}

// record adds a decision to the plan.
func (p *plan) record(q *queued, sends []dispatchRow, d policy.Decision) {
	if p.counts == nil {
		p.counts = map[string]int{}
	}
	if d.Outcome != "" {
		p.counts[d.Outcome]++
	}
	if d.FailOpen {
		p.counts[policy.FailOpen]++
	}
	switch d.Action {
	case policy.Gather:
		p.members = append(p.members, q)
	case policy.Suppress:
		why := "seen on the stream or read before its push was due (--push-suppress-if-seen)"
		if d.Done {
			why = "read or archived before its push was due: a banner for it would never be cleared"
		}
		p.rows = append(p.rows, dispatchRow{n: q, state: StateSuppressed, err: &why})
	case policy.Hold:
		p.deferrals = append(p.deferrals, deferral{q: q, end: d.Until, seenWait: true})
	case policy.Defer:
		p.deferrals = append(p.deferrals, deferral{q: q, end: d.Until})
	case policy.Cap:
		p.candidates = append(p.candidates, candidate{q: q, sends: sends})
	default:
		p.rows = append(p.rows, sends...)
	}
}

// count adds the plan's outcomes to the policy metric, once it is written.
func (p *plan) count(m *Metrics) {
	for outcome, n := range p.counts {
		m.CountPolicy(outcome, n)
	}
}

// write writes a pass's plan in one transaction: the throttle's counters
// and its decisions, the deferrals, the digests joined, and the dispatches
// (create). Either all of it commits or none: a crash repeats nothing, and
// a throttle never counts a push that was not written. It returns the
// queued dispatches to send.
func (d *Dispatcher) write(ctx context.Context, claimed []queued, p *plan, now time.Time) ([]created, error) {
	run := func() ([]created, error) {
		tx, err := d.cfg.DB.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		token := claimed[0].claimedBy
		rows := p.rows
		if len(p.candidates) > 0 {
			decided, err := d.throttle(ctx, tx, p, now)
			if err != nil {
				return nil, fmt.Errorf("count the throttle: %w", err)
			}
			rows = append(rows[:len(rows):len(rows)], decided...)
		}
		if err := deferPushes(ctx, tx, token, p.deferrals); err != nil {
			return nil, fmt.Errorf("defer pushes to the end of quiet hours: %w", err)
		}
		if err := joinDigests(ctx, tx, token, p.members, now); err != nil {
			return nil, fmt.Errorf("join digests: %w", err)
		}
		out, err := create(ctx, tx, claimed, rows)
		if err != nil {
			return nil, err
		}
		return out, tx.Commit(ctx)
	}
	out, err := run()
	if weekly.NoPartition(err) {
		if _, err = weekly.Ensure(ctx, d.cfg.DB, "push_dispatches", time.Time{}); err == nil {
			out, err = run()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("write dispatches: %w", err)
	}
	return out, nil
}

// throttle counts the candidates against their (user, category) window and
// returns their dispatch rows: the first pushes of a window up to the limit
// are sent, the rest recorded throttled. The counter counts every candidate,
// so once over the limit it stays over for the window.
func (d *Dispatcher) throttle(ctx context.Context, tx pgx.Tx, p *plan, now time.Time) ([]dispatchRow, error) {
	th := d.cfg.Throttle
	window := now.Truncate(th.Window)
	users := make([]string, len(p.candidates))
	categories := make([]string, len(p.candidates))
	for i, c := range p.candidates {
		users[i], categories[i] = c.q.user, c.q.category
	}
	res, err := tx.Query(ctx, `INSERT INTO push_throttles (user_id, category, window_start, count)
		SELECT user_id, category, $3, count(*) FROM unnest($1::text[], $2::text[]) AS t(user_id, category) GROUP BY 1, 2
		ON CONFLICT (user_id, category, window_start) DO UPDATE SET count = push_throttles.count + EXCLUDED.count
		RETURNING user_id, category, count`, users, categories, window)
	if err != nil {
		return nil, err
	}
	type group struct{ user, category string }
	total := map[group]int{}
	for res.Next() {
		var g group
		var n int
		if err := res.Scan(&g.user, &g.category, &n); err != nil {
			res.Close()
			return nil, err
		}
		total[g] = n
	}
	res.Close()
	if err := res.Err(); err != nil {
		return nil, err
	}
	inPass := map[group]int{}
	for _, c := range p.candidates {
		inPass[group{c.q.user, c.q.category}]++
	}
	seen := map[group]int{}
	var rows []dispatchRow
	for _, c := range p.candidates {
		g := group{c.q.user, c.q.category}
		before := total[g] - inPass[g] // counted by earlier passes in this window
		if before+seen[g] < th.Limit {
			rows = append(rows, c.sends...)
			p.counts[policy.SentOutcome(c.q.policyPush(), false)]++
		} else {
			why := fmt.Sprintf("over --push-throttle %s for category %q", th, c.q.category)
			rows = append(rows, dispatchRow{n: c.q, state: StateThrottled, err: &why})
			p.counts[policy.Throttled]++
		}
		seen[g]++
	}
	return rows, nil
}

// deferPushes puts notifications back in the queue, due at the end of their
// quiet hours and free for any dispatcher then, and records each deferral
// in the delivery log. A row deferred is not retaken: when it comes back,
// its policies are decided again.
func deferPushes(ctx context.Context, tx pgx.Tx, token string, deferrals []deferral) error {
	if len(deferrals) == 0 {
		return nil
	}
	ids := make([]int64, len(deferrals))
	ends := make([]time.Time, len(deferrals))
	whys := make([]string, len(deferrals))
	seenWaits := make([]bool, len(deferrals))
	for i, df := range deferrals {
		ids[i], ends[i], seenWaits[i] = df.q.id, df.end, df.seenWait
		whys[i] = "quiet hours until " + df.end.Format(time.RFC3339)
	}
	_, err := tx.Exec(ctx, `WITH moved AS (
			UPDATE push_queue q SET due_at = u.due, claimed_until = NULL, claimed_by = NULL, seen_waited = q.seen_waited OR u.seen_wait
			FROM unnest($1::int8[], $2::timestamptz[], $3::text[], $5::bool[]) AS u(id, due, why, seen_wait)
			WHERE q.notification_id = u.id AND q.claimed_by = $4
			RETURNING q.notification_id, coalesce(q.notification_created_at, now()) AS ncreated, q.user_id, u.why, u.seen_wait
		)
		INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, state, error)
		SELECT notification_id, ncreated, user_id, 'deferred', why FROM moved WHERE NOT seen_wait`, ids, ends, whys, token, seenWaits)
	return err
}

// joinDigests takes digest members out of the queue and adds them to their
// open digest, one per (recipient, key), opening it (window from now) when
// there is none. Concurrent passes on any replica meet on the digest's
// row: ON CONFLICT serializes them, so one window gathers them all. The
// digest keeps its latest notification, whose push it becomes at the
// window's end (schedule.Firer). Each member's delivery log says digested.
func joinDigests(ctx context.Context, tx pgx.Tx, token string, members []*queued, now time.Time) error {
	if len(members) == 0 {
		return nil
	}
	ids := make([]int64, len(members))
	for i, q := range members {
		ids[i] = q.id
	}
	_, err := tx.Exec(ctx, `WITH released AS (
			DELETE FROM push_queue WHERE notification_id = ANY($1) AND claimed_by = $2
			RETURNING notification_id, coalesce(notification_created_at, now()) AS ncreated, user_id, category,
			          priority, digest_key, digest_window, broadcast
		),
		joined AS (
			-- A digest's push is a broadcast's (queued behind direct pushes)
			-- only if everything it gathers is.
			INSERT INTO push_digests AS d (user_id, digest_key, window_end, count, notification_id, notification_created_at, category, priority, broadcast)
			SELECT user_id, digest_key, $3::timestamptz + min(digest_window), count(*), max(notification_id),
			       (array_agg(ncreated ORDER BY notification_id DESC))[1], (array_agg(category ORDER BY notification_id DESC))[1],
			       CASE WHEN bool_or(priority = 'critical') THEN 'critical' ELSE 'normal' END, bool_and(broadcast)
			FROM released GROUP BY user_id, digest_key
			ON CONFLICT (user_id, digest_key) DO UPDATE SET
			    count = d.count + EXCLUDED.count,
			    broadcast = d.broadcast AND EXCLUDED.broadcast,
			    notification_id = greatest(d.notification_id, EXCLUDED.notification_id),
			    notification_created_at = CASE WHEN EXCLUDED.notification_id > d.notification_id THEN EXCLUDED.notification_created_at ELSE d.notification_created_at END,
			    category = CASE WHEN EXCLUDED.notification_id > d.notification_id THEN EXCLUDED.category ELSE d.category END,
			    priority = CASE WHEN EXCLUDED.priority = 'critical' THEN 'critical' ELSE d.priority END
		)
		INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, state, error)
		SELECT notification_id, ncreated, user_id, 'digested', 'in digest ' || digest_key || ', pushed once when its window ends'
		FROM released`, ids, token, now)
	if err != nil {
		return err
	}
	return nil
}

// throttleExpireBatch bounds the throttle rows one statement deletes.
const throttleExpireBatch = 5000

// expireThrottles deletes the throttle counters of windows before current,
// a batch per statement: only the current window's counters decide.
func expireThrottles(ctx context.Context, db DB, current time.Time) error {
	for {
		tag, err := db.Exec(ctx, `DELETE FROM push_throttles WHERE (user_id, category, window_start) IN (
				SELECT user_id, category, window_start FROM push_throttles WHERE window_start < $1
				LIMIT $2 FOR UPDATE SKIP LOCKED)`, current, throttleExpireBatch)
		if err != nil {
			return err
		}
		if tag.RowsAffected() < throttleExpireBatch {
			return nil
		}
	}
}
