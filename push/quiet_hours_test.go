package push_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/preferences"
	"github.com/spoolcast/spoolcast/push"
	"github.com/spoolcast/spoolcast/push/policy"
)

func quietHoursIn(t *testing.T, zone, start, end string) policy.QuietHours {
	t.Helper()
	q, err := policy.ParseQuietHours(policy.QuietHours{Start: start, End: end, TimeZone: zone})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// The nights of 2027 on which clocks change, with the instants as UTC and
// the walls they join in comments.
func TestQuietHoursAcrossDaylightSavingEndAtTheFirstRealInstantOfTheirEnd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		zone, start, end string
		now              string // RFC 3339, UTC
		inside           bool
		until            string // the end, when inside
	}{
		// New York springs forward at 07:00Z on 14 March: 01:59:59 EST, then 03:00 EDT.
		{"New York: an end the clocks skip ends when they jump", "America/New_York", "22:00", "02:30", "2027-03-14T04:00:00Z", true, "2027-03-14T07:00:00Z"},
		{"New York: an hour before the jump still ends at it", "America/New_York", "22:00", "02:30", "2027-03-14T06:45:00Z", true, "2027-03-14T07:00:00Z"},
		{"New York: after the jump the window is over", "America/New_York", "22:00", "02:30", "2027-03-14T07:10:00Z", false, ""},
		{"New York: an end after the gap is the wall time", "America/New_York", "22:00", "03:30", "2027-03-14T04:00:00Z", true, "2027-03-14T07:30:00Z"},
		{"New York: a window whose gap the clocks skip goes on into the next", "America/New_York", "02:30", "02:10", "2027-03-14T06:00:00Z", true, "2027-03-15T06:10:00Z"},
		// New York falls back at 06:00Z on 7 November: 01:59:59 EDT, then 01:00 EST.
		{"New York: a repeated end is its first occurrence", "America/New_York", "22:00", "01:30", "2027-11-07T03:00:00Z", true, "2027-11-07T05:30:00Z"},
		{"New York: the repeated hour after the end is outside", "America/New_York", "22:00", "01:30", "2027-11-07T06:15:00Z", false, ""},
		{"New York: an end at 01:01 is not a day late", "America/New_York", "22:00", "01:01", "2027-11-07T06:00:00Z", false, ""},
		{"New York: a window begun in the first 01:30 holds the repeated hour", "America/New_York", "01:30", "06:00", "2027-11-07T06:15:00Z", true, "2027-11-07T11:00:00Z"},
		// Los Angeles: the same rules three hours later.
		{"Los Angeles: spring forward", "America/Los_Angeles", "22:00", "02:30", "2027-03-14T09:30:00Z", true, "2027-03-14T10:00:00Z"},
		{"Los Angeles: fall back", "America/Los_Angeles", "22:00", "01:59", "2027-11-07T09:20:00Z", false, ""},
		// Santiago springs forward at midnight, 04:00Z on 5 September: 23:59:59 -04, then 01:00 -03.
		{"Santiago: a skipped 00:30 ends at the jump, not in the past", "America/Santiago", "22:00", "00:30", "2027-09-05T03:45:00Z", true, "2027-09-05T04:00:00Z"},
		{"Santiago: from the start of the night", "America/Santiago", "22:00", "00:30", "2027-09-05T02:10:00Z", true, "2027-09-05T04:00:00Z"},
		{"Santiago: a skipped midnight", "America/Santiago", "23:00", "00:00", "2027-09-05T03:30:00Z", true, "2027-09-05T04:00:00Z"},
		{"Santiago: a start the clocks skip begins at the jump", "America/Santiago", "00:15", "06:00", "2027-09-05T04:10:00Z", true, "2027-09-05T09:00:00Z"},
		// Santiago falls back at midnight, 03:00Z on 4 April: 23:59:59 -03, then 23:00 -04 the same Saturday.
		{"Santiago: the repeated 23:10 after an end at 23:30 is outside", "America/Santiago", "22:00", "23:30", "2027-04-04T03:10:00Z", false, ""},
		{"Santiago: a window over the repeated hour ends at its wall end", "America/Santiago", "22:00", "07:00", "2027-04-04T03:10:00Z", true, "2027-04-04T11:00:00Z"},
		// London springs forward at 01:00Z on 28 March (00:59:59 GMT, then
		// 02:00 BST) and falls back at 01:00Z on 31 October (01:59:59 BST, then 01:00 GMT).
		{"London: an end the clocks skip", "Europe/London", "23:00", "01:30", "2027-03-28T00:30:00Z", true, "2027-03-28T01:00:00Z"},
		{"London: the repeated hour after the end", "Europe/London", "23:00", "01:30", "2027-10-31T01:10:00Z", false, ""},
		{"London: the first pass of the hour", "Europe/London", "23:00", "01:30", "2027-10-31T00:10:00Z", true, "2027-10-31T00:30:00Z"},
		// Lord Howe moves half an hour: at 15:30Z on 2 October 01:59:59
		// +1030 becomes 02:30 +11; at 15:00Z on 3 April 01:59:59 +11 becomes 01:30 +1030.
		{"Lord Howe: an end in the half hour skipped", "Australia/Lord_Howe", "22:00", "02:15", "2027-10-02T15:20:00Z", true, "2027-10-02T15:30:00Z"},
		{"Lord Howe: the repeated half hour after the end", "Australia/Lord_Howe", "22:00", "01:45", "2027-04-03T15:10:00Z", false, ""},
		{"Lord Howe: the first pass of the half hour", "Australia/Lord_Howe", "22:00", "01:45", "2027-04-03T14:40:00Z", true, "2027-04-03T14:45:00Z"},
		// Kolkata has no daylight saving, and a half-hour offset.
		{"Kolkata: across midnight", "Asia/Kolkata", "22:00", "07:00", "2027-03-14T17:30:00Z", true, "2027-03-15T01:30:00Z"},
		{"Kolkata: before a window within the day", "Asia/Kolkata", "09:00", "17:00", "2027-03-14T03:29:00Z", false, ""},
		{"Kolkata: inside a window within the day", "Asia/Kolkata", "09:00", "17:00", "2027-03-14T03:30:00Z", true, "2027-03-14T11:30:00Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := quietHoursIn(t, tc.zone, tc.start, tc.end)
			now := utc(tc.now)
			end, inside := q.Until(now)
			switch {
			case inside != tc.inside:
				t.Errorf("%s–%s at %s (%s): inside = %v (until %s), want %v", tc.start, tc.end, now.In(end.Location()).Format(time.RFC3339), tc.now, inside, end.UTC().Format(time.RFC3339), tc.inside)
			case inside && !end.Equal(utc(tc.until)):
				t.Errorf("%s–%s at %s: until %s, want %s", tc.start, tc.end, tc.now, end.UTC().Format(time.RFC3339), tc.until)
			}
		})
	}
}

// The days around each change, in each zone, for windows
// that end before, in, and after the hours the clocks skip or repeat: an
// end is after now, at most a day and the shift away, and quiet hours do
// not hold a push again at the end they deferred it to.
func TestQuietHoursNeverEndInThePastNorADayLateNorHoldAPushAgainAtTheirEnd(t *testing.T) {
	t.Parallel()
	changes := map[string][]string{
		"America/New_York":    {"2027-03-14T07:00:00Z", "2027-11-07T06:00:00Z"},
		"America/Los_Angeles": {"2027-03-14T10:00:00Z", "2027-11-07T09:00:00Z"},
		"America/Santiago":    {"2027-04-04T03:00:00Z", "2027-09-05T04:00:00Z"},
		"Europe/London":       {"2027-03-28T01:00:00Z", "2027-10-31T01:00:00Z"},
		"Australia/Lord_Howe": {"2027-04-03T15:00:00Z", "2027-10-02T15:30:00Z"},
		"Asia/Kolkata":        {"2027-03-14T00:00:00Z"},
	}
	windows := [][2]string{
		{"22:00", "02:30"}, {"22:00", "01:30"}, {"22:00", "01:01"}, {"22:00", "00:30"}, {"23:00", "00:00"},
		{"01:30", "06:00"}, {"00:15", "06:00"}, {"02:00", "02:30"}, {"22:00", "07:00"}, {"09:00", "17:00"},
		{"02:10", "01:50"}, {"23:30", "23:10"},
	}
	for zone, at := range changes {
		for _, w := range windows {
			q := quietHoursIn(t, zone, w[0], w[1])
			for _, change := range at {
				// Every minute of the hours around the change, every ten of the nights before and after.
				for now := utc(change).Add(-30 * time.Hour); now.Before(utc(change).Add(30 * time.Hour)); now = now.Add(step(now, utc(change))) {
					end, inside := q.Until(now)
					if !inside {
						continue
					}
					if !end.After(now) || end.Sub(now) > 25*time.Hour {
						t.Fatalf("%s %s–%s at %s: until %s", zone, w[0], w[1], now.Format(time.RFC3339), end.Format(time.RFC3339))
					}
					if again, still := q.Until(end); still {
						t.Fatalf("%s %s–%s at %s: deferred to %s, and at that end held again until %s",
							zone, w[0], w[1], now.Format(time.RFC3339), end.UTC().Format(time.RFC3339), again.UTC().Format(time.RFC3339))
					}
				}
			}
		}
	}
}

func step(now, change time.Time) time.Duration {
	if now.Sub(change).Abs() < 3*time.Hour {
		return time.Minute
	}
	return 10 * time.Minute
}

// Santiago's quiet hours 22:00–00:30 end at a midnight the clocks skip on
// 5 September 2027: a push in them is deferred once, to the jump, and sent
// then, once; not deferred again at every pass to an end already past.
func TestAPushInQuietHoursEndingInASkippedHourIsDeferredOnceAndSentAtTheJump(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(utc("2027-09-05T03:45:00Z")) // 23:45 -04 on Saturday 4 September
	s := newStackOn(t, clk)
	d, err := push.NewDispatcher(push.DispatcherConfig{DB: s.pool, Sender: s.client, Preferences: s.prefs, Devices: s.devices,
		Clock: clk, Metrics: s.metrics, Logger: slog.New(slog.DiscardHandler),
		MaxAge: 5 * 365 * 24 * time.Hour}) // the notification is written at the real time, months before the fake clock's
	if err != nil {
		t.Fatal(err)
	}
	s.dispatcher = d
	s.register("u1", "ExponentPushToken[a]")
	quiet := quietHoursIn(t, "America/Santiago", "22:00", "00:30")
	if _, err := s.prefs.Merge(context.Background(), "u1", preferences.Update{QuietHours: policy.QuietHoursSetting{Set: true, Value: &quiet}}); err != nil {
		t.Fatal(err)
	}
	s.ingest("k1", "c", "u1")
	for range 3 { // passes while the clock stands: nothing is due again
		s.drain()
	}
	if n := len(s.fake.Messages()); n != 0 {
		t.Fatalf("Expo got %d pushes during quiet hours", n)
	}
	clk.Advance(14*time.Minute + 59*time.Second) // 23:59:59 -04
	s.drain()
	if n := len(s.fake.Messages()); n != 0 {
		t.Fatalf("Expo got %d pushes before the clocks jumped", n)
	}
	clk.Advance(time.Second) // 01:00 -03
	s.drain()
	if n := len(s.fake.Messages()); n != 1 {
		t.Errorf("Expo got %d pushes once the clocks jumped past the end, want 1", n)
	}
	if n := pgtest.Count(t, s.pool, `SELECT count(*) FROM push_dispatches WHERE state = 'deferred'`); n != 1 {
		t.Errorf("%d deferred rows in the delivery log, want 1", n)
	}
	var why string
	if err := s.pool.QueryRow(context.Background(), `SELECT error FROM push_dispatches WHERE state = 'deferred'`).Scan(&why); err != nil || why != "quiet hours until 2027-09-05T01:00:00-03:00" {
		t.Errorf("deferred because %q (%v), want until the jump", why, err)
	}
	if c := s.counter("spoolcast_push_policy_total", "outcome", policy.Deferred); c != 1 {
		t.Errorf("policy deferred = %v, want 1", c)
	}
}

// A push deferred to the end of quiet hours comes due by Postgres's clock
// (or another replica's) while this replica's clock is a little behind: it
// is judged at the end it was deferred to, and sent, not deferred again.
func TestAPushDueAtTheEndOfItsQuietHoursIsSentByAReplicaWhoseClockIsBehind(t *testing.T) {
	t.Parallel()
	wall := time.Now().UTC()
	clk := clock.NewFake(wall.Add(-2 * time.Minute))
	s := newStackOn(t, clk)
	s.dispatcher = s.newDispatcher(s.pool, s.prefs)
	s.register("u1", "ExponentPushToken[a]")
	end := wall.Truncate(time.Minute) // after the replica's clock, not after Postgres's
	quiet := quietHoursIn(t, "UTC", clk.Now().Add(-time.Hour).Format("15:04"), end.Format("15:04"))
	if _, err := s.prefs.Merge(context.Background(), "u1", preferences.Update{QuietHours: policy.QuietHoursSetting{Set: true, Value: &quiet}}); err != nil {
		t.Fatal(err)
	}
	s.ingest("k1", "c", "u1")
	// As a pass on a replica whose clock was right deferred it: due at the end.
	if _, err := s.pool.Exec(context.Background(), `UPDATE push_queue SET due_at = $1`, end); err != nil {
		t.Fatal(err)
	}
	s.drain()
	if n := len(s.fake.Messages()); n != 1 {
		t.Errorf("Expo got %d pushes, want 1", n)
	}
	if n := pgtest.Count(t, s.pool, `SELECT count(*) FROM push_dispatches WHERE state = 'deferred'`); n != 0 {
		t.Errorf("deferred again %d times at the end it was deferred to", n)
	}
}
