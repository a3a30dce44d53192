package ratelimit

import (
	"fmt"
	"hash/maphash"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
)

var start = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

// newLimiter returns a limiter at rate on a fake clock at start.
func newLimiter(t testing.TB, name, rate string, maxKeys int) (*Limiter, *clock.Fake) {
	t.Helper()
	r, err := ParseRate(rate)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(start)
	l, err := New(Config{Name: name, Rate: r, MaxKeys: maxKeys, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return l, clk
}

// spend calls Allow until it refuses and returns how many it allowed.
func spend(l *Limiter, key string) int {
	for n := 0; ; n++ {
		if !l.Allow(key).Allowed {
			return n
		}
	}
}

func TestABurstIsServedThenRefusedWithTheWaitForOneUnit(t *testing.T) {
	t.Parallel()
	l, clk := newLimiter(t, "user", "5/h", 0) // a unit every 720s, 10 in the bucket
	for i := range 10 {
		d := l.Allow("alice")
		if !d.Allowed || d.Remaining != 9-i || d.RetryAfter != 0 {
			t.Fatalf("request %d: %+v, want allowed with %d left", i+1, d, 9-i)
		}
	}
	d := l.Allow("alice")
	if d.Allowed || d.Remaining != 0 || d.RetryAfter != 720*time.Second || d.Reset != d.RetryAfter {
		t.Fatalf("request 11: %+v, want refused, Retry-After 720s", d)
	}
	clk.Advance(700 * time.Second)
	if d := l.Allow("alice"); d.Allowed || d.RetryAfter != 20*time.Second {
		t.Fatalf("700s later: %+v, want refused, Retry-After 20s", d)
	}
	clk.Advance(20 * time.Second)
	if d := l.Allow("alice"); !d.Allowed || d.Remaining != 0 || d.Reset != 720*time.Second {
		t.Fatalf("720s later: %+v, want allowed with none left, the next in 720s", d)
	}
}

func TestRetryAfterIsRoundedUpToAWholeSecondAndNeverZero(t *testing.T) {
	t.Parallel()
	l, clk := newLimiter(t, "user", "100/m", 0) // a unit every 600ms
	if n := spend(l, "bob"); n != 200 {
		t.Fatalf("a full bucket served %d, want 200", n)
	}
	if d := l.Allow("bob"); d.RetryAfter != time.Second {
		t.Fatalf("600ms to wait: Retry-After %s, want 1s", d.RetryAfter)
	}
	clk.Advance(599 * time.Millisecond)
	if d := l.Allow("bob"); d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("1ms to wait: %+v, want refused, Retry-After 1s", d)
	}
	clk.Advance(time.Millisecond)
	if !l.Allow("bob").Allowed {
		t.Fatal("the unit that arrived was refused")
	}
}

func TestABucketRefillsAtTheRateUpToItsBurst(t *testing.T) {
	t.Parallel()
	l, clk := newLimiter(t, "user", "20/s", 0)
	if n := spend(l, "carol"); n != 40 {
		t.Fatalf("a full bucket served %d, want 40", n)
	}
	clk.Advance(time.Second)
	if n := spend(l, "carol"); n != 20 {
		t.Fatalf("a second later: served %d, want 20", n)
	}
	clk.Advance(75 * time.Millisecond)
	if n := spend(l, "carol"); n != 1 {
		t.Fatalf("75ms later: served %d, want the 1 whole unit", n)
	}
	clk.Advance(time.Hour)
	if n := spend(l, "carol"); n != 40 {
		t.Fatalf("an hour later: served %d, want the burst of 40 and no more", n)
	}
}

func TestResetIsTheWaitForTheNextUnit(t *testing.T) {
	t.Parallel()
	l, clk := newLimiter(t, "ip", "5/h", 0)
	l.Allow("198.51.100.7")
	clk.Advance(100 * time.Second)
	d := l.Allow("198.51.100.7") // 2 spent, 100s refilled: 620s to the next unit
	if d.Remaining != 8 || d.Reset != 620*time.Second {
		t.Errorf("got %+v, want 8 left and the next unit in 620s", d)
	}
}

func TestKeysHaveTheirOwnBuckets(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, "user", "20/s", 0)
	if n := spend(l, "alice"); n != 40 {
		t.Fatalf("alice served %d, want 40", n)
	}
	if d := l.Allow("bob"); !d.Allowed || d.Remaining != 39 {
		t.Fatalf("bob after alice spent hers: %+v, want allowed with 39 left", d)
	}
	if l.Allow("alice").Allowed {
		t.Fatal("bob's request refilled alice")
	}
}

func TestLongKeysAreStoredAsDigestsAndStayApart(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, "user", "1/h", 0)
	long := strings.Repeat("u", 1000)
	if !l.Allow(long+"1").Allowed || !l.Allow(long+"1").Allowed || l.Allow(long+"1").Allowed {
		t.Fatal("a long key is not limited like any other")
	}
	if !l.Allow(long + "2").Allowed {
		t.Fatal("two long keys that differ at the end share a bucket")
	}
	if !l.Allow(strings.Repeat("k", maxKeyLen)).Allowed {
		t.Fatal("a key of the longest stored length was refused")
	}
	for i := range l.shards {
		for k := range l.shards[i].m {
			if len(k) > maxKeyLen+1 {
				t.Errorf("stored a key of %d bytes", len(k))
			}
		}
	}
}

func TestTheKeyCapHoldsUnderAMillionDistinctKeys(t *testing.T) {
	t.Parallel()
	// The clock stands still, so every bucket stays in use and nothing is
	// trimmed: only the cap keeps the table from growing.
	l, _ := newLimiter(t, "ip", "20/s", 0)
	if l.perShard*len(l.shards) > DefaultMaxKeys {
		t.Fatalf("%d shards of %d exceed the cap", len(l.shards), l.perShard)
	}
	for i := range 1_000_000 {
		key := fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255)
		if !l.Allow(key).Allowed {
			t.Fatalf("new key %d refused: a flood must not lock out new keys", i)
		}
		s := &l.shards[maphash.String(l.seed, key)&l.mask]
		if n := len(s.m); n > l.perShard {
			t.Fatalf("after %d keys a shard holds %d, over its %d", i+1, n, l.perShard)
		}
		if i%50_000 == 0 {
			if n := l.Len(); n > DefaultMaxKeys {
				t.Fatalf("after %d keys: %d buckets, over the cap %d", i+1, n, DefaultMaxKeys)
			}
		}
	}
	if n := l.Len(); n != l.perShard*len(l.shards) {
		t.Errorf("after the flood: %d buckets, want every shard full (%d)", n, l.perShard*len(l.shards))
	}
	for i := range l.shards {
		if got := listLen(&l.shards[i]); got != len(l.shards[i].m) {
			t.Fatalf("shard %d: list of %d, map of %d", i, got, len(l.shards[i].m))
		}
	}
}

func TestASmallCapStillHoldsAndServes(t *testing.T) {
	t.Parallel()
	for _, maxKeys := range []int{1, 3, 64, 100} {
		l, _ := newLimiter(t, "ip", "1/h", maxKeys)
		for i := range 1000 {
			if !l.Allow(fmt.Sprint(i)).Allowed {
				t.Fatalf("cap %d: new key %d refused", maxKeys, i)
			}
			if n := l.Len(); n > maxKeys {
				t.Fatalf("cap %d: %d buckets", maxKeys, n)
			}
		}
	}
}

func TestBucketsFullAgainAreDroppedAsNewKeysArrive(t *testing.T) {
	t.Parallel()
	l, clk := newLimiter(t, "ip", "20/s", 0)
	for i := range 1000 {
		l.Allow(fmt.Sprint("old-", i))
	}
	spend(l, "busy")
	clk.Advance(time.Second) // the old keys' buckets are full again; busy's is not
	for i := range 10_000 {
		l.Allow(fmt.Sprint("new-", i))
	}
	if n := l.Len(); n != 10_001 {
		t.Errorf("%d buckets, want the 10,000 new and busy", n)
	}
	if n := spend(l, "busy"); n != 20 {
		t.Errorf("busy served %d after a second, want 20: its bucket was dropped while refilling", n)
	}
}

func TestAtTheCapARecentlyUsedKeyKeepsItsBucket(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, "ip", "1/h", 640) // 64 shards of 10
	spend(l, "hot")
	for i := range 10_000 {
		l.Allow(fmt.Sprint("flood-", i))
		if i%5 == 4 && l.Allow("hot").Allowed {
			t.Fatalf("after %d new keys the exhausted key was allowed: a flood reset it", i+1)
		}
	}
}

func TestAtTheCapTheLeastRecentlyUsedKeyStartsOver(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, "ip", "1/h", 640)
	spend(l, "cold")
	for i := range 10_000 {
		l.Allow(fmt.Sprint("flood-", i))
	}
	if !l.Allow("cold").Allowed {
		t.Fatal("the least recently used key kept its bucket through 10,000 new keys at a cap of 640")
	}
}

func TestConcurrentCallsNeverAdmitMoreThanBurstPlusRateTimesElapsed(t *testing.T) {
	t.Parallel()
	l, clk := newLimiter(t, "user", "20/s", 0) // a unit every 50ms
	const (
		workers = 8
		steps   = 200
		step    = 10 * time.Millisecond
	)
	bound := func(now time.Time) int64 { return 40 + int64(now.Sub(start)/(50*time.Millisecond)) }
	var admitted atomic.Int64
	// Empty the bucket first: time that passes over a full bucket refills
	// nothing, and the advancer may run before any worker.
	admitted.Add(int64(spend(l, "alice")))
	var done atomic.Bool
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for !done.Load() {
				if l.Allow("alice").Allowed {
					// Read the clock after counting: the bound then covers
					// every admission counted so far.
					if n := admitted.Add(1); n > bound(clk.Now()) {
						t.Errorf("%d admitted by %s, over the bound %d", n, clk.Now().Sub(start), bound(clk.Now()))
					}
				}
				l.Allow(fmt.Sprint("other-", w)) // other keys, other shards, same limiter
			}
		})
	}
	wg.Go(func() {
		defer done.Store(true)
		for range steps {
			clk.Advance(step)
			l.Len()
			runtime.Gosched()
		}
	})
	wg.Wait()
	total := admitted.Load() + int64(spend(l, "alice"))
	if want := bound(clk.Now()); total != want {
		t.Errorf("admitted %d in all, want exactly burst + rate × elapsed = %d", total, want)
	}
}

func TestANilLimiterAllowsEverything(t *testing.T) {
	t.Parallel()
	l, err := New(Config{Name: "ip", Rate: Rate{}})
	if err != nil || l != nil {
		t.Fatalf("New with the rate off = %v, %v; want nil, nil", l, err)
	}
	for range 1000 {
		if !l.Allow("x").Allowed {
			t.Fatal("a nil limiter refused")
		}
	}
	if l.Len() != 0 {
		t.Error("a nil limiter holds buckets")
	}
}

func TestConfigErrorsSayWhatToFix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg Config
		why string
	}{
		{Config{Rate: Rate{20, time.Second}}, "name is required"},
		{Config{Name: "usér", Rate: Rate{20, time.Second}}, "printable ASCII"},
		{Config{Name: "user\n", Rate: Rate{20, time.Second}}, "printable ASCII"},
		{Config{Name: "user", Rate: Rate{20, time.Second}, MaxKeys: -1}, "must not be negative"},
		{Config{Name: "user", Rate: Rate{20, 2 * time.Second}}, "Per must be"},
		{Config{Name: "user", Rate: Rate{-1, time.Second}}, "N must be"},
		{Config{Name: "user", Rate: Rate{MaxN + 1, time.Second}}, "N must be"},
	} {
		l, err := New(tc.cfg)
		if err == nil || l != nil || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("New(%+v) = %v, %v; want an error saying %q", tc.cfg, l, err, tc.why)
		}
	}
}

func listLen(s *shard) int {
	n := 0
	var prev *bucket
	for b := s.head; b != nil; b = b.next {
		if b.prev != prev {
			panic("broken list")
		}
		prev, n = b, n+1
	}
	if s.tail != prev {
		panic("tail is not the last bucket")
	}
	return n
}
