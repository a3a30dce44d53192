package central

import (
	"container/list"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
)

// lsn is a position in Postgres's write-ahead log (a pg_lsn) as a number:
// what a standby must have replayed to show a write.
type lsn uint64

// unknownLSN stands for a write whose position could not be read after its
// commit: no standby has replayed it, so the reads it guards go to the
// primary until it expires.
const unknownLSN = lsn(1<<64 - 1)

var errBadLSN = errors.New("not a WAL position (want the pg_lsn form, such as 16/B374D848)")

// parseLSN reads a pg_lsn's text form: two hexadecimal numbers of at most
// 32 bits around a slash.
func parseLSN(s string) (lsn, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok || hi == "" || lo == "" || len(hi) > 8 || len(lo) > 8 {
		return 0, errBadLSN
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, errBadLSN
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, errBadLSN
	}
	return lsn(h<<32 | l), nil
}

// String is the pg_lsn text form, which Postgres parses back.
func (l lsn) String() string { return fmt.Sprintf("%X/%X", uint64(l)>>32, uint32(l)) }

// writePositions remembers the WAL position of each user's last write
// through this central replica, for a read-your-writes window (ttl), for
// clients that carry back neither the cookie nor the header. It keeps at
// most max users; one pushed out for room before its window ended still
// counts, as a floor every user's reads wait for until that window ends:
// under a burst of writers, reads go to the primary rather than back in time.
type writePositions struct {
	ttl   time.Duration
	max   int
	clock clock.Clock

	mu    sync.Mutex
	users map[string]*list.Element // of *written
	order *list.List               // of *written, oldest window end first
	floor written                  // user unset
}

// written is one user's last write: its position and when its window ends.
type written struct {
	user  string
	at    lsn
	until time.Time
}

func newWritePositions(ttl time.Duration, max int, clk clock.Clock) *writePositions {
	return &writePositions{ttl: ttl, max: max, clock: clk, users: map[string]*list.Element{}, order: list.New()}
}

// record notes that user wrote at position at, now.
func (p *writePositions) record(user string, at lsn) {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expire(now)
	until := now.Add(p.ttl)
	if e, ok := p.users[user]; ok {
		w := e.Value.(*written)
		w.at, w.until = max(w.at, at), until
		p.order.MoveToBack(e)
		return
	}
	p.users[user] = p.order.PushBack(&written{user: user, at: at, until: until})
	for p.order.Len() > p.max {
		w := p.order.Remove(p.order.Front()).(*written)
		delete(p.users, w.user)
		p.floor.at = max(p.floor.at, w.at)
		if w.until.After(p.floor.until) {
			p.floor.until = w.until
		}
	}
}

// lookup returns the position a read of user's must see: their last write
// within its window, or the floor; 0 when there is none.
func (p *writePositions) lookup(user string) lsn {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expire(now)
	var at lsn
	if e, ok := p.users[user]; ok {
		at = e.Value.(*written).at
	}
	if now.Before(p.floor.until) {
		at = max(at, p.floor.at)
	}
	return at
}

// expire drops the writes whose window has ended.
func (p *writePositions) expire(now time.Time) {
	for e := p.order.Front(); e != nil && !now.Before(e.Value.(*written).until); e = p.order.Front() {
		delete(p.users, p.order.Remove(e).(*written).user)
	}
	if !now.Before(p.floor.until) {
		p.floor = written{}
	}
}
