package push

import (
	"slices"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/channel"
)

// The refusal guard's bounds: a provider that refused more than half of
// the last refusalGuardRecent distinct devices it answered within
// refusalGuardWindow, and at least refusalGuardMin of them, refuses the
// deployment, not them.
const (
	refusalGuardRecent = 16
	refusalGuardMin    = 4
	refusalGuardWindow = 10 * time.Minute
	// refusalHold is how long a push whose device the guard kept waits
	// before it is sent again (once, within --push-max-age): time for an
	// operator to put the setting right.
	refusalHold = 10 * time.Minute
)

// refusalGuard tells one device's refusal from a deployment's. A device
// refusal (BadDeviceToken, DeviceTokenNotForTopic, FCM SENDER_ID_MISMATCH,
// a browser's 401/403, Expo's MismatchSenderId) disables that device. But
// a wrong setting answers the same for every device: --apns-sandbox the
// wrong way round is BadDeviceToken for every iPhone, the wrong Firebase
// project SENDER_ID_MISMATCH for every Android phone, a replaced VAPID key
// 403 for every browser. When most of the devices a provider answered
// last were refused, the guard holds: no device is disabled, the push
// waits for the operator (who is paged), and the devices work again once
// the setting is right. A healthy provider refuses few devices, and
// seldom several in a row, so the guard costs a real refusal at most a
// wait; a wrong setting disables at most refusalGuardMin-1 devices before
// it holds, none when a batch shows it at once.
type refusalGuard struct {
	mu         sync.Mutex
	byProvider map[string][]deviceAnswer // the latest answer of each of the last distinct devices, oldest first
}

type deviceAnswer struct {
	token   string
	at      time.Time
	refused bool
}

func newRefusalGuard() *refusalGuard {
	return &refusalGuard{byProvider: map[string][]deviceAnswer{}}
}

// refusedDevice reports whether o refuses the device's token as not this
// app's: the answers a wrong deployment setting gives every device.
func refusedDevice(o channel.Outcome) bool {
	return o.Kind == channel.TokenInvalid || o.Kind == channel.TokenForeign
}

// answeredDevice reports whether o is the provider's word on the device
// itself (taken, gone or refused), as opposed to on the request.
func answeredDevice(o channel.Outcome) bool {
	switch o.Kind {
	case channel.Delivered, channel.Accepted, channel.TokenGone, channel.TokenInvalid, channel.TokenForeign:
		return true
	}
	return false
}

// observe records provider's answer o for the device with token as its
// latest. A batch is observed whole before any of it is judged: a wrong
// setting refuses all of it at once.
func (g *refusalGuard) observe(provider, token string, o channel.Outcome, now time.Time) {
	if !answeredDevice(o) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	recent := slices.DeleteFunc(g.byProvider[provider], func(a deviceAnswer) bool { return a.token == token })
	recent = append(recent, deviceAnswer{token: token, at: now, refused: refusedDevice(o)})
	if len(recent) > refusalGuardRecent {
		recent = slices.Delete(recent, 0, len(recent)-refusalGuardRecent)
	}
	g.byProvider[provider] = recent
}

// holds reports whether provider refuses most devices of late (and so no
// refusal of it is to disable a device), with how many of how many.
func (g *refusalGuard) holds(provider string, now time.Time) (held bool, refused, answered int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, a := range g.byProvider[provider] {
		if now.Sub(a.at) > refusalGuardWindow {
			continue
		}
		answered++
		if a.refused {
			refused++
		}
	}
	return refused >= refusalGuardMin && 2*refused > answered, refused, answered
}
