package preferences

import (
	"fmt"
	"testing"
	"time"
)

// fill stores n answers, all at now, in a new cache of size.
func fill(size, n int, now time.Time) *prefsCache {
	c := newPrefsCache(size, time.Minute)
	for i := range n {
		c.put(fmt.Sprint("u", i), nil, now)
	}
	return c
}

func TestAPreferenceCacheStoreLooksAtAFewEntriesWhateverTheCacheHolds(t *testing.T) {
	t.Parallel()
	const stores = 10_000
	start := time.Unix(0, 0)
	for _, size := range []int{1_000, prefsCacheSize} {
		t.Run(fmt.Sprintf("full at %d, nothing expired", size), func(t *testing.T) {
			t.Parallel()
			c := fill(size, size, start)
			c.examined = 0
			for i := range stores {
				c.put(fmt.Sprint("new", i), nil, start)
			}
			// One look to learn the oldest has not expired, one to drop it.
			if per := float64(c.examined) / stores; per > 2 {
				t.Errorf("a store at the bound looked at %.1f entries; want at most 2, whatever the size", per)
			}
			if c.len() != size {
				t.Errorf("the cache holds %d answers; want its bound, %d", c.len(), size)
			}
			if _, ok := c.get("u0", start); ok {
				t.Error("the oldest answer is still kept past the bound")
			}
			if _, ok := c.get(fmt.Sprint("new", stores-1), start); !ok {
				t.Error("the newest answer is not kept")
			}
		})
		t.Run(fmt.Sprintf("full at %d, everything expired", size), func(t *testing.T) {
			t.Parallel()
			c := fill(size, size, start)
			c.examined = 0
			later := start.Add(time.Hour)
			for i := range stores {
				c.put(fmt.Sprint("new", i), nil, later)
			}
			if per := float64(c.examined) / stores; per > evictPerStore {
				t.Errorf("a store among expired answers looked at %.1f entries; want at most %d", per, evictPerStore)
			}
			// Each store drops up to evictPerStore expired answers: they go
			// faster than new ones come.
			if want := max(stores, size+stores-evictPerStore*stores); c.len() > want {
				t.Errorf("the cache holds %d answers; want at most %d", c.len(), want)
			}
		})
	}
}

func TestAPreferenceCacheAnswerStoredAgainLivesAnotherTTL(t *testing.T) {
	t.Parallel()
	start := time.Unix(0, 0)
	c := newPrefsCache(2, time.Minute)
	c.put("a", map[string]bool{"x": true}, start)
	c.put("b", nil, start.Add(time.Second))
	if _, ok := c.get("a", start.Add(time.Minute)); ok {
		t.Error("an answer is served after its TTL")
	}
	c.put("a", nil, start.Add(time.Minute)) // asked again: now the newest
	c.put("c", nil, start.Add(time.Minute))
	if _, ok := c.get("b", start.Add(time.Minute)); ok {
		t.Error("b, expired and the oldest, is kept")
	}
	if off, ok := c.get("a", start.Add(90*time.Second)); !ok || off != nil {
		t.Errorf("a stored again = %v, %v; want the new answer, kept a TTL from its new store", off, ok)
	}
}
