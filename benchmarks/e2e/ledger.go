package main

// The ledger: every event the generator sent, and when each of its frames
// and pushes arrived. Events are found by a sequence number the generator
// puts at the head of the title ("#123 …"), which both the frame and the
// push carry.

import (
	"strconv"
	"strings"
	"sync"
	"time"
)

// event is one POST and what came of it.
type event struct {
	seq        int
	due        time.Time // when the open-loop schedule wanted it sent
	began      time.Time // when the generator began the POST
	answered   time.Time // when the relay's answer came
	status     int       // 0 when the request failed
	recipients []int     // user indices
	// createdAt is the notification's created_at as the first frame carried
	// it: its ingest transaction's start.
	createdAt time.Time
	frames    []arrivals // per recipient, in recipients' order
	pushes    []arrivals
}

// arrivals is when the first of something arrived, and how many did.
type arrivals struct {
	first time.Time
	n     int
}

func (e *event) accepted() bool { return e.status/100 == 2 }

func (e *event) recipient(user int) int {
	for i, u := range e.recipients {
		if u == user {
			return i
		}
	}
	return -1
}

// ledger holds every event of the run, by seq.
type ledger struct {
	mu     sync.Mutex
	events []*event
	// strays are frames or pushes the ledger could not place: no seq in the
	// title, an unknown seq, or a user the event did not name.
	strays int
}

// add appends events for seqs from len(events) on, and returns them.
func (l *ledger) add(n int) []*event {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*event, n)
	for i := range out {
		out[i] = &event{seq: len(l.events)}
		l.events = append(l.events, out[i])
	}
	return out
}

// seqOf reads the seq at the head of a title.
func seqOf(title string) (int, bool) {
	rest, ok := strings.CutPrefix(title, "#")
	if !ok {
		return 0, false
	}
	num, _, _ := strings.Cut(rest, " ")
	n, err := strconv.Atoi(num)
	return n, err == nil
}

// place finds the event and recipient slot of a frame or push.
func (l *ledger) place(title string, user int) (*event, int) {
	seq, ok := seqOf(title)
	if !ok || seq < 0 || seq >= len(l.events) {
		return nil, -1
	}
	e := l.events[seq]
	return e, e.recipient(user)
}

// frame notes a notification frame that reached user's socket at at.
func (l *ledger) frame(title string, user int, at, createdAt time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, i := l.place(title, user)
	if i < 0 || e.frames == nil {
		l.strays++
		return
	}
	if e.frames[i].n == 0 {
		e.frames[i].first = at
	}
	e.frames[i].n++
	if e.createdAt.IsZero() {
		e.createdAt = createdAt
	}
}

// push notes a push request to user's device that reached Expo at at.
func (l *ledger) push(title string, user int, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, i := l.place(title, user)
	if i < 0 || e.pushes == nil {
		l.strays++
		return
	}
	if e.pushes[i].n == 0 {
		e.pushes[i].first = at
	}
	e.pushes[i].n++
}

// outstanding counts the frames and pushes of accepted events among evs
// that have not arrived yet.
func (l *ledger) outstanding(evs []*event) (frames, pushes int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range evs {
		if !e.accepted() {
			continue
		}
		for i := range e.recipients {
			if e.frames[i].n == 0 {
				frames++
			}
			if e.pushes[i].n == 0 {
				pushes++
			}
		}
	}
	return frames, pushes
}
