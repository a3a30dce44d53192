package preferences

import (
	"container/list"
	"time"
)

// prefsCacheSize is the most users whose external preferences are kept.
const prefsCacheSize = 100_000

// evictPerStore is the most expired answers one store drops.
const evictPerStore = 4

// prefsCache keeps the preference service's answers per user for ttl, and at
// most size of them. Every answer lives as long, so the order they were
// stored in is the order they expire in: a list in that order bounds the
// work of each store — it drops the expired answers at the list's front, at
// most evictPerStore of them, and the oldest one when the cache is full —
// where a scan of the whole map under the lock cost a store 100,000 looks
// once the cache was full. Not safe for concurrent use: its owner locks.
type prefsCache struct {
	size    int
	ttl     time.Duration
	entries map[string]*list.Element // of *prefsEntry
	order   *list.List               // of *prefsEntry, oldest (first to expire) first
	// examined counts the entries eviction looked at, for tests.
	examined int
}

type prefsEntry struct {
	user    string
	off     map[string]bool
	expires time.Time
}

func newPrefsCache(size int, ttl time.Duration) *prefsCache {
	return &prefsCache{size: size, ttl: ttl, entries: map[string]*list.Element{}, order: list.New()}
}

// get returns user's answer if it has not expired at now.
func (c *prefsCache) get(user string, now time.Time) (map[string]bool, bool) {
	el, ok := c.entries[user]
	if !ok {
		return nil, false
	}
	e := el.Value.(*prefsEntry)
	if !now.Before(e.expires) {
		return nil, false
	}
	return e.off, true
}

// put stores user's answer, got at now, and evicts what it must. now must
// not go back between calls (the owner reads the clock under its lock), or
// the list would not be in expiry order.
func (c *prefsCache) put(user string, off map[string]bool, now time.Time) {
	if el, ok := c.entries[user]; ok {
		e := el.Value.(*prefsEntry)
		e.off, e.expires = off, now.Add(c.ttl)
		c.order.MoveToBack(el)
	} else {
		c.entries[user] = c.order.PushBack(&prefsEntry{user: user, off: off, expires: now.Add(c.ttl)})
	}
	for range evictPerStore {
		front := c.order.Front()
		if front == nil {
			break
		}
		c.examined++
		if now.Before(front.Value.(*prefsEntry).expires) {
			break // the rest expire later still
		}
		c.remove(front)
	}
	for c.order.Len() > c.size {
		c.examined++
		c.remove(c.order.Front())
	}
}

func (c *prefsCache) remove(el *list.Element) {
	delete(c.entries, el.Value.(*prefsEntry).user)
	c.order.Remove(el)
}

// len is how many answers are kept, expired ones not yet evicted included.
func (c *prefsCache) len() int { return c.order.Len() }
