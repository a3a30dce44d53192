package live_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/pglisten"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/wsclient"
	"github.com/spoolcast/spoolcast/live"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// stack is one hub over a test database, served over loopback HTTP. The
// token a client sends is its user id: authentication is central's part.
type stack struct {
	t       *testing.T
	url     string // the database
	pool    *pgxpool.Pool
	reader  *pgxpool.Pool // the reader's own connection (newCentralStack)
	resumes *pgxpool.Pool // the hub's DB (newCentralStack)
	hub     *live.Hub
	metrics *live.Metrics
	reg     *prometheus.Registry
	base    string
}

func newStack(t *testing.T, tweak func(*live.Config)) *stack {
	t.Helper()
	return newStackOn(t, pgtest.DB(t), tweak)
}

func newStackOn(t *testing.T, url string, tweak func(*live.Config)) *stack {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return serve(t, url, pool, tweak)
}

// newCentralStack is a hub wired as central wires it, on dbURL, with its
// pools reaching Postgres at poolURL (PgBouncer, or dbURL itself): the
// resumes on a pool that prepares their statements, the reader on a
// connection of its own that prepares its statements with generic plans,
// where the connections allow it (pgpool.PreparedAuto).
func newCentralStack(t *testing.T, dbURL, poolURL string) *stack {
	t.Helper()
	pool := open(t, pgpool.Config{URL: poolURL, MaxConns: 4, Prepare: live.ResumeStatements()})
	reader := open(t, pgpool.Config{URL: poolURL, MaxConns: 1, Prepare: live.ReaderStatements(), GenericPlans: true})
	direct := pgtest.Connect(t, dbURL) // ingest and wake-ups, as a relay's forwarder
	s := serve(t, dbURL, direct, func(c *live.Config) { c.DB, c.ReaderDB = pool, reader })
	s.reader, s.resumes = reader, pool
	return s
}

// serve starts a hub on pool (and what tweak changes) and serves it.
func serve(t *testing.T, url string, pool *pgxpool.Pool, tweak func(*live.Config)) *stack {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := live.Config{DB: pool, PollInterval: 50 * time.Millisecond, Metrics: live.NewMetrics(reg), Logger: slog.New(slog.DiscardHandler)}
	if tweak != nil {
		tweak(&cfg)
	}
	hub, err := live.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hub.Start(context.Background())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hub.Shutdown(ctx)
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, err := auth.WebSocketToken(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		hub.Serve(w, r, user)
	}))
	t.Cleanup(srv.Close)
	s := &stack{t: t, url: url, pool: pool, hub: hub, metrics: cfg.Metrics, reg: reg, base: srv.URL}
	testsignal.Eventually(t, "the hub to become ready", 10*time.Second, hub.Ready)
	return s
}

// open opens a pool as central does, closed when the test ends.
func open(t *testing.T, cfg pgpool.Config) *pgxpool.Pool {
	t.Helper()
	pool, err := pgpool.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// items makes n events for user, keyed prefix-0…
func items(t testing.TB, prefix, user string, n int) []ingest.Item {
	t.Helper()
	var out []ingest.Item
	for i := range n {
		ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":"%s-%d","type":"t","recipients":[%q],"title":"%s-%d"}`, prefix, i, user, prefix, i), "")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ingest.Item{Producer: "p", Event: ev})
	}
	return out
}

// ingest commits events in one transaction and wakes the readers.
func (s *stack) ingest(db ingest.DB, its []ingest.Item) {
	s.t.Helper()
	if _, err := ingest.Ingest(context.Background(), db, its); err != nil {
		s.t.Fatal(err)
	}
	if err := ingest.WakeUp(context.Background(), s.pool); err != nil {
		s.t.Fatal(err)
	}
}

func (s *stack) dial(user, after string) *wsclient.Conn {
	s.t.Helper()
	c, err := wsclient.Dial(context.Background(), s.base, user, after)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close() })
	return c
}

// stream is a stream's client: a WebSocket (wsclient) or an event stream
// (sseclient).
type stream interface {
	Next(d time.Duration) (wsclient.Message, error)
}

// ready dials and reads up to the ready frame, returning the notifications
// before it and the ready cursor.
func (s *stack) ready(c stream) (resumed []wsclient.Message, cursor string) {
	s.t.Helper()
	for {
		m, err := c.Next(10 * time.Second)
		if err != nil {
			s.t.Fatalf("before ready: %v", err)
		}
		if m.Type == "ready" {
			return resumed, m.Cursor
		}
		resumed = append(resumed, m)
	}
}

// next reads n frames of type typ, failing on anything else.
func next(t *testing.T, c stream, typ string, n int) []wsclient.Message {
	t.Helper()
	var out []wsclient.Message
	for len(out) < n {
		m, err := c.Next(10 * time.Second)
		if err != nil {
			t.Fatalf("after %d of %d %s frames: %v", len(out), n, typ, err)
		}
		if m.Type != typ {
			t.Fatalf("frame %s, want %s", m.Raw, typ)
		}
		out = append(out, m)
	}
	return out
}

// quiet asserts that no frame arrives within d.
func quiet(t *testing.T, c stream, d time.Duration) {
	t.Helper()
	if m, err := c.Next(d); err == nil {
		t.Fatalf("unexpected frame %s", m.Raw)
	}
}

func titles(t *testing.T, ms []wsclient.Message) []string {
	t.Helper()
	var out []string
	for _, m := range ms {
		it, err := m.Item()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, it.Title)
	}
	return out
}

func TestANotificationReachesEverySocketOfItsUserOnce(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	phone, laptop, other := s.dial("u1", ""), s.dial("u1", ""), s.dial("u2", "")
	for _, c := range []*wsclient.Conn{phone, laptop, other} {
		if resumed, cursor := s.ready(c); len(resumed) != 0 || cursor == "" {
			t.Fatalf("a fresh socket got %d frames before ready, cursor %q", len(resumed), cursor)
		}
		if c.Protocol != wsclient.Protocol {
			t.Errorf("subprotocol %q, want only %q", c.Protocol, wsclient.Protocol)
		}
	}
	s.ingest(s.pool, items(t, "a", "u1", 1))
	for _, c := range []*wsclient.Conn{phone, laptop} {
		got := next(t, c, "notification", 1)
		var frame struct {
			Data   feed.Item `json:"data"`
			Cursor string    `json:"cursor"`
		}
		if err := json.Unmarshal(got[0].Raw, &frame); err != nil {
			t.Fatal(err)
		}
		if frame.Data.Title != "a-0" || frame.Data.ID == "" || frame.Cursor == "" || frame.Data.CreatedAt.IsZero() {
			t.Errorf("frame %s", got[0].Raw)
		}
		if _, err := live.ParseCursor(frame.Cursor); err != nil {
			t.Errorf("cursor %q: %v", frame.Cursor, err)
		}
		quiet(t, c, 300*time.Millisecond) // exactly once
	}
	quiet(t, other, 100*time.Millisecond)
	if n := testutil.ToFloat64(s.metrics.Connections()); n != 3 {
		t.Errorf("spoolcast_ws_connections = %v, want 3", n)
	}
}

func TestReconnectingInTheMiddleOfABurstMissesNothingAndRepeatsNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	c := s.dial("u1", "")
	s.ready(c)
	const burst, batch = 1000, 10
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Ten writers at once, so transactions commit out of their start order.
		var wg sync.WaitGroup
		for w := range burst / batch / 10 {
			wg.Go(func() {
				for b := range 10 {
					lo := (w*10 + b) * batch
					var its []ingest.Item
					for i := lo; i < lo+batch; i++ {
						its = append(its, items(t, fmt.Sprintf("b%d", i), "u1", 1)...)
					}
					if _, err := ingest.Ingest(context.Background(), s.pool, its); err != nil {
						t.Error(err)
						return
					}
					_ = ingest.WakeUp(context.Background(), s.pool)
				}
			})
		}
		wg.Wait()
	}()
	var got []wsclient.Message
	got = append(got, next(t, c, "notification", 137)...)
	c.Close() // a dropped network: no close frame
	last := got[len(got)-1].Cursor
	c = s.dial("u1", last)
	resumed, _ := s.ready(c)
	got = append(got, resumed...)
	<-done
	if rest := burst - len(got); rest > 0 {
		got = append(got, next(t, c, "notification", rest)...)
	}
	quiet(t, c, 300*time.Millisecond)
	seen := map[string]bool{}
	for _, title := range titles(t, got) {
		if seen[title] {
			t.Fatalf("%s sent twice", title)
		}
		seen[title] = true
	}
	if len(seen) != burst {
		t.Fatalf("%d distinct notifications, want %d", len(seen), burst)
	}
	// In order: each frame's cursor after the one before.
	var prev live.Cursor
	for i, m := range got {
		cur, err := live.ParseCursor(m.Cursor)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && !prev.Less(cur.Position) {
			t.Fatalf("frame %d at %+v does not come after %+v", i, cur.Position, prev.Position)
		}
		prev = cur
	}
}

func TestARowThatCommitsLateIsSentNotSkipped(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	c := s.dial("u1", "")
	s.ready(c)
	ctx := context.Background()
	// A starts first and takes the lower transaction id, B commits first.
	a, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Rollback(ctx)
	if _, err := ingest.Ingest(ctx, a, items(t, "late", "u1", 1)); err != nil {
		t.Fatal(err)
	}
	s.ingest(s.pool, items(t, "early", "u1", 1))
	// B waits behind A: sending it now and A later would put A behind a
	// cursor the app already holds.
	quiet(t, c, 400*time.Millisecond)
	if held := testutil.ToFloat64(s.metrics.Held()); held <= 0 {
		t.Errorf("spoolcast_live_held_seconds = %v while B waits behind A", held)
	}
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_ = ingest.WakeUp(ctx, s.pool)
	if got := titles(t, next(t, c, "notification", 2)); !slices.Equal(got, []string{"late-0", "early-0"}) {
		t.Errorf("frames %v, want the late commit first (commit-safe order)", got)
	}
}

func TestResumeWhileAnOlderTransactionIsOpenMissesNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	ctx := context.Background()
	c := s.dial("u1", "")
	_, cursor := s.ready(c)
	s.ingest(s.pool, items(t, "seen", "u1", 1))
	cursor = next(t, c, "notification", 1)[0].Cursor
	c.Close()

	a, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Rollback(ctx)
	if _, err := ingest.Ingest(ctx, a, items(t, "late", "u1", 1)); err != nil {
		t.Fatal(err)
	}
	s.ingest(s.pool, items(t, "early", "u1", 1))
	// The resume sees B committed but behind A's open transaction: it sends
	// neither now, and both once A commits.
	c = s.dial("u1", cursor)
	if resumed, _ := s.ready(c); len(resumed) != 0 {
		t.Fatalf("resume sent %v while A was open", titles(t, resumed))
	}
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_ = ingest.WakeUp(ctx, s.pool)
	if got := titles(t, next(t, c, "notification", 2)); !slices.Equal(got, []string{"late-0", "early-0"}) {
		t.Errorf("frames %v, want late-0 then early-0", got)
	}
	quiet(t, c, 300*time.Millisecond)
}

func TestASlowReaderIsClosedAndCountedAndOthersKeepUp(t *testing.T) {
	t.Parallel()
	s := newStack(t, func(c *live.Config) {
		c.QueueFrames = 64
		c.QueueBytes = 1 << 20
		c.WriteTimeout = 2 * time.Second
	})
	slow, fast := s.dial("u1", ""), s.dial("u1", "")
	s.ready(slow)
	s.ready(fast)
	// Large notifications, so that the slow socket's kernel buffers fill
	// and its queue overflows.
	blob := strings.Repeat("x", 50<<10)
	const n = 400 // 20 MB: more than the kernel's buffers on loopback hold
	go func() {
		for lo := 0; lo < n; lo += 10 {
			var its []ingest.Item
			for i := lo; i < lo+10; i++ {
				ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":"big-%d","type":"t","recipients":["u1"],"title":"big-%d","data":{"blob":%q}}`, i, i, blob), "")
				if err != nil {
					t.Error(err)
					return
				}
				its = append(its, ingest.Item{Producer: "p", Event: ev})
			}
			if _, err := ingest.Ingest(context.Background(), s.pool, its); err != nil {
				t.Error(err)
				return
			}
			_ = ingest.WakeUp(context.Background(), s.pool)
		}
	}()
	if got := next(t, fast, "notification", n); len(got) != n {
		t.Fatalf("the fast socket got %d of %d", len(got), n)
	}
	testsignal.Eventually(t, "spoolcast_ws_slow_closed_total to reach 1", 10*time.Second, func() bool { return testutil.ToFloat64(s.metrics.SlowClosed()) == 1 })
	// The slow app reads what reached it, then finds the socket closed
	// (1013 when the close frame got through), and resumes: nothing is lost.
	var got []wsclient.Message
	var last string
	for {
		m, err := slow.Next(5 * time.Second)
		if err != nil {
			if code, ok := wsclient.Closed(err); ok && code != live.StatusTryAgainLater {
				t.Errorf("closed with %d, want 1013", code)
			}
			break
		}
		got = append(got, m)
		last = m.Cursor
	}
	if len(got) >= n {
		t.Fatalf("the slow socket got all %d frames: it was not slow", len(got))
	}
	again := s.dial("u1", last)
	resumed, _ := s.ready(again)
	got = append(got, resumed...)
	seen := map[string]bool{}
	for _, title := range titles(t, got) {
		seen[title] = true
	}
	if len(seen) != n || len(got) != n {
		t.Errorf("after resuming, %d frames of %d distinct notifications; want %d of %d", len(got), len(seen), n, n)
	}
}

func TestReadStateReachesTheUsersOtherSockets(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	c := s.dial("u1", "")
	s.ready(c)
	s.ingest(s.pool, items(t, "r", "u1", 2))
	got := next(t, c, "notification", 2)
	first, _ := got[0].Item()
	id, err := feed.ParseID(first.ID)
	if err != nil {
		t.Fatal(err)
	}
	store := feed.NewStore(s.pool, nil)
	ctx := context.Background()
	if err := store.MarkRead(ctx, "u1", id); err != nil {
		t.Fatal(err)
	}
	_ = ingest.WakeUp(ctx, s.pool)
	if m := next(t, c, "read", 1)[0]; m.ID != first.ID {
		t.Errorf("read frame %s, want id %s", m.Raw, first.ID)
	}
	if err := store.MarkRead(ctx, "u1", id); err != nil { // again: nothing changes, nothing is sent
		t.Fatal(err)
	}
	through, _, err := store.MarkAllRead(ctx, "u1")
	if err != nil {
		t.Fatal(err)
	}
	_ = ingest.WakeUp(ctx, s.pool)
	if m := next(t, c, "read", 1)[0]; m.Through != through.String() {
		t.Errorf("read-all frame %s, want through %s", m.Raw, through)
	}
	quiet(t, c, 300*time.Millisecond)
}

func TestShutdownClosesEverySocketWithGoingAway(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	c := s.dial("u1", "")
	s.ready(c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.hub.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := c.Next(5 * time.Second)
	if code, ok := wsclient.Closed(err); !ok || code != ws.StatusGoingAway {
		t.Errorf("after shutdown: %v, want a 1001 close frame", err)
	}
	if s.hub.Ready() {
		t.Error("the hub is ready after shutdown")
	}
	if n := testutil.ToFloat64(s.metrics.Connections()); n != 0 {
		t.Errorf("spoolcast_ws_connections = %v after shutdown", n)
	}
}

func TestAWakeUpAfterTheListenerReconnectsReadsWhatWasMissed(t *testing.T) {
	t.Parallel()
	url := pgtest.DB(t)
	listener := pglisten.New(url, ingest.NotifyChannel, nil, slog.New(slog.DiscardHandler))
	wake := listener.Subscribe()
	s := newStackOn(t, url, func(c *live.Config) {
		c.Wake = wake
		c.PollInterval = time.Hour // only wake-ups make it read
	})
	listener.Start(context.Background())
	t.Cleanup(func() { _ = listener.Stop(context.Background()) })
	c := s.dial("u1", "")
	s.ready(c)
	s.ingest(s.pool, items(t, "one", "u1", 1))
	next(t, c, "notification", 1)
	// A commit whose hint is lost (ingest.Ingest sends none, as if it went
	// while no one listened), then the LISTEN connection lost: the listener
	// that connects again wakes the reader, which reads it. The commit
	// comes first: a listener back before it would wake the reader too early
	// (as a loaded CI machine once did).
	if _, err := ingest.Ingest(context.Background(), s.pool, items(t, "two", "u1", 1)); err != nil {
		t.Fatal(err)
	}
	var terminated int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE query LIKE 'LISTEN%' AND datname = current_database()`).Scan(&terminated); err != nil || terminated != 1 {
		t.Fatalf("terminated %d LISTEN connections (%v), want 1", terminated, err)
	}
	if got := titles(t, next(t, c, "notification", 1)); got[0] != "two-0" {
		t.Errorf("frame %v, want two-0", got)
	}
}

func TestHandshakeProblemsAreAnsweredBeforeTheUpgrade(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	req, _ := http.NewRequest(http.MethodGet, s.base+"/v1/stream", nil)
	req.Header.Set("Authorization", "Bearer u1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("plain GET: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if _, err := wsclient.Dial(context.Background(), s.base, "u1", "not-a-cursor"); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("a bad cursor: %v, want HTTP 400", err)
	}
}

func TestASilentPeerIsDroppedAfterTwoPingIntervals(t *testing.T) {
	t.Parallel()
	// 500 ms: the answering app must never go two intervals without a
	// turn to read, which 200 ms did not leave it on a loaded CI machine.
	s := newStack(t, func(c *live.Config) { c.PingInterval = 500 * time.Millisecond })
	answering, silent := s.dial("u1", ""), s.dial("u2", "")
	s.ready(answering)
	s.ready(silent)
	// One app answers the pings (Next does), the other's network is gone:
	// it reads nothing and sends nothing.
	go func() {
		for {
			if _, err := answering.Next(5 * time.Second); err != nil {
				return
			}
		}
	}()
	testsignal.Eventually(t, "the silent socket dropped (spoolcast_ws_connections 1)", 10*time.Second, func() bool { return testutil.ToFloat64(s.metrics.Connections()) == 1 })
	time.Sleep(2500 * time.Millisecond) // five more intervals: the answering socket stays
	if n := testutil.ToFloat64(s.metrics.Connections()); n != 1 {
		t.Errorf("spoolcast_ws_connections = %v, want the answering socket kept", n)
	}
}
