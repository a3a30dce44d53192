package push

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	_ "time/tzdata" // quiet hours name IANA zones: the binary carries them, whatever the host has

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

// QuietHours is a user's daily window without pushes, in the user's zone.
// The window may cross midnight; a push inside it is deferred to its end.
type QuietHours struct {
	Start    string `json:"start"`     // "22:00"
	End      string `json:"end"`       // "07:00"
	TimeZone string `json:"time_zone"` // IANA, such as "Europe/Berlin"

	start, end int // minutes of the day
	loc        *time.Location
}

// ErrBadQuietHours is wrapped by ParseQuietHours's errors.
var ErrBadQuietHours = errors.New("invalid quiet_hours")

// ParseQuietHours checks q and readies it for Until.
func ParseQuietHours(q QuietHours) (QuietHours, error) {
	var err error
	if q.start, err = minuteOfDay(q.Start); err != nil {
		return QuietHours{}, fmt.Errorf("%w: start: %v", ErrBadQuietHours, err)
	}
	if q.end, err = minuteOfDay(q.End); err != nil {
		return QuietHours{}, fmt.Errorf("%w: end: %v", ErrBadQuietHours, err)
	}
	if q.start == q.end {
		return QuietHours{}, fmt.Errorf("%w: start and end are the same time", ErrBadQuietHours)
	}
	if q.TimeZone == "" || strings.EqualFold(q.TimeZone, "local") {
		return QuietHours{}, fmt.Errorf("%w: time_zone must name an IANA zone, such as Europe/Berlin", ErrBadQuietHours)
	}
	if q.loc, err = loadZone(q.TimeZone); err != nil {
		return QuietHours{}, fmt.Errorf("%w: time_zone %q is not an IANA zone", ErrBadQuietHours, q.TimeZone)
	}
	q.Start, q.End = formatMinute(q.start), formatMinute(q.end)
	return q, nil
}

// zones caches the zones quiet hours named: time.LoadLocation reads and
// parses the zone's data at every call, and every dispatch pass reads the
// quiet hours of its users. There are a few hundred zones.
var zones sync.Map // name → *time.Location

func loadZone(name string) (*time.Location, error) {
	if loc, ok := zones.Load(name); ok {
		return loc.(*time.Location), nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, err
	}
	zones.Store(name, loc)
	return loc, nil
}

func minuteOfDay(s string) (int, error) {
	h, m, ok := strings.Cut(s, ":")
	hh, err1 := strconv.Atoi(h)
	mm, err2 := strconv.Atoi(m)
	if !ok || len(h) != 2 || len(m) != 2 || err1 != nil || err2 != nil || hh > 23 || mm > 59 || hh < 0 || mm < 0 {
		return 0, fmt.Errorf("%q is not a time of day as HH:MM", s)
	}
	return hh*60 + mm, nil
}

func formatMinute(m int) string { return fmt.Sprintf("%02d:%02d", m/60, m%60) }

// Until reports whether now is inside the quiet hours and, if so, when they
// end: the next time the user's clock shows End. Across a DST change the end
// is the wall-clock time in the zone, so it moves with the clocks.
func (q QuietHours) Until(now time.Time) (time.Time, bool) {
	if q.loc == nil {
		return time.Time{}, false
	}
	local := now.In(q.loc)
	m := local.Hour()*60 + local.Minute()
	inside := m >= q.start && m < q.end
	if q.start > q.end { // crosses midnight
		inside = m >= q.start || m < q.end
	}
	if !inside {
		return time.Time{}, false
	}
	y, mo, d := local.Date()
	end := time.Date(y, mo, d, q.end/60, q.end%60, 0, 0, q.loc)
	if !end.After(now) {
		end = time.Date(y, mo, d+1, q.end/60, q.end%60, 0, 0, q.loc)
	}
	return end, true
}

// quietHours returns the quiet hours of those of users that have them.
func quietHours(ctx context.Context, db DB, users []string) (map[string]QuietHours, error) {
	rows, err := db.Query(ctx, `SELECT user_id, start_minute, end_minute, time_zone FROM push_quiet_hours WHERE user_id = ANY($1)`, users)
	if err != nil {
		return nil, fmt.Errorf("read quiet hours: %w", err)
	}
	defer rows.Close()
	out := map[string]QuietHours{}
	for rows.Next() {
		var user, zone string
		var start, end int16
		if err := rows.Scan(&user, &start, &end, &zone); err != nil {
			return nil, fmt.Errorf("read quiet hours: %w", err)
		}
		q, err := ParseQuietHours(QuietHours{Start: formatMinute(int(start)), End: formatMinute(int(end)), TimeZone: zone})
		if err == nil {
			out[user] = q
		}
	}
	return out, rows.Err()
}

// QuietHoursSetting is the quiet_hours member of a PUT /v1/preferences:
// absent leaves them as they are, null removes them, an object sets them.
type QuietHoursSetting struct {
	Set   bool        // the member was present
	Value *QuietHours // nil: remove
}

// UnmarshalJSON implements json.Unmarshaler.
func (s *QuietHoursSetting) UnmarshalJSON(b []byte) error {
	s.Set = true
	if string(b) == "null" {
		s.Value = nil
		return nil
	}
	var q QuietHours
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&q); err != nil {
		return fmt.Errorf("%w: %v", ErrBadQuietHours, err)
	}
	parsed, err := ParseQuietHours(q)
	if err != nil {
		return err
	}
	s.Value = &parsed
	return nil
}

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
