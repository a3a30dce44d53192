package push

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/push/policy"
)

// The policy states a dispatch can end in besides the sending ones.
const (
	// StateDeferred: quiet hours held the push until their end.
	StateDeferred = policy.Deferred
	// StateDigested: the push joined its digest, pushed once at the window's end.
	StateDigested = policy.Digested
	// StateThrottled: the user's pushes in the category were over --push-throttle.
	StateThrottled = policy.Throttled
	// StateSuppressed: the user saw the notification before its push was due.
	StateSuppressed = policy.Suppressed
	// StateCancelled: a scheduled notification cancelled before its send_at.
	StateCancelled = policy.Cancelled
)

// policyPush is what the policies know of a queued push.
func (q *queued) policyPush() policy.Push {
	return policy.Push{ID: q.id, User: q.user, CreatedAt: q.createdAt, DueAt: q.dueAt, Critical: q.critical(),
		DigestMember: q.digestMember(), Digest: q.digestCount > 0, SeenWaited: q.seenWaited}
}

// doneState reads which claimed notifications are read or archived already,
// by the feed's rules (feed.ReadOrArchived), in one statement. A failed
// read suppresses nothing: the push is sent (fail open).
func (d *Dispatcher) doneState(ctx context.Context, claimed []queued) map[int64]bool {
	var ids []int64
	var created []time.Time
	for _, q := range claimed {
		if q.digestCount == 0 {
			ids, created = append(ids, q.id), append(created, q.createdAt)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := d.cfg.DB.Query(ctx, `SELECT n.id
		FROM unnest($1::int8[], $2::timestamptz[]) AS q(id, created_at)
		JOIN notifications n ON n.id = q.id AND n.created_at = q.created_at
		CROSS JOIN LATERAL `+feed.MarksOf("n.user_id")+` m
		WHERE `+feed.ReadOrArchived, ids, created)
	var done []int64
	if err == nil {
		done, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err != nil {
		d.failLog.Do(func(suppressed int64) {
			d.log.Warn("read states unreadable; pushing without checking whether they were read", "err", err, "suppressed", suppressed)
		})
		return nil
	}
	out := make(map[int64]bool, len(done))
	for _, id := range done {
		out[id] = true
	}
	return out
}

// seenState reads, for suppress-if-seen, which users hold a stream open and
// which of the notifications that may be suppressed now (held once, or
// older than the hold) were read or seen on the stream. A failed read
// holds and suppresses nothing: the push is sent (fail open).
func (d *Dispatcher) seenState(ctx context.Context, claimed []queued, users []string, now time.Time) policy.Seen {
	st := policy.Seen{Hold: d.cfg.SuppressIfSeen, Done: d.doneState(ctx, claimed)}
	if st.Hold <= 0 {
		return st
	}
	fail := func(err error) policy.Seen {
		d.failLog.Do(func(suppressed int64) {
			d.log.Warn("stream presence unreadable; pushing without waiting to be seen", "err", err, "suppressed", suppressed)
		})
		return policy.Seen{Done: st.Done}
	}
	rows, err := d.cfg.DB.Query(ctx, `SELECT DISTINCT user_id FROM stream_presence WHERE user_id = ANY($1) AND expires_at > now()`, users)
	if err != nil {
		return fail(err)
	}
	present, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fail(err)
	}
	st.Present = map[string]bool{}
	for _, u := range present {
		st.Present[u] = true
	}
	var ids []int64
	var created []time.Time
	for _, q := range claimed {
		if !q.critical() && (q.seenWaited || st.Present[q.user] && !q.createdAt.Add(st.Hold).After(now)) {
			ids, created = append(ids, q.id), append(created, q.createdAt)
		}
	}
	if len(ids) == 0 {
		return st
	}
	rows, err = d.cfg.DB.Query(ctx, `SELECT n.id
		FROM unnest($1::int8[], $2::timestamptz[]) AS q(id, created_at)
		JOIN notifications n ON n.id = q.id AND n.created_at = q.created_at
		LEFT JOIN (SELECT user_id, through_at AS at, through_id AS id, snapshot AS snap FROM read_marks) w ON w.user_id = n.user_id
		LEFT JOIN stream_seen s ON s.user_id = n.user_id
		WHERE n.read_at IS NOT NULL OR `+feed.ReadAllCovers+` OR (n.tx, n.id) <= (s.through_tx, s.through_id)`, ids, created)
	if err != nil {
		return fail(err)
	}
	seen, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fail(err)
	}
	st.Seen = map[int64]bool{}
	for _, id := range seen {
		st.Seen[id] = true
	}
	return st
}
