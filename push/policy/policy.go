// Package policy decides what becomes of a push before it is sent: a
// digest gathers it, suppress-if-seen holds or drops it, quiet hours defer
// it, a throttle caps it, or it goes. The decisions are pure: the
// dispatcher reads what they need (quiet hours, presence, what was seen),
// calls Decide, and writes the result in one transaction.
package policy

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The outcomes of the delivery policies: the policy metric's label values.
// The first five are also the states a dispatch ends in.
const (
	Deferred   = "deferred"   // quiet hours held the push until their end
	Digested   = "digested"   // the push joined its digest, pushed once at the window's end
	Throttled  = "throttled"  // the user's pushes in the category were over --push-throttle
	Suppressed = "suppressed" // the user saw the notification before its push was due
	Cancelled  = "cancelled"  // a scheduled notification cancelled before its send_at
	Critical   = "critical"   // a critical push passed quiet hours or a throttle
	DigestSent = "digest"     // a digest's one push was dispatched
	Passed     = "passed"     // no policy held the push
	FailOpen   = "fail_open"  // quiet hours were unreadable: pushed
)

// Outcomes are every outcome, in the order the metric lists them.
var Outcomes = []string{Passed, Deferred, Digested, DigestSent, Throttled, Suppressed, Critical, Cancelled, FailOpen}

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

// DigestTitle is a digest push's title: how many it gathers, and its key.
func DigestTitle(count int, key string) string {
	return fmt.Sprintf("%d new in %s", count, key)
}

// Push is what the policies know of one notification's push.
type Push struct {
	ID        int64
	User      string
	CreatedAt time.Time // the notification's
	DueAt     time.Time // when the push came due (the queue's due_at)
	Critical  bool      // priority critical: passes all but the digest
	// DigestMember: the notification joins its digest instead of being
	// pushed on its own.
	DigestMember bool
	// Digest: this is a digest's one push.
	Digest bool
	// SeenWaited: held once for its user to see it; not held for that again.
	SeenWaited bool
}

// Seen is what suppress-if-seen knows of a pass's notifications: whose
// users hold an open stream, and which were seen or read already.
type Seen struct {
	Hold    time.Duration // --push-suppress-if-seen; 0: off
	Present map[string]bool
	Seen    map[int64]bool
	// Done are the notifications read or archived already (on any device,
	// one by one or by read-all or archive-all), whatever Hold is: their
	// push would put up a banner for what the user has dealt with, and the
	// clear that takes banners down is written only for pushes sent
	// before the read.
	Done map[int64]bool
}

// Action is what becomes of a push.
type Action int

const (
	Send     Action = iota // push it now
	Gather                 // join its digest
	Suppress               // seen already: never pushed
	Hold                   // wait until Decision.Until for its user to see it
	Defer                  // quiet hours: wait until Decision.Until
	Cap                    // the throttle decides, counting the window's pushes
)

// Decision is what Decide made of one push.
type Decision struct {
	Action Action
	Until  time.Time // Hold and Defer: when it comes due again
	// Outcome is the policy metric's label for it ("" for Hold, which is
	// decided again, and Cap, whose outcome the throttle gives).
	Outcome string
	// FailOpen: quiet hours were unreadable and did not hold it.
	FailOpen bool
	// Done: suppressed because the notification was read or archived.
	Done bool
}

// Decide applies the policies in their order: a digest member joins its
// digest; one seen already is suppressed, and one whose user has the
// stream open waits to be seen; quiet hours defer it; a throttle caps it;
// otherwise it is sent. Critical pushes pass all but the digest. quiet is
// the user's quiet hours (the zero value: none), quietFailed that they
// could not be read (the push fails open).
func Decide(p Push, quiet QuietHours, quietFailed bool, th Throttle, seen Seen, now time.Time) Decision {
	if seen.Done[p.ID] && !p.Digest {
		// Critical or not, gathered or not: read already. (A digest's push
		// speaks for its other members too.)
		return Decision{Action: Suppress, Outcome: Suppressed, Done: true}
	}
	if p.DigestMember {
		return Decision{Action: Gather, Outcome: Digested}
	}
	if !p.Critical {
		switch {
		case seen.Seen[p.ID]:
			return Decision{Action: Suppress, Outcome: Suppressed}
		case seen.Hold > 0 && !p.SeenWaited && seen.Present[p.User] && p.CreatedAt.Add(seen.Hold).After(now):
			return Decision{Action: Hold, Until: p.CreatedAt.Add(seen.Hold)}
		}
		if d, ok := DeferInQuiet(p, quiet, now); ok {
			return d
		}
	}
	d := Decision{FailOpen: quietFailed}
	bypassed := false
	if p.Critical {
		_, bypassed = quiet.Until(later(now, p.DueAt)) // critical passes quiet hours
	}
	switch {
	case th.Limit > 0 && !p.Critical:
		d.Action = Cap
		return d
	case th.Limit > 0:
		bypassed = true
	}
	d.Action, d.Outcome = Send, SentOutcome(p, bypassed)
	return d
}

// DeferInQuiet defers a push to the end of the quiet hours that hold it
// now, if they do. A push decided before it was given back goes through
// this alone: its throttle, digest and seen hold are not decided again.
func DeferInQuiet(p Push, quiet QuietHours, now time.Time) (Decision, bool) {
	// Judged when it came due at the earliest: one deferred to an end comes
	// due by the later of Postgres's clock and a replica's, and at that end
	// quiet hours do not hold it again, whatever this replica's clock says.
	end, ok := quiet.Until(later(now, p.DueAt))
	if !ok {
		return Decision{}, false
	}
	return Decision{Action: Defer, Until: end, Outcome: Deferred}, true
}

// SentOutcome is the policy metric's label for a push the throttle let
// through (bypassed: a critical push it would have held).
func SentOutcome(p Push, bypassed bool) string {
	switch {
	case p.Digest:
		return DigestSent
	case bypassed:
		return Critical
	default:
		return Passed
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
