package central_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/nodetest"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// balancer is a load balancer in front of replicas, at the TCP level: new
// connections go to its current target; it can cut every connection at once
// (a network drop: no close event) and hold new ones until released, so
// that what a test commits meanwhile is surely committed while the client
// is away.
type balancer struct {
	t  *testing.T
	ln net.Listener

	mu     sync.Mutex
	target string
	gate   chan struct{} // closed while connections pass
	conns  []net.Conn
	heads  []string // the first bytes each client sent: its request's head
}

func newBalancer(t *testing.T, target string) *balancer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &balancer{t: t, ln: ln, target: strings.TrimPrefix(target, "http://"), gate: make(chan struct{})}
	close(b.gate)
	t.Cleanup(func() { ln.Close(); b.cut() })
	go b.serve()
	return b
}

func (b *balancer) url() string { return "http://" + b.ln.Addr().String() }

func (b *balancer) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		go b.pipe(c)
	}
}

func (b *balancer) pipe(c net.Conn) {
	b.mu.Lock()
	gate := b.gate
	b.conns = append(b.conns, c)
	b.mu.Unlock()
	<-gate
	b.mu.Lock()
	target := b.target
	b.mu.Unlock()
	up, err := net.Dial("tcp", target)
	if err != nil {
		c.Close()
		return
	}
	b.mu.Lock()
	b.conns = append(b.conns, up)
	b.mu.Unlock()
	go func() {
		defer up.Close()
		buf := make([]byte, 4096)
		n, err := c.Read(buf)
		b.mu.Lock()
		b.heads = append(b.heads, string(buf[:n]))
		b.mu.Unlock()
		if _, werr := up.Write(buf[:n]); err != nil || werr != nil {
			return
		}
		_, _ = io.Copy(up, c)
	}()
	defer c.Close()
	_, _ = io.Copy(c, up)
}

// to sends new connections to target.
func (b *balancer) to(target string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.target = strings.TrimPrefix(target, "http://")
}

// hold keeps new connections waiting until release.
func (b *balancer) hold() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gate = make(chan struct{})
}

func (b *balancer) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.gate)
}

// cut closes every connection, as a dropped network does.
func (b *balancer) cut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		c.Close()
	}
	b.conns = nil
}

// lastEventIDs are the Last-Event-ID headers of the stream requests the
// balancer passed, in order ("" for a request without one).
func (b *balancer) lastEventIDs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, h := range b.heads {
		if !strings.HasPrefix(h, "GET /v1/stream") {
			continue
		}
		id := ""
		for line := range strings.SplitSeq(h, "\r\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(k, "Last-Event-ID") {
				id = strings.TrimSpace(v)
			}
		}
		out = append(out, id)
	}
	return out
}

// followed is one line the eventsource script printed.
type followed struct {
	Event string `json:"event"`
	ID    string `json:"id"`
	Code  *int   `json:"code"`
	Data  struct {
		Type   string `json:"type"`
		Cursor string `json:"cursor"`
		Code   int    `json:"code"`
		Data   struct {
			Title string `json:"title"`
		} `json:"data"`
	} `json:"data"`
	raw string
}

// follower runs testdata/eventsource/follow.mjs against base for user and
// gives what it prints.
type follower struct {
	t     *testing.T
	lines chan followed
	seen  []followed
}

func follow(t *testing.T, base, token, auth string, notifications int) *follower {
	t.Helper()
	node := nodetest.Node(t)
	nodetest.Install(t, "testdata/eventsource")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, node, "testdata/eventsource/follow.mjs")
	cmd.Env = append(os.Environ(), "SPOOLCAST_BASE="+base, "SPOOLCAST_TOKEN="+token, "SPOOLCAST_AUTH="+auth,
		fmt.Sprintf("SPOOLCAST_NOTIFICATIONS=%d", notifications))
	cmd.Stderr = &testWriter{t}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f := &follower{t: t, lines: make(chan followed, 1024)}
	go func() {
		defer close(f.lines)
		s := bufio.NewScanner(out)
		s.Buffer(make([]byte, 1<<20), 1<<20)
		for s.Scan() {
			var l followed
			if err := json.Unmarshal(s.Bytes(), &l); err != nil {
				l.Event = "unparsed"
			}
			l.raw = s.Text()
			f.lines <- l
		}
	}()
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	return f
}

// until reads lines until one satisfies ok, failing after 30 s or at the
// script's end.
func (f *follower) until(what string, ok func(followed) bool) followed {
	f.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, open := <-f.lines:
			if !open {
				f.t.Fatalf("the script ended before %s; it printed:\n%s", what, f.printed())
			}
			f.seen = append(f.seen, l)
			if l.Event == "fatal" || l.Event == "unparsed" {
				f.t.Fatalf("the script: %s", l.raw)
			}
			if ok(l) {
				return l
			}
		case <-timeout:
			f.t.Fatalf("no %s within 30 s; the script printed:\n%s", what, f.printed())
		}
	}
}

func (f *follower) printed() string {
	var b strings.Builder
	for _, l := range f.seen {
		b.WriteString(l.raw + "\n")
	}
	return b.String()
}

func (f *follower) ready() followed {
	f.t.Helper()
	return f.until("a ready frame", func(l followed) bool { return l.Event == "message" && l.Data.Type == "ready" })
}

func (f *follower) notifications(n int) {
	f.t.Helper()
	for range n {
		f.until("a notification", func(l followed) bool { return l.Event == "message" && l.Data.Type == "notification" })
	}
}

// titles are the notifications the script got, in order.
func (f *follower) titles() []string {
	var out []string
	for _, l := range f.seen {
		if l.Event == "message" && l.Data.Type == "notification" {
			out = append(out, l.Data.Data.Title)
		}
	}
	return out
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Logf("follow.mjs: %s", strings.TrimSpace(string(p)))
	return len(p), nil
}

// emit commits n notifications for user titled prefix-0… in one
// transaction, and wakes the replicas.
func emit(t *testing.T, db ingest.DB, wake *pgxpool.Pool, prefix, user string, n int) {
	t.Helper()
	var items []ingest.Item
	for i := range n {
		ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":"%s-%d","type":"t","recipients":[%q],"title":"%s-%d"}`, prefix, i, user, prefix, i), "")
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, ingest.Item{Producer: "p", Event: ev})
	}
	if _, err := ingest.Ingest(context.Background(), db, items); err != nil {
		t.Fatal(err)
	}
	if err := ingest.WakeUp(context.Background(), wake); err != nil {
		t.Fatal(err)
	}
}

// The eventsource npm package, an SSE client we did not write, follows the
// stream through a load balancer across a replica's shutdown (a close event
// of code 1001; the balancer sends the reconnect to the other replica) and a
// dropped network (no close event), with notifications committed while it
// was away, two of them by transactions that commit in the other order than
// they started: its own reconnects send Last-Event-ID, and it gets every
// notification once, in commit order.
func TestTheEventsourcePackageResumesWithLastEventIDAcrossReplicasAndDrops(t *testing.T) {
	t.Parallel()
	a := newHarness(t, options{live: true})
	b := newHarness(t, options{live: true, pool: a.pool, iss: a.iss})
	lb := newBalancer(t, a.url)
	f := follow(t, lb.url(), a.iss.Token("u1"), "header", 11)
	f.ready()
	emit(t, a.pool, a.pool, "live", "u1", 3)
	f.notifications(3)
	ids := []string{f.seen[len(f.seen)-1].ID}

	// Replica a shuts down; the balancer holds the reconnect until what
	// commits while the app is away has committed, then sends it to b.
	lb.hold()
	lb.to(b.url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.hub.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	closed := f.until("the close event", func(l followed) bool { return l.Event == "message" && l.Data.Type == "close" })
	// The close event has no id: the package reconnects with the last one
	// (see lastEventIDs below).
	if closed.Data.Code != 1001 || closed.ID != "" {
		t.Errorf("close event %s; want code 1001 and no id of its own", closed.raw)
	}
	emit(t, a.pool, a.pool, "away", "u1", 3)
	open, err := a.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(context.Background())
	var late []ingest.Item
	ev, _ := event.Decode([]byte(`{"idempotency_key":"late","type":"t","recipients":["u1"],"title":"late"}`), "")
	late = append(late, ingest.Item{Producer: "p", Event: ev})
	if _, err := ingest.Ingest(ctx, open, late); err != nil {
		t.Fatal(err)
	}
	emit(t, a.pool, a.pool, "early", "u1", 1)
	lb.release()
	f.ready()
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_ = ingest.WakeUp(ctx, a.pool)
	f.notifications(2)
	ids = append(ids, f.seen[len(f.seen)-1].ID)

	// The network drops: no close event.
	lb.hold()
	lb.cut()
	emit(t, a.pool, a.pool, "dropped", "u1", 2)
	lb.release()
	f.ready()
	emit(t, a.pool, a.pool, "final", "u1", 1)
	f.until("the end", func(l followed) bool { return l.Event == "done" })

	want := []string{"live-0", "live-1", "live-2", "away-0", "away-1", "away-2", "late", "early-0", "dropped-0", "dropped-1", "final-0"}
	if got := f.titles(); !slices.Equal(got, want) {
		t.Errorf("the eventsource package got %v; want each once, in commit order: %v\n%s", got, want, f.printed())
	}
	if got := lb.lastEventIDs(); !slices.Equal(got, []string{"", ids[0], ids[1]}) {
		t.Errorf("Last-Event-ID of its requests %q; want none, then the id of the last notification before each drop %q", got, ids)
	}
	for _, l := range f.seen {
		if l.Event == "message" && (l.Data.Type == "notification" || l.Data.Type == "ready") && l.ID != l.Data.Cursor {
			t.Errorf("event id %q of %s; want its cursor", l.ID, l.raw)
		}
	}
}

// A browser's EventSource opens with a ticket; its own reconnect repeats
// the used ticket and is refused 401, and the app opens a new EventSource
// with a new ticket and after=<its last event id>: nothing is missed or
// repeated.
func TestTheEventsourcePackageWithATicketResumesThroughANewTicket(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{live: true})
	lb := newBalancer(t, h.url)
	f := follow(t, lb.url(), h.iss.Token("u1"), "ticket", 5)
	f.ready()
	emit(t, h.pool, h.pool, "before", "u1", 2)
	f.notifications(2)
	lb.hold()
	lb.cut()
	emit(t, h.pool, h.pool, "away", "u1", 2)
	lb.release()
	f.until("the used ticket refused", func(l followed) bool { return l.Event == "error" && l.Code != nil && *l.Code == 401 })
	f.until("a new EventSource", func(l followed) bool { return l.Event == "reopen" })
	f.ready()
	emit(t, h.pool, h.pool, "after", "u1", 1)
	f.until("the end", func(l followed) bool { return l.Event == "done" })
	want := []string{"before-0", "before-1", "away-0", "away-1", "after-0"}
	if got := f.titles(); !slices.Equal(got, want) {
		t.Errorf("got %v; want %v\n%s", got, want, f.printed())
	}
}
