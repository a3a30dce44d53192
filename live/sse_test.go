package live_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/sseclient"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/wsclient"
	"github.com/spoolcast/spoolcast/live"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// sse opens user's event stream (the stack takes the user as the bearer
// token); it closes when the test ends.
func (s *stack) sse(user string, o sseclient.Options) *sseclient.Conn {
	s.t.Helper()
	o.Token = user
	c, err := sseclient.Dial(context.Background(), s.base, o)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close() })
	return c
}

// lastEventID is what an EventSource sends when it reconnects.
func lastEventID(id string) sseclient.Options {
	h := http.Header{}
	h.Set("Last-Event-ID", id)
	return sseclient.Options{Header: h}
}

// refusal opens user's event stream and returns the refusal's status, its
// problem document and its Retry-After; a stream that opens fails the test.
func refusal(t *testing.T, base, user string, o sseclient.Options) (int, map[string]any, string) {
	t.Helper()
	o.Token = user
	c, err := sseclient.Dial(context.Background(), base, o)
	if err == nil {
		c.Close()
		t.Fatalf("the event stream opened; want a refusal")
	}
	if c == nil {
		t.Fatal(err)
	}
	var body map[string]any
	_ = json.NewDecoder(c.Response.Body).Decode(&body)
	if ct := c.Response.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("a %d refusal is %q, want a problem document", c.Response.StatusCode, ct)
	}
	return c.Response.StatusCode, body, c.Response.Header.Get("Retry-After")
}

// readEvent reads the lines of one event (up to its blank line) from a
// stream read by hand.
func readEvent(t *testing.T, br *bufio.Reader) []string {
	t.Helper()
	var lines []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %q: %v", lines, err)
		}
		if line == "\n" {
			return lines
		}
		lines = append(lines, strings.TrimSuffix(line, "\n"))
	}
}

// An EventSource gets, byte for byte, the JSON the WebSocket gets in each
// frame, as one data line; a frame that carries a cursor has it as its
// event id, so the EventSource's Last-Event-ID is the resume cursor. The
// answer is a plain HTTP/1.1 body ended by the connection's close, not
// chunked, which no proxy should buffer.
func TestAnEventStreamSendsTheWebSocketsFramesWithTheirCursorsAsEventIDs(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	socket := s.dial("u1", "")
	s.ready(socket)
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprint(conn, "GET /v1/stream HTTP/1.1\r\nHost: spoolcast\r\nAccept: text/event-stream\r\nAuthorization: Bearer u1\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-store", "X-Accel-Buffering": "no"} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 1 || resp.TransferEncoding != nil || resp.ContentLength != -1 || !resp.Close {
		t.Errorf("%s, transfer encoding %v, length %d, close %v; want 200 over HTTP/1.1 with a body the connection's close ends",
			resp.Status, resp.TransferEncoding, resp.ContentLength, resp.Close)
	}
	ready := readEvent(t, br)
	if len(ready) != 2 || !strings.HasPrefix(ready[0], "id: ") {
		t.Fatalf("first event %q; want an id line and a data line", ready)
	}
	cursor := strings.TrimPrefix(ready[0], "id: ")
	if want := `data: {"type":"ready","cursor":"` + cursor + `"}`; ready[1] != want {
		t.Errorf("ready %q, want %q", ready[1], want)
	}
	if _, err := live.ParseCursor(cursor); err != nil {
		t.Errorf("event id %q is no stream cursor: %v", cursor, err)
	}

	s.ingest(s.pool, items(t, "n", "u1", 1))
	frame := next(t, socket, "notification", 1)[0]
	if got, want := readEvent(t, br), []string{"id: " + frame.Cursor, "data: " + string(frame.Raw)}; !slices.Equal(got, want) {
		t.Errorf("notification event %q, want %q (the WebSocket's frame)", got, want)
	}
	it, _ := frame.Item()
	id, _ := feed.ParseID(it.ID)
	if err := feed.NewStore(s.pool, nil).MarkRead(context.Background(), "u1", id); err != nil {
		t.Fatal(err)
	}
	_ = ingest.WakeUp(context.Background(), s.pool)
	read := next(t, socket, "read", 1)[0]
	if got, want := readEvent(t, br), []string{"id: " + read.Cursor, "data: " + string(read.Raw)}; read.Cursor == "" || !slices.Equal(got, want) {
		t.Errorf("read event %q, want %q: a change of state is a place in the stream, its cursor the event's id", got, want)
	}
}

// An EventSource that reconnects with Last-Event-ID gets what committed
// while it was away, once, in commit order: rows committed, and two ingest
// transactions that commit in the other order than they started, the older
// still open at the resume (it is sent live when it commits, before the
// younger one).
func TestAnEventStreamResumesFromLastEventIDMissingNothingAndRepeatingNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	ctx := context.Background()
	c := s.sse("u1", sseclient.Options{})
	s.ready(c)
	s.ingest(s.pool, items(t, "before", "u1", 2))
	got := next(t, c, "notification", 2)
	if c.LastEventID != got[1].Cursor {
		t.Fatalf("last event id %q, want the last frame's cursor %q", c.LastEventID, got[1].Cursor)
	}
	c.Close() // a dropped network

	s.ingest(s.pool, items(t, "away", "u1", 3))
	a, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Rollback(ctx)
	if _, err := ingest.Ingest(ctx, a, items(t, "late", "u1", 1)); err != nil {
		t.Fatal(err)
	}
	s.ingest(s.pool, items(t, "early", "u1", 1))

	c = s.sse("u1", lastEventID(c.LastEventID))
	resumed, _ := s.ready(c)
	if names := titles(t, resumed); !slices.Equal(names, []string{"away-0", "away-1", "away-2"}) {
		t.Fatalf("resumed %v; want what committed while away, and neither of the transactions behind the open one", names)
	}
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_ = ingest.WakeUp(ctx, s.pool)
	streamed := next(t, c, "notification", 2)
	if names := titles(t, streamed); !slices.Equal(names, []string{"late-0", "early-0"}) {
		t.Errorf("then %v; want late-0 then early-0 (commit-safe order)", names)
	}
	quiet(t, c, 300*time.Millisecond)
	assertInOrder(t, slices.Concat(got, resumed, streamed))
}

// assertInOrder fails unless each notification's cursor comes after the one
// before.
func assertInOrder(t *testing.T, ms []wsclient.Message) {
	t.Helper()
	var prev live.Cursor
	for i, m := range ms {
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

// The burst of TestReconnectingInTheMiddleOfABurstMissesNothingAndRepeatsNothing,
// over an event stream resumed by Last-Event-ID.
func TestAnEventStreamReconnectingInTheMiddleOfABurstMissesNothingAndRepeatsNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	c := s.sse("u1", sseclient.Options{})
	s.ready(c)
	const writers, batches, batch = 5, 10, 10
	const burst = writers * batches * batch
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup // writers at once: transactions commit out of their start order
		for w := range writers {
			wg.Go(func() {
				for b := range batches {
					if _, err := ingest.Ingest(context.Background(), s.pool, items(t, fmt.Sprintf("w%d-b%d", w, b), "u1", batch)); err != nil {
						t.Error(err)
						return
					}
					_ = ingest.WakeUp(context.Background(), s.pool)
				}
			})
		}
		wg.Wait()
	}()
	got := next(t, c, "notification", 77)
	c.Close()
	c = s.sse("u1", lastEventID(c.LastEventID))
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
	assertInOrder(t, got)
}

// An EventSource reconnects to its first URL, which may hold ?after= from
// the first connection: Last-Event-ID, the later position, wins. A cursor
// the server did not issue is refused before the stream, naming where it
// came from.
func TestLastEventIDWinsOverAfterAndBadCursorsAreRefused(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	c := s.sse("u1", sseclient.Options{})
	_, start := s.ready(c)
	s.ingest(s.pool, items(t, "n", "u1", 3))
	got := next(t, c, "notification", 3)

	o := lastEventID(got[1].Cursor)
	o.Query = url.Values{"after": {start}}
	resumed, _ := s.ready(s.sse("u1", o))
	if names := titles(t, resumed); !slices.Equal(names, []string{"n-2"}) {
		t.Errorf("resumed %v with after at the start and Last-Event-ID at n-1; want n-2 alone", names)
	}
	resumed, _ = s.ready(s.sse("u1", sseclient.Options{Query: url.Values{"after": {got[0].Cursor}}}))
	if names := titles(t, resumed); !slices.Equal(names, []string{"n-1", "n-2"}) {
		t.Errorf("resumed %v with after at n-0; want n-1 and n-2", names)
	}

	parsed, _ := live.ParseCursor(got[2].Cursor)
	beyond := live.Cursor{Position: live.Position{Tx: parsed.Tx + 1<<32}, At: parsed.At}.String()
	withAfter := func(o sseclient.Options, after string) sseclient.Options {
		o.Query = url.Values{"after": {after}}
		return o
	}
	for _, c := range []struct {
		name  string
		o     sseclient.Options
		field string
	}{
		{"a Last-Event-ID not issued here", withAfter(lastEventID("not-a-cursor"), start), "Last-Event-ID"},
		{"an after not issued here", withAfter(sseclient.Options{}, "not-a-cursor"), "after"},
		{"a Last-Event-ID beyond the cluster's transactions", lastEventID(beyond), "Last-Event-ID"},
		{"an after beyond the cluster's transactions", withAfter(sseclient.Options{}, beyond), "after"},
	} {
		status, body, _ := refusal(t, s.base, "u1", c.o)
		if status != http.StatusBadRequest || body["type"] != "urn:spoolcast:problem:invalid-cursor" || body["field"] != c.field {
			t.Errorf("%s: %d %v; want 400 invalid-cursor naming %s", c.name, status, body, c.field)
		}
	}
}

// A stream idle for many ping intervals gets a comment each interval, so
// that proxies see traffic, and is not dropped for its silence: an
// EventSource never sends (a WebSocket that does not answer is dropped
// after two intervals).
func TestAnIdleEventStreamIsPingedWithACommentAndKeptOpen(t *testing.T) {
	t.Parallel()
	s := newStack(t, func(c *live.Config) { c.PingInterval = 100 * time.Millisecond })
	c := s.sse("u1", sseclient.Options{})
	s.ready(c)
	testsignal.Eventually(t, "five pings", 10*time.Second, func() bool {
		if _, err := c.Next(50 * time.Millisecond); err != nil && !isTimeout(err) {
			t.Fatal(err)
		}
		return c.Pings >= 5
	})
	if n, sse := testutil.ToFloat64(s.metrics.Connections()), testutil.ToFloat64(s.metrics.SSEConnections()); n != 1 || sse != 1 {
		t.Errorf("after five ping intervals of silence, spoolcast_ws_connections %v, spoolcast_sse_connections %v; want the stream kept", n, sse)
	}
	s.ingest(s.pool, items(t, "after-pings", "u1", 1))
	next(t, c, "notification", 1)
}

func isTimeout(err error) bool {
	var ne net.Error
	return err != nil && errors.As(err, &ne) && ne.Timeout()
}

// A replica shutting down ends its event streams with a close event of code
// 1001, where a WebSocket gets a close frame, then closes the connection.
func TestShutdownEndsAnEventStreamWithAGoingAwayEvent(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	c := s.sse("u1", sseclient.Options{})
	s.ready(c)
	if n := testutil.ToFloat64(s.metrics.SSEConnections()); n != 1 {
		t.Errorf("spoolcast_sse_connections = %v, want 1", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.hub.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := c.Next(5 * time.Second)
	if code, ok := wsclient.Closed(err); !ok || code != ws.StatusGoingAway {
		t.Fatalf("after shutdown: %s %v, want a close event with code 1001", m.Raw, err)
	}
	if _, err := c.Next(5 * time.Second); err == nil || isTimeout(err) {
		t.Errorf("after the close event: %v; want the connection closed", err)
	}
	if n, sse := testutil.ToFloat64(s.metrics.Connections()), testutil.ToFloat64(s.metrics.SSEConnections()); n != 0 || sse != 0 {
		t.Errorf("after shutdown, spoolcast_ws_connections %v, spoolcast_sse_connections %v", n, sse)
	}
	status, body, retry := refusal(t, s.base, "u1", sseclient.Options{})
	if status != http.StatusServiceUnavailable || body["type"] != "urn:spoolcast:problem:stream-unavailable" || retry == "" {
		t.Errorf("a stream asked of a replica shut down: %d %v, Retry-After %q; want 503 stream-unavailable with Retry-After", status, body, retry)
	}
}

// An event stream whose client stops reading is closed once a write stalls
// for WriteTimeout, counted as slow, while the user's other streams keep up;
// the client resumes with its Last-Event-ID and misses nothing.
func TestAnEventStreamThatStopsReadingIsClosedAndResumesWithNothingLost(t *testing.T) {
	t.Parallel()
	s := newStack(t, func(c *live.Config) {
		c.QueueFrames = 64
		c.WriteTimeout = 2 * time.Second
	})
	slow, fast := s.sse("u1", sseclient.Options{}), s.dial("u1", "")
	s.ready(slow)
	s.ready(fast)
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
	testsignal.Eventually(t, "spoolcast_ws_slow_closed_total to reach 1", 15*time.Second, func() bool { return testutil.ToFloat64(s.metrics.SlowClosed()) == 1 })
	// The slow app reads what reached it, then finds the stream ended
	// (with a 1013 close event when it got through).
	var got []wsclient.Message
	for {
		m, err := slow.Next(5 * time.Second)
		if err != nil {
			if code, ok := wsclient.Closed(err); ok && code != live.StatusTryAgainLater {
				t.Errorf("closed with %d, want 1013", code)
			}
			if isTimeout(err) {
				t.Fatal("the slow stream stayed open")
			}
			break
		}
		got = append(got, m)
	}
	if len(got) >= n {
		t.Fatalf("the slow stream got all %d frames: it was not slow", len(got))
	}
	again := s.sse("u1", lastEventID(slow.LastEventID))
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

// The caps count a user's event streams and WebSockets together, and so the
// replica's: an app that falls back from one to the other cannot hold twice
// its share.
func TestTheCapsCountEventStreamsAndWebSocketsTogether(t *testing.T) {
	t.Parallel()
	s := newStack(t, func(c *live.Config) { c.MaxSocketsPerUser, c.MaxSockets = 2, 3 })
	first := s.sse("u1", sseclient.Options{})
	s.ready(first)
	s.ready(s.dial("u1", ""))
	if status, body, retry := refusal(t, s.base, "u1", sseclient.Options{}); status != http.StatusTooManyRequests || body["type"] != "urn:spoolcast:problem:too-many-sockets" || retry != "10" {
		t.Errorf("u1's third stream, an event stream: %d %v, Retry-After %q; want 429 too-many-sockets with Retry-After 10", status, body, retry)
	}
	if code, retry := handshake(t, s, "u1", ""); code != http.StatusTooManyRequests || retry != "10" {
		t.Errorf("u1's third stream, a WebSocket: %d, Retry-After %q; want 429 with Retry-After 10", code, retry)
	}
	s.ready(s.sse("u2", sseclient.Options{}))
	if status, body, retry := refusal(t, s.base, "u3", sseclient.Options{}); status != http.StatusServiceUnavailable || body["type"] != "urn:spoolcast:problem:stream-unavailable" || retry == "" {
		t.Errorf("the replica's fourth stream: %d %v, Retry-After %q; want 503 stream-unavailable with Retry-After", status, body, retry)
	}
	first.Close()
	testsignal.Eventually(t, "u1's closed event stream to free its place", 10*time.Second, func() bool {
		c, err := sseclient.Dial(context.Background(), s.base, sseclient.Options{Token: "u1"})
		if err != nil {
			return false
		}
		defer c.Close()
		_, cursor := s.ready(c)
		return cursor != ""
	})
}

// An HTTP/2 stream cannot be taken over as an HTTP/1.1 connection is: the
// event stream is refused with a problem that says so, not left hanging.
func TestAnEventStreamOverHTTP2IsRefusedSayingWhy(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.hub.Serve(w, r, "u1") }))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/stream", nil)
	req.Header.Set("Accept", "text/event-stream")
	client := srv.Client()
	client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}} //nolint:gosec // the test's own server
	client.Transport.(*http.Transport).ForceAttemptHTTP2 = true
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusHTTPVersionNotSupported || !strings.Contains(fmt.Sprint(body["detail"]), "HTTP/1.1") {
		t.Errorf("over %s: %d %v; want 505 saying the event stream is served over HTTP/1.1", resp.Proto, resp.StatusCode, body)
	}
}

// A user with only an event stream open is present (pushes wait for them to
// see), and Seen moves how far they have seen as a seen message does.
func TestAnEventStreamCountsAsPresentAndSeenMovesItsPosition(t *testing.T) {
	t.Parallel()
	s := newStackOn(t, pgtest.DB(t), func(c *live.Config) { c.Presence, c.Replica = true, "replica-sse" })
	c := s.sse("u1", sseclient.Options{})
	s.ready(c)
	present := func() bool {
		return pgtest.Count(t, s.pool, `SELECT count(*) FROM stream_presence WHERE user_id = 'u1' AND replica = 'replica-sse' AND expires_at > now()`) == 1
	}
	testsignal.Eventually(t, "u1's presence to be recorded", 10*time.Second, present)
	s.ingest(s.pool, items(t, "seen", "u1", 2))
	frames := next(t, c, "notification", 2)
	if err := s.hub.Seen(context.Background(), "u1", "not-a-cursor"); err != live.ErrBadCursor {
		t.Errorf("Seen with a cursor not issued here: %v, want ErrBadCursor", err)
	}
	if err := s.hub.Seen(context.Background(), "u1", frames[0].Cursor); err != nil {
		t.Fatal(err)
	}
	testsignal.Eventually(t, "the seen position to be recorded", 10*time.Second, func() bool {
		var title string
		err := s.pool.QueryRow(context.Background(), `SELECT n.title FROM notifications n JOIN stream_seen s USING (user_id)
			WHERE (n.tx, n.id) <= (s.through_tx, s.through_id) ORDER BY n.tx DESC, n.id DESC LIMIT 1`).Scan(&title)
		return err == nil && title == "seen-0"
	})
	c.Close()
	testsignal.Eventually(t, "u1's presence to be removed with its stream", 10*time.Second, func() bool { return !present() })
}

// A burst larger than an event stream's queue catches up from Postgres, as
// a WebSocket's does: every notification once, in order, and the stream
// stays open.
func TestABurstLargerThanAnEventStreamsQueueCatchesUpInsteadOfClosing(t *testing.T) {
	t.Parallel()
	s := newStack(t, func(c *live.Config) { c.QueueFrames = 16 })
	c := s.sse("u1", sseclient.Options{})
	s.ready(c)
	const n = 300
	for lo := 0; lo < n; lo += 100 {
		s.ingest(s.pool, items(t, fmt.Sprintf("burst%d", lo/100), "u1", 100))
	}
	got := next(t, c, "notification", n)
	seen := map[string]bool{}
	for _, title := range titles(t, got) {
		if seen[title] {
			t.Fatalf("%s twice", title)
		}
		seen[title] = true
	}
	assertInOrder(t, got)
	if testutil.ToFloat64(s.metrics.SlowClosed()) != 0 || testutil.ToFloat64(s.metrics.CatchUps()) == 0 {
		t.Errorf("slow closed %v, catch-ups %v; want the stream caught up, not closed",
			testutil.ToFloat64(s.metrics.SlowClosed()), testutil.ToFloat64(s.metrics.CatchUps()))
	}
	quiet(t, c, 300*time.Millisecond)
}
