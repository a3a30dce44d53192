package ratelimit

import (
	"cmp"
	"crypto/sha512"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
)

// DefaultMaxKeys is Config.MaxKeys when unset.
const DefaultMaxKeys = 100_000

const (
	// maxShards bounds the shards: enough that two cores rarely meet on one
	// mutex, few enough that a small MaxKeys still gives each shard room.
	maxShards = 64
	// maxKeyLen is the longest key stored as given; a longer one is stored as
	// digestMark and its SHA-512, 65 bytes, which no stored key can equal.
	maxKeyLen  = 64
	digestMark = "\xff"
)

// Config configures a Limiter.
type Config struct {
	// Name names the policy in the RateLimit-Policy and RateLimit fields
	// ("user", "ip"). Required: printable ASCII.
	Name string
	// Rate is each key's rate; its bucket holds Rate.Burst(). Zero (off): New
	// returns a nil Limiter, which allows everything.
	Rate Rate
	// MaxKeys caps the buckets held at once, and with them the memory (100 to
	// 165 bytes a bucket). Default DefaultMaxKeys (100,000).
	MaxKeys int
	// Clock tells the time. Default the wall clock.
	Clock clock.Clock
}

// Validate reports the first setting a user must fix.
func (c Config) Validate() error {
	switch {
	case c.Name == "":
		return errors.New("rate limit name is required: it names the policy in the RateLimit headers (e.g. \"user\")")
	case strings.IndexFunc(c.Name, func(r rune) bool { return r < 0x20 || r > 0x7e }) >= 0:
		return fmt.Errorf("rate limit name %q: use printable ASCII only, it is sent in a header", c.Name)
	case c.MaxKeys < 0:
		return fmt.Errorf("rate limit %s: max keys %d must not be negative (0 is the default, %d)", c.Name, c.MaxKeys, DefaultMaxKeys)
	}
	if err := c.Rate.validate(); err != nil {
		return fmt.Errorf("rate limit %s: %w", c.Name, err)
	}
	return nil
}

// Limiter holds a token bucket per key. Its methods are safe for concurrent
// use; a nil *Limiter allows everything.
type Limiter struct {
	clock    clock.Clock
	epoch    time.Time // bucket times are nanoseconds since
	interval int64     // nanoseconds between two units: Per/N, rounded up
	span     int64     // nanoseconds to refill an empty bucket: Burst × interval
	policy   *policy
	seed     maphash.Seed
	mask     uint64 // len(shards) - 1
	perShard int    // buckets a shard may hold
	shards   []shard
}

// policy is what every Decision of one Limiter writes in its header fields.
type policy struct {
	name  string // the sf-string naming the policy, quoted
	field string // the RateLimit-Policy field value
}

type shard struct {
	mu         sync.Mutex
	m          map[string]*bucket
	head, tail *bucket // most and least recently used
	_          [64]byte
}

// bucket is one key's token bucket as a GCRA: tat is the instant it is full
// again; the debt tat - now, in intervals, is the units spent and not yet
// refilled.
type bucket struct {
	key        string
	tat        int64
	prev, next *bucket // toward head, toward tail
}

// New returns a limiter for cfg, or nil (which allows everything) when
// cfg.Rate is off.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Rate.Off() {
		return nil, nil
	}
	cfg.MaxKeys = cmp.Or(cfg.MaxKeys, DefaultMaxKeys)
	cfg.Clock = clock.Or(cfg.Clock)
	n := maxShards
	for n > cfg.MaxKeys {
		n /= 2
	}
	per, burst := int64(cfg.Rate.Per), int64(cfg.Rate.Burst())
	interval := (per + int64(cfg.Rate.N) - 1) / int64(cfg.Rate.N)
	name := quote(cfg.Name)
	l := &Limiter{
		clock:    cfg.Clock,
		epoch:    cfg.Clock.Now(),
		interval: interval,
		span:     burst * interval,
		policy: &policy{
			name:  name,
			field: name + ";q=" + strconv.FormatInt(burst, 10) + ";w=" + strconv.FormatInt(2*per/int64(time.Second), 10),
		},
		seed:     maphash.MakeSeed(),
		mask:     uint64(n - 1),
		perShard: cfg.MaxKeys / n,
		shards:   make([]shard, n),
	}
	for i := range l.shards {
		l.shards[i].m = make(map[string]*bucket)
	}
	return l, nil
}

// Allow spends one unit of key's bucket if it holds one, and reports the
// outcome and what is left. A refused call spends nothing.
func (l *Limiter) Allow(key string) Decision {
	if l == nil {
		return Decision{Allowed: true}
	}
	if len(key) > maxKeyLen {
		sum := sha512.Sum512([]byte(key))
		key = digestMark + string(sum[:])
	}
	now := int64(l.clock.Now().Sub(l.epoch))
	s := &l.shards[maphash.String(l.seed, key)&l.mask]
	s.mu.Lock()
	s.trim(now)
	b := s.m[key]
	if b == nil {
		b = s.add(key, now, l.perShard)
	} else {
		s.toFront(b)
	}
	tat := max(b.tat, now)
	allowed := tat+l.interval-now <= l.span
	if allowed {
		tat += l.interval
		b.tat = tat
	}
	s.mu.Unlock()
	return l.decide(allowed, tat-now)
}

// decide describes a bucket left with debt nanoseconds to refill.
func (l *Limiter) decide(allowed bool, debt int64) Decision {
	d := Decision{Allowed: allowed, Remaining: int(max(0, (l.span-debt)/l.interval)), policy: l.policy}
	if allowed {
		// The next unit arrives when the debt next crosses a whole interval.
		next := debt % l.interval
		if next == 0 {
			next = l.interval
		}
		d.Reset = wholeSeconds(next)
		return d
	}
	// One unit is there once the debt is down to span - interval.
	d.RetryAfter = wholeSeconds(debt - (l.span - l.interval))
	d.Reset = d.RetryAfter
	return d
}

// Len returns how many buckets l holds: at most Config.MaxKeys.
func (l *Limiter) Len() int {
	if l == nil {
		return 0
	}
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// trim drops up to two buckets from the old end that are full again, which
// loses nothing: a new bucket starts full. Two a call, so the table shrinks
// back toward the keys in use while staying O(1).
func (s *shard) trim(now int64) {
	for range 2 {
		b := s.tail
		if b == nil || b.tat > now {
			return
		}
		s.remove(b)
	}
}

// add makes a full bucket for key, first evicting the least recently used
// bucket if the shard is at its cap.
func (s *shard) add(key string, now int64, limit int) *bucket {
	if len(s.m) >= limit {
		s.remove(s.tail)
	}
	b := &bucket{key: key, tat: now, next: s.head}
	if s.head != nil {
		s.head.prev = b
	} else {
		s.tail = b
	}
	s.head = b
	s.m[key] = b
	return b
}

func (s *shard) toFront(b *bucket) {
	if s.head == b {
		return
	}
	// b has a prev, being not the head.
	b.prev.next = b.next
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		s.tail = b.prev
	}
	b.prev, b.next = nil, s.head
	s.head.prev = b
	s.head = b
}

func (s *shard) remove(b *bucket) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		s.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		s.tail = b.prev
	}
	b.prev, b.next = nil, nil
	delete(s.m, b.key)
}

// wholeSeconds rounds ns up to whole seconds, at least one: what delay-seconds
// can say without promising a unit sooner than it arrives.
func wholeSeconds(ns int64) time.Duration {
	return time.Duration(max(1, (ns+int64(time.Second)-1)/int64(time.Second))) * time.Second
}

// quote spells name as a structured-field String (RFC 9651 section 3.3.3).
func quote(name string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		if name[i] == '"' || name[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(name[i])
	}
	b.WriteByte('"')
	return b.String()
}
