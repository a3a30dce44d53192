package forward

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/spool"
)

// After an outage the backlog reaches Postgres in the order it was spooled,
// also when the oldest event failed many more times than the rest (a batch
// of its own, its backoff at the maximum, while newer events were taken
// after it and failed only once): a notification's created_at is when it
// reached Postgres, so one landing late would sit above newer ones in the
// feed. And the recovery is logged once, not once per worker.
func TestABacklogLandsInSpoolOrderAfterAnOutageAndItsRecoveryIsLoggedOnce(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.DB(t)
	proxy := newRefusingProxy(t, dbURL)
	h := newForwarderHarness(t, proxy.url)
	direct := pgtest.Connect(t, dbURL)
	logs := &logLines{t: t}
	f, err := New(Config{Spool: h.sp, DB: h.pool, Workers: 2, MinBackoff: 10 * time.Millisecond, MaxBackoff: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Stop(context.Background()) })
	f.Start(context.Background())
	ctx := context.Background()
	claim := func(i int) {
		ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":"backlog-%02d","type":"t","recipients":["u1"]}`, i), "")
		if err != nil {
			t.Error(err)
			return
		}
		h.claim(ev.IdempotencyKey, ev.Canonical())
	}
	attempts := func(key string) int {
		rows, err := h.sp.List(ctx, spool.AllRows, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Key == key {
				return r.Attempts
			}
		}
		return 0
	}

	proxy.refuse()
	claim(0)
	// Its backoff has grown to most of a second.
	testsignal.Eventually(t, "the first event to fail 8 times", 30*time.Second, func() bool { return attempts("backlog-00") >= 8 })
	var wg sync.WaitGroup
	for i := 1; i < 50; i++ {
		wg.Go(func() { claim(i) })
	}
	wg.Wait()
	testsignal.Eventually(t, "the newer events to be tried", 30*time.Second, func() bool { return attempts("backlog-01") >= 1 })
	proxy.accept()

	testsignal.Eventually(t, "the backlog to land and be acknowledged", 30*time.Second, func() bool {
		next, err := h.sp.NextBatch(ctx, 0, spool.BatchLimit{Rows: 1})
		return err == nil && len(next) == 0
	})
	if err := f.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	spooled, err := h.sp.List(ctx, spool.AllRows, 0)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, r := range spooled {
		want = append(want, r.Key)
	}
	rows, err := direct.Query(ctx, `SELECT idempotency_key, created_at FROM notifications ORDER BY created_at, id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	landedAt := map[string]time.Time{}
	for rows.Next() {
		var key string
		var at time.Time
		if err := rows.Scan(&key, &at); err != nil {
			t.Fatal(err)
		}
		got = append(got, key)
		landedAt[key] = at
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("the backlog reached Postgres in the order\n%v\nwant the spool's\n%v\n(the oldest landed %v after the next)",
			got, want, landedAt[want[0]].Sub(landedAt[want[1]]))
	}
	if n := logs.count(`msg="forwarding recovered"`); n != 1 {
		t.Errorf(`"forwarding recovered" logged %d times for one outage, want once`, n)
	}
}

// refusingProxy passes TCP connections through to Postgres until refuse is
// called; then it closes every connection through it and refuses new ones
// until accept: Postgres unreachable while it keeps running.
type refusingProxy struct {
	url    string // the database's URL through the proxy
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
}

func newRefusingProxy(t *testing.T, dbURL string) *refusingProxy {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &refusingProxy{target: u.Host, ln: ln, conns: map[net.Conn]bool{}}
	u.Host = ln.Addr().String()
	p.url = u.String()
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		ln.Close()
		p.refuse()
		p.wg.Wait()
	})
	return p
}

func (p *refusingProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			c.Close()
			up.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		p.wg.Go(func() { pipe(up, c) })
		p.wg.Go(func() { pipe(c, up) })
	}
}

// refuse breaks every connection through the proxy and refuses new ones.
func (p *refusingProxy) refuse() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// accept passes new connections through again.
func (p *refusingProxy) accept() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// logLines routes logs to t.Log and keeps them to count.
type logLines struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	l.mu.Lock()
	l.lines = append(l.lines, string(p))
	l.mu.Unlock()
	return len(p), nil
}

// count is how many lines hold s.
func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}
