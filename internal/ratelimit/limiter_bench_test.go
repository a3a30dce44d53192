package ratelimit

import (
	"fmt"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
)

// standingClock is a clock that reads without a lock, unlike clock.Fake, so
// that the benchmarks measure the limiter and not the fake clock's mutex.
type standingClock struct{ t time.Time }

func (c standingClock) Now() time.Time                            { return c.t }
func (standingClock) NewTimer(time.Duration) clock.Timer          { panic("unused") }
func (standingClock) AfterFunc(time.Duration, func()) clock.Timer { panic("unused") }

// benchLimiter returns a limiter at n an hour, on clk.
func benchLimiter(b *testing.B, n int, clk clock.Clock) *Limiter {
	l, err := New(Config{Name: "user", Rate: Rate{n, time.Hour}, Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	return l
}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%08d", i)
	}
	return keys
}

// BenchmarkAllow is the allowed path: one key every goroutine shares, and
// many keys spread over the shards; on the standing clock and on the wall
// clock. The rates are high enough that no call is refused, and, on the wall
// clock, low enough that no bucket is full again (and dropped) before its
// key comes round again, so that this is the path of a key in use.
func BenchmarkAllow(b *testing.B) {
	for _, bc := range []struct {
		name string
		keys int
		n    int // an hour
		clk  clock.Clock
	}{
		{"one-key", 1, MaxN, standingClock{start}},
		{"50k-keys", 50_000, 100_000, standingClock{start}},
		{"one-key/real-clock", 1, MaxN, clock.Real{}},
		{"50k-keys/real-clock", 50_000, 100_000, clock.Real{}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := benchLimiter(b, bc.n, bc.clk)
			keys := benchKeys(bc.keys)
			for _, k := range keys {
				l.Allow(k)
			}
			var refused, next atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(7919)) // each goroutine starts elsewhere
				for pb.Next() {
					if !l.Allow(keys[i%len(keys)]).Allowed {
						refused.Add(1)
					}
					i++
				}
			})
			if n := refused.Load(); n > 0 {
				b.Fatalf("%d refused: not the allowed path", n)
			}
			if n := l.Len(); n != bc.keys {
				b.Fatalf("%d buckets, want %d: buckets were dropped and made again", n, bc.keys)
			}
		})
	}
}

// BenchmarkAllowNewKeyAtTheCap is a flood: every call a key never seen, the
// table at its cap, so each call evicts.
func BenchmarkAllowNewKeyAtTheCap(b *testing.B) {
	l := benchLimiter(b, MaxN, standingClock{start})
	for _, k := range benchKeys(DefaultMaxKeys * 2) {
		l.Allow(k)
	}
	keys := make([]string, 1<<20)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.%d.%d.%d", 100+i>>16, (i>>8)&255, i&255)
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			// Past 1<<20 calls keys repeat, but by then each was evicted long ago.
			l.Allow(keys[int(next.Add(1))&(len(keys)-1)])
		}
	})
}

// BenchmarkSetHeaders is the cost of the fields on an answer.
func BenchmarkSetHeaders(b *testing.B) {
	l := benchLimiter(b, MaxN, standingClock{start})
	d := l.Allow("alice")
	h := http.Header{}
	b.ReportAllocs()
	for b.Loop() {
		d.SetHeaders(h)
	}
}

// BenchmarkMemoryPerKey reports the heap a full table takes per bucket, the
// key included: keys like IPv4 addresses, and keys over maxKeyLen, which are
// stored as their 65-byte digest form, the longest a stored key can be.
func BenchmarkMemoryPerKey(b *testing.B) {
	for _, bc := range []struct {
		name string
		key  func(i int) string
	}{
		{"ipv4", func(i int) string { return fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255) }},
		{"long", func(i int) string { return fmt.Sprintf("%0100d", i) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			keys := make([]string, DefaultMaxKeys)
			for i := range keys {
				keys[i] = bc.key(i)
			}
			var perKey float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				l := benchLimiter(b, MaxN, standingClock{start})
				for _, k := range keys {
					l.Allow(string([]byte(k))) // a fresh copy, as a request's key would be
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perKey = float64(after.HeapAlloc-before.HeapAlloc) / float64(l.Len())
				runtime.KeepAlive(l)
			}
			b.ReportMetric(perKey, "B/key")
		})
	}
}
