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
