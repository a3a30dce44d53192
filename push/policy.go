package push

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/feed"
)

// The policy states a dispatch can end in besides the sending ones.
const (
	// StateDeferred: quiet hours held the push until their end.
	StateDeferred = "deferred"
	// StateDigested: the push joined its digest, pushed once at the window's end.
	StateDigested = "digested"
	// StateThrottled: the user's pushes in the category were over --push-throttle.
	StateThrottled = "throttled"
	// StateSuppressed: the user saw the notification before its push was due.
	StateSuppressed = "suppressed"
	// StateCancelled: a scheduled notification cancelled before its send_at.
	StateCancelled = "cancelled"
)

// Outcomes of the delivery policies, the values of the policy metric's label.
const (
	PolicyDeferred   = StateDeferred
	PolicyDigested   = StateDigested
	PolicyThrottled  = StateThrottled
	PolicySuppressed = StateSuppressed
	PolicyCritical   = "critical"  // a critical push passed quiet hours or a throttle
	PolicyDigestSent = "digest"    // a digest's one push was dispatched
	PolicyPassed     = "passed"    // no policy held the push
	PolicyFailOpen   = "fail_open" // quiet hours were unreadable: pushed
	PolicyCancelled  = StateCancelled
)

// Throttle caps the pushes per user and category in a fixed window; the
// zero Throttle is off.
type Throttle struct {
	Limit  int
	Window time.Duration
}

// ParseThrottle reads "N/DURATION" (such as "5/1h"); "" and "off" are off.
func ParseThrottle(s string) (Throttle, error) {
	if s == "" || s == "off" {
		return Throttle{}, nil
	}
	n, w, ok := strings.Cut(s, "/")
	limit, err := strconv.Atoi(n)
	if !ok || err != nil || limit < 1 {
		return Throttle{}, fmt.Errorf("push throttle %q: want N/DURATION with N ≥ 1, such as 5/1h", s)
	}
	window, err := time.ParseDuration(w)
	if err != nil || window < time.Second {
		return Throttle{}, fmt.Errorf("push throttle %q: the window must be a duration of at least 1s", s)
	}
	return Throttle{Limit: limit, Window: window}, nil
}

// String is the throttle as ParseThrottle reads it.
func (t Throttle) String() string {
	if t.Limit == 0 {
		return "off"
	}
	return fmt.Sprintf("%d/%s", t.Limit, t.Window)
}

// digestTitle is a digest push's title: how many it gathers, and its key.
func digestTitle(count int, key string) string {
	return fmt.Sprintf("%d new in %s", count, key)
}

// seenState is what suppress-if-seen knows of a pass's notifications: whose
// users hold an open stream, and which were seen or read already.
type seenState struct {
	hold    time.Duration // SuppressIfSeen; 0: off
	present map[string]bool
	seen    map[int64]bool
}

// seenState reads, for suppress-if-seen, which users hold a stream open and
// which of the notifications that may be suppressed now (held once, or
// older than the hold) were read or seen on the stream. A failed read
// holds and suppresses nothing: the push is sent (fail open).
func (d *Dispatcher) seenState(ctx context.Context, claimed []queued, users []string, now time.Time) seenState {
	st := seenState{hold: d.cfg.SuppressIfSeen}
	if st.hold <= 0 {
		return st
	}
	fail := func(err error) seenState {
		d.failLog.Do(func(suppressed int64) {
			d.log.Warn("stream presence unreadable; pushing without waiting to be seen", "err", err, "suppressed", suppressed)
		})
		return seenState{}
	}
	rows, err := d.cfg.DB.Query(ctx, `SELECT DISTINCT user_id FROM stream_presence WHERE user_id = ANY($1) AND expires_at > now()`, users)
	if err != nil {
		return fail(err)
	}
	present, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fail(err)
	}
	st.present = map[string]bool{}
	for _, u := range present {
		st.present[u] = true
	}
	var ids []int64
	var created []time.Time
	for _, q := range claimed {
		if !q.critical() && (q.seenWaited || st.present[q.user] && !q.createdAt.Add(st.hold).After(now)) {
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
	st.seen = map[int64]bool{}
	for _, id := range seen {
		st.seen[id] = true
	}
	return st
}
