package main

import (
	"sync"
	"time"
)

// handovers records when app users were left without a device: another
// app took over their phone (its token moved to the other user) until
// they registered it again. A topic's batch writes no push work for a
// member without an enabled device, so a topic notification written
// meanwhile rightly has no dispatch.
type handovers struct {
	mu      sync.Mutex
	windows map[string][]handover
}

type handover struct{ from, to time.Time } // to zero: not registered again yet

func newHandovers() *handovers { return &handovers{windows: map[string][]handover{}} }

// lost: a take-over of user's token was asked at from (it may have
// committed whatever its answer).
func (h *handovers) lost(user string, from time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.windows[user] = append(h.windows[user], handover{from: from})
}

// regained: user's own registration was answered 200 at to.
func (h *handovers) regained(user string, to time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range h.windows[user] {
		if h.windows[user][i].to.IsZero() {
			h.windows[user][i].to = to
		}
	}
}

// handoverSlack covers a batch whose transaction began (its rows'
// created_at) before the take-over and read the devices after it.
const handoverSlack = 5 * time.Second

// deviceless reports whether user may have had no device at t.
func (h *handovers) deviceless(user string, t time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.windows[user] {
		if !t.Before(w.from.Add(-handoverSlack)) && (w.to.IsZero() || !t.After(w.to)) {
			return true
		}
	}
	return false
}
