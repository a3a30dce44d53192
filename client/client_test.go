package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/client"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/relay"
	"github.com/spoolcast/spoolcast/spool"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testSecret = []byte("0123456789abcdef0123456789abcdef-client-tests")

// testRelay is a real relay (real SQLite spool in a temporary directory, real
// HTTP on loopback) behind a handler that records every request it answers.
type testRelay struct {
	url     string
	spool   *spool.Spool
	server  http.Handler
	answers chan request // every answered request, in order

	mu   sync.Mutex
	seen []request
}

// request is one request the relay answered.
type request struct {
	body       []byte // what the relay read of it
	auth       string
	status     int
	retryAfter string
	start      time.Time // when it reached the relay
	answered   time.Time // when the relay's handler returned, before the client read the answer
}

type relayOpts struct {
	spoolMaxBytes int64
	retryAfter    time.Duration // the relay's Retry-After on 503; default 1s
	serviceTokens bool
	addr          string // listen there; default a free port
}

func startRelay(t *testing.T, o relayOpts) *testRelay {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sp, err := spool.Open(context.Background(), spool.Config{
		Path:     filepath.Join(t.TempDir(), "spool.db"),
		MaxBytes: o.spoolMaxBytes,
		Logger:   logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := relay.Config{Producer: "billing", Spool: sp, Logger: logger, RetryAfter: o.retryAfter}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = time.Second
	}
	if o.serviceTokens {
		if cfg.Verifier, err = auth.NewServiceVerifier(testSecret); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &testRelay{spool: sp, server: srv, answers: make(chan request, 1000)}
	ts := httptest.NewUnstartedServer(r)
	if o.addr != "" {
		ln, err := net.Listen("tcp", o.addr)
		if err != nil {
			t.Fatal(err)
		}
		ts.Listener.Close()
		ts.Listener = ln
	}
	ts.Start()
	t.Cleanup(func() {
		ts.Close()
		if err := sp.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	r.url = ts.URL
	return r
}

func (r *testRelay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	rec := request{start: time.Now(), auth: req.Header.Get("Authorization")}
	// Record what the relay reads, as it reads it: the relay alone decides
	// how much of a body to read (none of one over its limit).
	var body bytes.Buffer
	req.Body = struct {
		io.Reader
		io.Closer
	}{io.TeeReader(req.Body, &body), req.Body}
	sw := &statusWriter{ResponseWriter: w}
	r.server.ServeHTTP(sw, req)
	rec.body, rec.status, rec.retryAfter, rec.answered = body.Bytes(), sw.status, w.Header().Get("Retry-After"), time.Now()
	r.mu.Lock()
	r.seen = append(r.seen, rec)
	r.mu.Unlock()
	r.answers <- rec
}

// requests returns the requests answered so far.
func (r *testRelay) requests() []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]request(nil), r.seen...)
}

// stored returns how many spool rows hold key.
func (r *testRelay) stored(t *testing.T, key string) int {
	t.Helper()
	rows, err := r.spool.List(context.Background(), spool.AllRows, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, row := range rows {
		if row.Key == key {
			n++
		}
	}
	return n
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func newClient(t *testing.T, cfg client.Config) *client.Client {
	t.Helper()
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func meeting(key, title string) client.Event {
	return client.Event{
		IdempotencyKey: key,
		Type:           "meeting.assigned",
		Category:       "meetings",
		Recipients:     []string{"u_123"},
		Title:          title,
		Body:           "Starts Monday 10:00",
		Data:           map[string]any{"meeting_id": "m_456"},
	}
}

func TestTheSameEventTwiceIsAcceptedThenDuplicate(t *testing.T) {
	t.Parallel()
	r := startRelay(t, relayOpts{})
	c := newClient(t, client.Config{RelayURL: r.url})
	ctx := context.Background()

	first, err := c.Emit(ctx, meeting("meeting_assignment:u_123:m_456", "Weekly sync"))
	if err != nil {
		t.Fatal(err)
	}
	if first.Status != client.Accepted || first.IdempotencyKey != "meeting_assignment:u_123:m_456" || first.ReceivedAt.IsZero() {
		t.Fatalf("first emit = %+v; want accepted with the key and a receipt time", first)
	}
	again, err := c.Emit(ctx, meeting("meeting_assignment:u_123:m_456", "Weekly sync"))
	if err != nil {
		t.Fatal(err)
	}
	if again.Status != client.Duplicate || !again.ReceivedAt.Equal(first.ReceivedAt) {
		t.Errorf("second emit = %+v; want duplicate with the first receipt time %s", again, first.ReceivedAt)
	}
	if n := r.stored(t, "meeting_assignment:u_123:m_456"); n != 1 {
		t.Errorf("the spool holds the key %d times, want once", n)
	}
}

func TestAKeyReusedForAnotherEventIsAConflictAndNotRetried(t *testing.T) {
	t.Parallel()
	r := startRelay(t, relayOpts{})
	c := newClient(t, client.Config{RelayURL: r.url})
	ctx := context.Background()
	if _, err := c.Emit(ctx, meeting("invoice:7", "Weekly sync")); err != nil {
		t.Fatal(err)
	}

	_, err := c.Emit(ctx, meeting("invoice:7", "Another title"))
	var conflict *client.ConflictError
	if !errors.As(err, &conflict) || !errors.Is(err, client.ErrConflict) {
		t.Fatalf("reused key = %v; want a ConflictError", err)
	}
	if conflict.IdempotencyKey != "invoice:7" || conflict.Problem.Status != http.StatusUnprocessableEntity || conflict.Problem.Slug() != "idempotency-key-reused" {
		t.Errorf("conflict = %+v", conflict)
	}
	if errors.Is(err, client.ErrGaveUp) {
		t.Errorf("a conflict is final, not a give-up: %v", err)
	}
	if got := len(r.requests()); got != 2 {
		t.Errorf("the relay received %d requests, want 2: one per emit, the conflict never retried", got)
	}
	if n := r.stored(t, "invoice:7"); n != 1 {
		t.Errorf("the spool holds the key %d times, want once", n)
	}
}

func TestAnInvalidEventIsATypedErrorNamingTheField(t *testing.T) {
	t.Parallel()
	r := startRelay(t, relayOpts{})
	c := newClient(t, client.Config{RelayURL: r.url})
	manyLongRecipients := make([]string, 1000)
	for i := range manyLongRecipients {
		manyLongRecipients[i] = fmt.Sprintf("%0256d", i)
	}
	deep := strings.Repeat(`{"a":`, 40) + "1" + strings.Repeat("}", 40)
	for _, tc := range []struct {
		name     string
		edit     func(*client.Event)
		status   int // 0: refused without a request
		field    string
		inDetail string
	}{
		{"a missing key is refused before sending", func(e *client.Event) { e.IdempotencyKey = "" }, 0, "idempotency_key", "required"},
		{"a blank key is refused before sending", func(e *client.Event) { e.IdempotencyKey = "   " }, 0, "idempotency_key", "required"},
		{"a key that is not UTF-8 is refused before sending", func(e *client.Event) { e.IdempotencyKey = "k\xff" }, 0, "idempotency_key", "UTF-8"},
		{"a missing type is refused before sending", func(e *client.Event) { e.Type = "" }, 0, "type", "required"},
		{"no recipients are refused before sending", func(e *client.Event) { e.Recipients = nil }, 0, "recipients", "at least one"},
		{"an empty recipient is refused before sending", func(e *client.Event) { e.Recipients = []string{"u_1", ""} }, 0, "recipients", "required"},
		{"a title over its limit is refused before sending", func(e *client.Event) { e.Title = strings.Repeat("t", 1025) }, 0, "title", "1024"},
		{"data that is not an object is refused before sending", func(e *client.Event) { e.Data = []int{1} }, 0, "data", "object"},
		{"data the relay cannot store is 400 naming data", func(e *client.Event) { e.Data = json.RawMessage(`{"x":1e5000}`) }, 400, "data", "out of range"},
		{"data nested too deep is 400 naming data", func(e *client.Event) { e.Data = json.RawMessage(deep) }, 400, "data", "deeper"},
		{"a body over the relay's limit is 413", func(e *client.Event) { e.Recipients = manyLongRecipients }, 413, "", "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(r.requests())
			ev := meeting("invalid:"+tc.name, "t")
			tc.edit(&ev)
			_, err := c.Emit(context.Background(), ev)
			var invalid *client.InvalidEventError
			if !errors.As(err, &invalid) || !errors.Is(err, client.ErrInvalidEvent) {
				t.Fatalf("Emit = %v; want an InvalidEventError", err)
			}
			if invalid.StatusCode != tc.status || invalid.Field != tc.field || !strings.Contains(invalid.Detail, tc.inDetail) {
				t.Errorf("error = %+v; want status %d, field %q, detail with %q", invalid, tc.status, tc.field, tc.inDetail)
			}
			want := 1 // the relay's answer is final: never retried
			if tc.status == 0 {
				want = 0
			}
			if got := len(r.requests()) - before; got != want {
				t.Errorf("the relay received %d requests, want %d", got, want)
			}
		})
	}
}

func TestServiceTokensAreSentAndRefusalsAreTyped(t *testing.T) {
	t.Parallel()
	r := startRelay(t, relayOpts{serviceTokens: true})
	emit, err := auth.SignServiceToken(testSecret, "billing", []string{"push:emit"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	readOnly, err := auth.SignServiceToken(testSecret, "billing", []string{"prefs:read"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		cfg    client.Config
		status int // 0: accepted
	}{
		{"no token is unauthorized", client.Config{}, http.StatusUnauthorized},
		{"a token without push:emit is forbidden", client.Config{Token: readOnly}, http.StatusForbidden},
		{"a static token with push:emit is accepted", client.Config{Token: emit}, 0},
		{"a token from TokenSource is accepted", client.Config{TokenSource: func(context.Context) (string, error) { return emit, nil }}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.RelayURL = r.url
			c := newClient(t, tc.cfg)
			before := len(r.requests())
			res, err := c.Emit(context.Background(), meeting("auth:"+tc.name, "t"))
			if got := len(r.requests()) - before; got != 1 {
				t.Errorf("the relay received %d requests, want 1", got)
			}
			if tc.status == 0 {
				if err != nil || res.Status != client.Accepted {
					t.Fatalf("Emit = %+v %v; want accepted", res, err)
				}
				if req := r.requests()[before]; req.auth != "Bearer "+emit {
					t.Errorf("Authorization = %q; want the token", req.auth)
				}
				return
			}
			var unauthorized *client.UnauthorizedError
			if !errors.As(err, &unauthorized) || !errors.Is(err, client.ErrUnauthorized) {
				t.Fatalf("Emit = %v; want an UnauthorizedError", err)
			}
			if unauthorized.StatusCode != tc.status || !strings.HasPrefix(unauthorized.Challenge, "Bearer") {
				t.Errorf("error = %+v; want %d with a Bearer challenge", unauthorized, tc.status)
			}
		})
	}
	t.Run("a TokenSource error is retried, and never sends without a token", func(t *testing.T) {
		broken := errors.New("token file unreadable")
		calls := 0
		c := newClient(t, client.Config{RelayURL: r.url, MaxAttempts: 3, BaseBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
			TokenSource: func(context.Context) (string, error) { calls++; return "", broken }})
		before := len(r.requests())
		_, err := c.Emit(context.Background(), meeting("auth:broken", "t"))
		if !errors.Is(err, broken) || !errors.Is(err, client.ErrGaveUp) || client.Rejected(err) {
			t.Errorf("Emit = %v; want a GaveUpError wrapping the TokenSource's error, the event not rejected", err)
		}
		if calls != 3 {
			t.Errorf("TokenSource was asked %d times, want 3", calls)
		}
		if got := len(r.requests()) - before; got != 0 {
			t.Errorf("the relay received %d requests, want none", got)
		}
	})
	t.Run("a TokenSource rotating its file is picked up by the retry", func(t *testing.T) {
		calls := 0
		c := newClient(t, client.Config{RelayURL: r.url, BaseBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
			TokenSource: func(context.Context) (string, error) {
				if calls++; calls == 1 {
					return "", errors.New("token file mid-rotation")
				}
				return emit, nil
			}})
		if res, err := c.Emit(context.Background(), meeting("auth:rotating", "t")); err != nil || res.Status != client.Accepted {
			t.Errorf("Emit = %+v, %v; want accepted on the retry", res, err)
		}
	})
	t.Run("a slow TokenSource is bounded by MaxElapsed", func(t *testing.T) {
		c := newClient(t, client.Config{RelayURL: r.url, MaxElapsed: 200 * time.Millisecond,
			TokenSource: func(ctx context.Context) (string, error) {
				<-ctx.Done()
				return "", ctx.Err()
			}})
		_, err := c.Emit(context.Background(), meeting("auth:slow", "t"))
		if !errors.Is(err, client.ErrGaveUp) {
			t.Errorf("Emit = %v; want a GaveUpError once the budget ends", err)
		}
	})
}

func TestAWrongRelayURLIsReportedAtOnce(t *testing.T) {
	t.Parallel()
	r := startRelay(t, relayOpts{})
	c := newClient(t, client.Config{RelayURL: r.url + "/not-the-relay"})
	_, err := c.Emit(context.Background(), meeting("url:wrong", "t"))
	var status *client.StatusError
	if !errors.As(err, &status) || status.StatusCode != http.StatusNotFound || errors.Is(err, client.ErrGaveUp) {
		t.Fatalf("Emit = %v; want a 404 StatusError, not retried", err)
	}
	if got := len(r.requests()); got != 1 {
		t.Errorf("the relay received %d requests, want 1", got)
	}
}

func TestConfigMistakesAreClearErrors(t *testing.T) {
	t.Parallel()
	if _, err := client.New(client.Config{}); err != nil {
		t.Fatalf("the zero Config: %v", err)
	}
	for _, tc := range []struct {
		name string
		cfg  client.Config
		want string
	}{
		{"a negative attempt timeout", client.Config{AttemptTimeout: -time.Second}, "attempt timeout -1s: must not be negative"},
		{"negative max attempts", client.Config{MaxAttempts: -1}, "max attempts -1: must not be negative"},
		{"a negative max elapsed", client.Config{MaxElapsed: -time.Second}, "max elapsed -1s: must not be negative"},
		{"a negative base backoff", client.Config{BaseBackoff: -time.Second}, "base backoff -1s: must not be negative"},
		{"a negative max backoff", client.Config{MaxBackoff: -time.Second}, "max backoff -1s: must not be negative"},
		{"a max backoff below the base", client.Config{BaseBackoff: time.Second, MaxBackoff: time.Millisecond}, "max backoff 1ms is below base backoff 1s"},
		{"both kinds of token", client.Config{Token: "t", TokenSource: func(context.Context) (string, error) { return "t", nil }}, "not both"},
		{"a token with its scheme", client.Config{Token: "Bearer abc"}, `without "Bearer "`},
		{"a token with a newline", client.Config{Token: "abc\n"}, "trailing newline"},
		{"a relay URL without scheme", client.Config{RelayURL: "127.0.0.1:7070"}, "want a URL such as http://127.0.0.1:7070"},
		{"a relay URL of another scheme", client.Config{RelayURL: "unix:///run/relay.sock"}, "want a URL such as http://127.0.0.1:7070"},
		{"a relay URL with a query", client.Config{RelayURL: "http://127.0.0.1:7070/?x=1"}, "without query"},
		{"a relay URL with the events path", client.Config{RelayURL: "http://127.0.0.1:7070/v1/events"}, "the client adds /v1/events"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v; want an error with %q", err, tc.want)
			}
		})
	}
}

func TestDeliveryPolicyFieldsReachTheRelayAsItReadsThem(t *testing.T) {
	t.Parallel()
	r := startRelay(t, relayOpts{})
	c := newClient(t, client.Config{RelayURL: r.url})
	ctx := context.Background()
	at := time.Date(2099, 1, 2, 3, 4, 5, 0, time.FixedZone("CET", 3600))
	ev := meeting("scheduled:1", "Weekly sync")
	ev.SendAt, ev.Priority, ev.Digest = time.Now().Add(time.Hour).Truncate(time.Second), "critical", &client.Digest{Key: "chat:room42", Window: 5 * time.Minute}
	if _, err := c.Emit(ctx, ev); err != nil {
		t.Fatal(err)
	}
	body := r.requests()[0].body
	parsed, err := event.Decode(body, "")
	if err != nil {
		t.Fatalf("the relay's decoder refuses %s: %v", body, err)
	}
	if !parsed.SendTime().Equal(ev.SendAt) || !parsed.Critical() || parsed.Digest == nil || parsed.DigestWindow() != 5*time.Minute {
		t.Errorf("the relay read %+v from %s", parsed, body)
	}
	// The event marshalled as it is reads the same.
	raw, _ := json.Marshal(ev)
	if again, err := event.Decode(raw, ""); err != nil || again.DigestWindow() != 5*time.Minute || !again.SendTime().Equal(ev.SendAt) {
		t.Errorf("json.Marshal of the event gives %s, which the relay reads as %+v, %v", raw, again, err)
	}
	for field, bad := range map[string]client.Event{
		"priority": {IdempotencyKey: "k", Type: "t", Title: "t", Recipients: []string{"u"}, Priority: "urgent"},
		"digest":   {IdempotencyKey: "k", Type: "t", Title: "t", Recipients: []string{"u"}, Digest: &client.Digest{Key: "k", Window: time.Second}},
		"title":    {IdempotencyKey: "k", Type: "t", Title: " ", Recipients: []string{"u"}},
	} {
		var inv *client.InvalidEventError
		if _, err := c.Emit(ctx, bad); !errors.As(err, &inv) || !strings.HasPrefix(inv.Field, field) {
			t.Errorf("%+v: %v; want an InvalidEventError on %s", bad, err, field)
		}
	}
	// The relay refuses a send_at too far ahead: the client leaves that to it.
	far := meeting("far", "x")
	far.SendAt = at
	var inv *client.InvalidEventError
	if _, err := c.Emit(ctx, far); !errors.As(err, &inv) || inv.Field != "send_at" {
		t.Errorf("send_at in 2099: %v; want the relay's InvalidEventError on send_at", err)
	}
}
