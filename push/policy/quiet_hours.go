package policy

import (
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

// QuietHoursOf makes quiet hours from minutes of the day (as stored) and
// an IANA zone.
func QuietHoursOf(start, end int, zone string) (QuietHours, error) {
	return ParseQuietHours(QuietHours{Start: formatMinute(start), End: formatMinute(end), TimeZone: zone})
}

// Minutes returns the start and end as minutes of the day.
func (q QuietHours) Minutes() (start, end int) { return q.start, q.end }

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
// end. A night's window runs between real instants: from the first at which
// the user's clock shows Start or later to the first at which it shows End
// or later. So across a DST change a time the clocks skip begins or ends
// the window when they jump past it, and a time they show twice does so at
// its first showing (the repeated minutes are inside only if that night's
// window holds them). The end is always after now, never a day late, and
// quiet hours do not hold a push again at the end they gave: a window that
// begins where another ends continues it.
func (q QuietHours) Until(now time.Time) (time.Time, bool) {
	if q.loc == nil {
		return time.Time{}, false
	}
	end, ok := q.windowAt(now)
	if !ok {
		return time.Time{}, false
	}
	// Two windows meet only when the clocks skip the minutes between them;
	// a few turns are more than any zone's rules make.
	for range 3 {
		next, ok := q.windowAt(end)
		if !ok {
			break
		}
		end = next
	}
	return end, true
}

// windowAt returns the end of a day's window that holds t, the latest if
// two do (a window near 24 hours on a night the clocks go back).
func (q QuietHours) windowAt(t time.Time) (end time.Time, ok bool) {
	y, mo, d := t.In(q.loc).Date()
	for day := d - 1; day <= d+1; day++ { // a clock set back may show the day before again
		endDay := day
		if q.end < q.start {
			endDay++
		}
		s, e := firstShowing(q.loc, y, mo, day, q.start), firstShowing(q.loc, y, mo, endDay, q.end)
		if !t.Before(s) && t.Before(e) && e.After(end) {
			end, ok = e, true
		}
	}
	return end, ok
}

// firstShowing is the first instant at which loc's clock, on the date, shows
// minute (of the day) or later: when it shows it, at its first showing if it
// shows it twice, or when the clock jumps past it if it skips it.
// time.Date leaves the last two unspecified: it gave an hour early, or a
// time already past, for skipped ends, and either showing of repeated ones.
func firstShowing(loc *time.Location, y int, mo time.Month, d, minute int) time.Time {
	wall := time.Date(y, mo, d, minute/60, minute%60, 0, 0, time.UTC)
	near := time.Date(y, mo, d, minute/60, minute%60, 0, 0, loc)
	start, end := near.ZoneBounds()
	if reading(near, loc).Equal(wall) && (start.IsZero() || near.Sub(start) > 3*time.Hour) {
		return near // hours from the last change, which no shift spans: shown once
	}
	// The instant shows wall under one of the offsets of near's zone period
	// or the periods beside it, or is one of the changes that bound it.
	candidates := []time.Time{start, end}
	for _, at := range []time.Time{near, start.Add(-time.Nanosecond), end} {
		if at.IsZero() || at.Equal(start.Add(-time.Nanosecond)) && start.IsZero() {
			continue
		}
		_, off := at.In(loc).Zone()
		candidates = append(candidates, wall.Add(-time.Duration(off)*time.Second))
	}
	var first time.Time
	for _, c := range candidates {
		reaches := !c.IsZero() && !reading(c, loc).Before(wall) && reading(c.Add(-time.Nanosecond), loc).Before(wall)
		if reaches && (first.IsZero() || c.Before(first)) {
			first = c
		}
	}
	if first.IsZero() {
		return near // not reached: every zone's clock shows or jumps past each minute
	}
	return first.In(loc)
}

// reading is what loc's clock shows at t, as a time in UTC (for comparing readings).
func reading(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
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
