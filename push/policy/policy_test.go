package policy_test

import (
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/push/policy"
)

func TestDecideAppliesThePoliciesInTheirOrderAndCriticalPassesAllButTheDigest(t *testing.T) {
	now := time.Date(2026, 3, 10, 23, 0, 0, 0, time.UTC)
	quiet, err := policy.ParseQuietHours(policy.QuietHours{Start: "22:00", End: "07:00", TimeZone: "UTC"})
	if err != nil {
		t.Fatal(err)
	}
	morning := time.Date(2026, 3, 11, 7, 0, 0, 0, time.UTC)
	throttle := policy.Throttle{Limit: 5, Window: time.Hour}
	fresh := now.Add(-time.Second)
	seen := policy.Seen{Hold: 10 * time.Second, Present: map[string]bool{"u1": true}, Seen: map[int64]bool{7: true}}
	for _, tc := range []struct {
		name        string
		p           policy.Push
		quiet       policy.QuietHours
		quietFailed bool
		throttle    policy.Throttle
		want        policy.Decision
	}{
		{"a digest member joins its digest, even critical and seen",
			policy.Push{ID: 7, User: "u1", Critical: true, DigestMember: true}, quiet, false, throttle,
			policy.Decision{Action: policy.Gather, Outcome: policy.Digested}},
		{"seen already: suppressed before quiet hours are asked",
			policy.Push{ID: 7, User: "u1", CreatedAt: fresh}, quiet, false, throttle,
			policy.Decision{Action: policy.Suppress, Outcome: policy.Suppressed}},
		{"its user has the stream open: held until the hold ends, counted when decided again",
			policy.Push{ID: 8, User: "u1", CreatedAt: fresh}, quiet, false, throttle,
			policy.Decision{Action: policy.Hold, Until: fresh.Add(10 * time.Second)}},
		{"held once already: quiet hours defer it to their end",
			policy.Push{ID: 8, User: "u1", CreatedAt: fresh, SeenWaited: true}, quiet, false, throttle,
			policy.Decision{Action: policy.Defer, Until: morning, Outcome: policy.Deferred}},
		{"outside quiet hours, under a throttle: the throttle decides",
			policy.Push{ID: 9, User: "u2", CreatedAt: fresh}, policy.QuietHours{}, false, throttle,
			policy.Decision{Action: policy.Cap}},
		{"no policy holds it: sent",
			policy.Push{ID: 9, User: "u2", CreatedAt: fresh}, policy.QuietHours{}, false, policy.Throttle{},
			policy.Decision{Action: policy.Send, Outcome: policy.Passed}},
		{"quiet hours unreadable: sent, failing open",
			policy.Push{ID: 9, User: "u2", CreatedAt: fresh}, policy.QuietHours{}, true, policy.Throttle{},
			policy.Decision{Action: policy.Send, Outcome: policy.Passed, FailOpen: true}},
		{"critical inside quiet hours and a throttle, seen: sent, counted critical",
			policy.Push{ID: 7, User: "u1", CreatedAt: fresh, Critical: true}, quiet, false, throttle,
			policy.Decision{Action: policy.Send, Outcome: policy.Critical}},
		{"critical with nothing to pass: sent as any other",
			policy.Push{ID: 9, User: "u2", CreatedAt: fresh, Critical: true}, policy.QuietHours{}, false, policy.Throttle{},
			policy.Decision{Action: policy.Send, Outcome: policy.Passed}},
		{"a digest's one push",
			policy.Push{ID: 10, User: "u2", CreatedAt: fresh, Digest: true}, policy.QuietHours{}, false, policy.Throttle{},
			policy.Decision{Action: policy.Send, Outcome: policy.DigestSent}},
	} {
		got := policy.Decide(tc.p, tc.quiet, tc.quietFailed, tc.throttle, seen, now)
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestAPushDueLaterIsJudgedWhenItCameDue(t *testing.T) {
	// Deferred to 07:00 by a replica whose clock is ahead, taken at 06:59:58
	// by one whose clock is behind: quiet hours do not hold it again.
	quiet, err := policy.ParseQuietHours(policy.QuietHours{Start: "22:00", End: "07:00", TimeZone: "UTC"})
	if err != nil {
		t.Fatal(err)
	}
	end := time.Date(2026, 3, 11, 7, 0, 0, 0, time.UTC)
	p := policy.Push{ID: 1, User: "u1", DueAt: end}
	if d, ok := policy.DeferInQuiet(p, quiet, end.Add(-2*time.Second)); ok {
		t.Fatalf("deferred again, to %s", d.Until)
	}
	p.DueAt = time.Time{}
	if d, ok := policy.DeferInQuiet(p, quiet, end.Add(-2*time.Second)); !ok || !d.Until.Equal(end) {
		t.Fatalf("not due yet: %+v, %v; want deferred to %s", d, ok, end)
	}
}

func TestParseThrottleReadsItsOwnString(t *testing.T) {
	for _, s := range []string{"off", "5/1h0m0s", "1/1s"} {
		th, err := policy.ParseThrottle(s)
		if err != nil || th.String() != s {
			t.Errorf("ParseThrottle(%q) = %v, %v", s, th, err)
		}
	}
	for _, s := range []string{"0/1h", "5", "5/500ms", "x/1h"} {
		if _, err := policy.ParseThrottle(s); err == nil {
			t.Errorf("ParseThrottle(%q) took it", s)
		}
	}
}

// A notification read or archived already is never pushed, critical or a
// digest's member; a digest's own push speaks for its other members too.
func TestANotificationDealtWithAlreadyIsNotPushed(t *testing.T) {
	now := time.Now()
	seen := policy.Seen{Done: map[int64]bool{1: true}}
	for _, p := range []policy.Push{{ID: 1}, {ID: 1, Critical: true}, {ID: 1, DigestMember: true}} {
		if d := policy.Decide(p, policy.QuietHours{}, false, policy.Throttle{}, seen, now); d.Action != policy.Suppress || !d.Done || d.Outcome != policy.Suppressed {
			t.Errorf("%+v: %+v; want suppressed as done", p, d)
		}
	}
	if d := policy.Decide(policy.Push{ID: 1, Digest: true}, policy.QuietHours{}, false, policy.Throttle{}, seen, now); d.Action != policy.Send {
		t.Errorf("a digest's push: %+v; want sent", d)
	}
}
