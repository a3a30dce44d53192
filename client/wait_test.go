package client

import (
	"testing"
	"time"
)

// A Retry-After is a floor for the wait, and the waits of producers turned
// away together are spread over the fifth above it.
func TestWaitsAfterRetryAfterAreNoShorterAndSpread(t *testing.T) {
	c, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	const retryAfter = 5 * time.Second
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for range 1000 {
		w := c.wait(1, retryAfter)
		lo, hi = min(lo, w), max(hi, w)
	}
	if lo < retryAfter || hi > retryAfter+retryAfter/5 {
		t.Errorf("waits from %s to %s; want within [5s, 6s]", lo, hi)
	}
	if hi-lo < retryAfter/10 {
		t.Errorf("waits from %s to %s; want them spread over the second above 5s", lo, hi)
	}
	for n := 1; n <= 10; n++ {
		if w := c.wait(n, 0); w < 0 || w > c.cfg.MaxBackoff {
			t.Errorf("wait before retry %d = %s; want within [0, %s]", n, w, c.cfg.MaxBackoff)
		}
	}
}
