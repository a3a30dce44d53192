package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/disktest"
	"github.com/spoolcast/spoolcast/relay"
	"github.com/spoolcast/spoolcast/spool"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testSecret = []byte("0123456789abcdef0123456789abcdef-relay-tests")

type harness struct {
	url    string
	spool  *spool.Spool
	server *relay.Server
}

type harnessOpts struct {
	auth          bool
	spoolMaxBytes int64
	spoolDir      string        // default a temporary directory
	readTimeout   time.Duration // the HTTP server's; default none
}

func newHarness(t *testing.T, o harnessOpts) *harness {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if o.spoolDir == "" {
		o.spoolDir = t.TempDir()
	}
	sp, err := spool.Open(context.Background(), spool.Config{
		Path:     filepath.Join(o.spoolDir, "spool.db"),
		MaxBytes: o.spoolMaxBytes,
		Logger:   logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := relay.Config{Producer: "billing", Spool: sp, Logger: logger, MaxBody: 4 << 10}
	if o.auth {
		if cfg.Verifier, err = auth.NewServiceVerifier(testSecret); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(srv)
	ts.Config.ReadTimeout = o.readTimeout
	ts.Start()
	t.Cleanup(func() {
		ts.Close()
		if err := sp.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return &harness{url: ts.URL, spool: sp, server: srv}
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

type response struct {
	status int
	header http.Header
	body   map[string]any
}

func (h *harness) post(t *testing.T, body string, headers ...string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.url+"/v1/events", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) response {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := response{status: resp.StatusCode, header: resp.Header}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			t.Fatalf("body %q is not JSON: %v", raw, err)
		}
	}
	return r
}

func (h *harness) rows(t *testing.T) int {
	t.Helper()
	st, err := h.spool.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int(st.Pending + st.KeptKeys + st.Dead)
}

func event(key, title string) string {
	return fmt.Sprintf(`{"idempotency_key":%q,"type":"meeting.assigned","category":"meetings","recipients":["u_123"],"title":%q,"body":"Starts Monday 10:00","data":{"meeting_id":"m_456"}}`, key, title)
}

func TestIngestAnswersAcceptedDuplicateAndConflict(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})

	first := h.post(t, event("meeting_assignment:u_123:m_456", "Weekly sync"))
	if first.status != http.StatusAccepted || first.body["status"] != "accepted" || first.body["idempotency_key"] != "meeting_assignment:u_123:m_456" {
		t.Fatalf("first post = %d %v; want 202 accepted with the key", first.status, first.body)
	}
	receivedAt, err := time.Parse(time.RFC3339Nano, first.body["received_at"].(string))
	if err != nil || time.Since(receivedAt) > time.Minute {
		t.Fatalf("received_at %v: %v", first.body["received_at"], err)
	}

	// The same request with its fields reordered and the key in the header is the same request.
	same := `{"data":{"meeting_id":"m_456"},"body":"Starts Monday 10:00","title":"Weekly sync","recipients":["u_123","u_123"],"category":"meetings","type":"meeting.assigned"}`
	dup := h.post(t, same, "Idempotency-Key", `"meeting_assignment:u_123:m_456"`)
	if dup.status != http.StatusOK || dup.body["status"] != "duplicate" || dup.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry = %d %v %v; want 200 duplicate with Idempotent-Replayed", dup.status, dup.body, dup.header)
	}
	if dup.body["received_at"] != first.body["received_at"] {
		t.Errorf("duplicate received_at %v, want the first receipt %v", dup.body["received_at"], first.body["received_at"])
	}

	conflict := h.post(t, event("meeting_assignment:u_123:m_456", "Another title"))
	if conflict.status != http.StatusUnprocessableEntity || conflict.header.Get("Content-Type") != "application/problem+json" ||
		conflict.body["type"] != "urn:spoolcast:problem:idempotency-key-reused" || conflict.body["status"] != float64(422) {
		t.Fatalf("conflict = %d %v; want 422 problem", conflict.status, conflict.body)
	}
	if got := h.rows(t); got != 1 {
		t.Errorf("spool rows = %d, want 1", got)
	}
}

func TestBadInputIsAProblemAndChangesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	tooBig := event("k-big", strings.Repeat("x", 900)) // under the field limit
	tooBig = strings.Replace(tooBig, `"body":"Starts Monday 10:00"`, `"body":"`+strings.Repeat("y", 3900)+`"`, 1)
	for _, tc := range []struct {
		name    string
		body    string
		headers []string
		status  int
		typ     string
		field   string
	}{
		{"a missing key is 400", `{"type":"t","recipients":["u"]}`, nil, 400, "invalid-event", "idempotency_key"},
		{"missing recipients are 400", `{"idempotency_key":"k","type":"t"}`, nil, 400, "invalid-event", "recipients"},
		{"empty recipients are 400", `{"idempotency_key":"k","type":"t","recipients":[]}`, nil, 400, "invalid-event", "recipients"},
		{"a missing type is 400", `{"idempotency_key":"k","recipients":["u"]}`, nil, 400, "invalid-event", "type"},
		{"malformed JSON is 400", `{"idempotency_key":"k",`, nil, 400, "malformed-event", ""},
		{"a wrong field type is 400", `{"idempotency_key":"k","type":"t","recipients":"u"}`, nil, 400, "malformed-event", "recipients"},
		{"a wrong type inside a field is 400", `{"idempotency_key":"k","type":"t","recipients":[7]}`, nil, 400, "malformed-event", "recipients"},
		{"an unknown field is 400", `{"idempotency_key":"k","type":"t","recipients":["u"],"priority":1}`, nil, 400, "malformed-event", "priority"},
		{"two JSON values are 400", event("k2", "t") + `{}`, nil, 400, "malformed-event", ""},
		{"data that is not an object is 400", `{"idempotency_key":"k","type":"t","recipients":["u"],"data":[1]}`, nil, 400, "invalid-event", "data"},
		{"an event with neither title nor body is 400", `{"idempotency_key":"k","type":"t","recipients":["u"],"data":{"a":1}}`, nil, 400, "invalid-event", "title"},
		{"an event whose title and body are spaces is 400", `{"idempotency_key":"k","type":"t","recipients":["u"],"title":" ","body":""}`, nil, 400, "invalid-event", "title"},
		{"a header key that differs from the body is 400", event("k3", "t"), []string{"Idempotency-Key", "other"}, 400, "invalid-event", "idempotency_key"},
		{"a broken quoted header key is 400", `{"type":"t","recipients":["u"]}`, []string{"Idempotency-Key", `"open`}, 400, "invalid-event", "Idempotency-Key"},
		{"a wrong content type is 415", event("k4", "t"), []string{"Content-Type", "text/plain"}, 415, "unsupported-media-type", ""},
		{"a missing content type is 415", event("k5", "t"), []string{"Content-Type", ""}, 415, "unsupported-media-type", ""},
		{"a body over the limit is 413", tooBig, nil, 413, "body-too-large", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.post(t, tc.body, tc.headers...)
			if r.status != tc.status {
				t.Fatalf("status = %d %v; want %d", r.status, r.body, tc.status)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type = %q", ct)
			}
			if r.body["type"] != "urn:spoolcast:problem:"+tc.typ || r.body["status"] != float64(tc.status) || r.body["title"] == "" || r.body["detail"] == "" {
				t.Errorf("problem = %v; want type %s", r.body, tc.typ)
			}
			if tc.field != "" && r.body["field"] != tc.field {
				t.Errorf("field = %v, want %s", r.body["field"], tc.field)
			}
		})
	}
	if got := h.rows(t); got != 0 {
		t.Errorf("bad requests left %d spool rows, want 0", got)
	}
}

func TestChunkedBodyOverTheLimitIs413(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	body := io.MultiReader(strings.NewReader(`{"idempotency_key":"k","type":"t","recipients":["u"],"title":"`), strings.NewReader(strings.Repeat("x", 8<<10)), strings.NewReader(`"}`))
	req, _ := http.NewRequest(http.MethodPost, h.url+"/v1/events", body)
	req.Header.Set("Content-Type", "application/json")
	if r := do(t, req); r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("status = %d, want 413", r.status)
	}
}

func TestHundredConcurrentDuplicatesMakeOneRow(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	statuses := make(chan int, 100)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 100 {
		wg.Go(func() {
			<-start
			statuses <- h.post(t, event("same-key", "Same")).status
		})
	}
	close(start)
	wg.Wait()
	close(statuses)
	counts := map[int]int{}
	for s := range statuses {
		counts[s]++
	}
	if counts[http.StatusAccepted] != 1 || counts[http.StatusOK] != 99 {
		t.Errorf("statuses = %v; want exactly one 202 and 99 200s", counts)
	}
	if got := h.rows(t); got != 1 {
		t.Errorf("spool rows = %d, want 1", got)
	}
}

func TestFullSpoolAnswers503AndKeepsWhatItAccepted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{spoolMaxBytes: 48 << 10})
	var accepted []string
	var last response
	for i := range 200 {
		key := fmt.Sprintf("k%d", i)
		last = h.post(t, event(key, strings.Repeat("t", 1000)))
		if last.status != http.StatusAccepted {
			break
		}
		accepted = append(accepted, key)
	}
	if last.status != http.StatusServiceUnavailable || last.header.Get("Retry-After") == "" || last.body["type"] != "urn:spoolcast:problem:overloaded" {
		t.Fatalf("after %d accepted: %d %v %v; want 503 with Retry-After", len(accepted), last.status, last.header, last.body)
	}
	if len(accepted) == 0 {
		t.Fatal("nothing was accepted before the spool filled")
	}
	for _, key := range accepted {
		if r := h.post(t, event(key, strings.Repeat("t", 1000))); r.status != http.StatusOK {
			t.Fatalf("retry of accepted %s while full = %d; want 200 duplicate", key, r.status)
		}
	}
	if got := h.rows(t); got != len(accepted) {
		t.Errorf("spool rows = %d, want the %d accepted", got, len(accepted))
	}
}

func TestServiceTokenIsRequiredWhenConfigured(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{auth: true})
	emit, _ := auth.SignServiceToken(testSecret, "billing", []string{"push:emit"}, time.Now(), time.Minute)
	readOnly, _ := auth.SignServiceToken(testSecret, "billing", []string{"prefs:read"}, time.Now(), time.Minute)
	expired, _ := auth.SignServiceToken(testSecret, "billing", []string{"push:emit"}, time.Now(), -time.Hour)
	otherKey, _ := auth.SignServiceToken([]byte("another-secret-another-secret-another"), "billing", []string{"push:emit"}, time.Now(), time.Minute)
	for _, tc := range []struct {
		name   string
		auth   string
		status int
	}{
		{"no token is 401", "", 401},
		{"a garbage token is 401", "Bearer not.a.token", 401},
		{"a token signed with another secret is 401", "Bearer " + otherKey, 401},
		{"an expired token is 401", "Bearer " + expired, 401},
		{"a Basic credential is 401", "Basic dXNlcjpwYXNz", 401},
		{"a token without push:emit is 403", "Bearer " + readOnly, 403},
		{"a token with push:emit is accepted", "Bearer " + emit, 202},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.post(t, event("auth-"+tc.name, "t"), "Authorization", tc.auth)
			if r.status != tc.status {
				t.Fatalf("status = %d %v; want %d", r.status, r.body, tc.status)
			}
			if tc.status >= 400 && !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("WWW-Authenticate = %q", r.header.Get("WWW-Authenticate"))
			}
		})
	}
	if got := h.rows(t); got != 1 {
		t.Errorf("spool rows = %d, want only the authorized event", got)
	}
}

func TestHealthReadinessAndMetrics(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	h.post(t, event("m1", "t"))
	h.post(t, event("m1", "t"))
	h.post(t, `{`)
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(h.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s = %d", path, resp.StatusCode)
		}
	}
	resp, err := http.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`spoolcast_relay_requests_total{outcome="accepted"} 1`,
		`spoolcast_relay_requests_total{outcome="duplicate"} 1`,
		`spoolcast_relay_requests_total{outcome="invalid"} 1`,
		`spoolcast_relay_request_duration_seconds_count{outcome="accepted"} 1`,
		`go_goroutines`,
	} {
		if !bytes.Contains(raw, []byte(want)) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestUnknownRoutesAndMethodsAreProblems(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	req, _ := http.NewRequest(http.MethodGet, h.url+"/v1/events", nil)
	if r := do(t, req); r.status != http.StatusMethodNotAllowed || r.body["type"] != "urn:spoolcast:problem:method-not-allowed" {
		t.Errorf("GET /v1/events = %d %v", r.status, r.body)
	}
	req, _ = http.NewRequest(http.MethodGet, h.url+"/nope", nil)
	if r := do(t, req); r.status != http.StatusNotFound {
		t.Errorf("GET /nope = %d", r.status)
	}
}

func TestHalfClosedRequestsGetTheirRealAnswer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	addr := strings.TrimPrefix(h.url, "http://")
	const n = 150
	type answer struct {
		key    string
		status int
		body   string
		err    error
	}
	answers := make(chan answer, n)
	for i := range n {
		go func() {
			key := fmt.Sprintf("half-%d", i)
			body := event(key, "t")
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				answers <- answer{key: key, err: err}
				return
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST /v1/events HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			// The producer is done writing: it half-closes and waits for the answer.
			if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
				answers <- answer{key: key, err: err}
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				answers <- answer{key: key, err: err}
				return
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers <- answer{key: key, status: resp.StatusCode, body: string(raw)}
		}()
	}
	accepted := 0
	for range n {
		a := <-answers
		switch {
		case a.err != nil:
			t.Errorf("%s: %v", a.key, a.err)
		case a.status == http.StatusAccepted && strings.Contains(a.body, `"status":"accepted"`):
			accepted++
		default:
			t.Errorf("%s: %d %q; want 202 accepted with its body", a.key, a.status, a.body)
		}
	}
	if got := h.rows(t); accepted != n || got != n {
		t.Errorf("%d of %d half-closed requests answered 202, spool holds %d; want every one of both", accepted, n, got)
	}
}

func TestABodyThatArrivesTooSlowlyIs408(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{readTimeout: 300 * time.Millisecond})
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := event("slow", "t")
	fmt.Fprintf(conn, "POST /v1/events HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:10])
	// The rest of the body never comes; the server's read deadline passes.
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&p)
	if resp.StatusCode != http.StatusRequestTimeout || p["type"] != "urn:spoolcast:problem:request-timeout" {
		t.Errorf("slow body = %d %v; want 408 request-timeout", resp.StatusCode, p)
	}
	if got := h.rows(t); got != 0 {
		t.Errorf("spool rows = %d, want 0", got)
	}
}

func TestInvalidUTF8Is400NamingTheField(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	a := h.post(t, "{\"idempotency_key\":\"k\xff\",\"type\":\"t\",\"recipients\":[\"u\"]}")
	b := h.post(t, "{\"idempotency_key\":\"k\xfe\",\"type\":\"t\",\"recipients\":[\"u\"]}")
	for _, r := range []response{a, b} {
		if r.status != http.StatusBadRequest || r.body["field"] != "idempotency_key" || r.body["type"] != "urn:spoolcast:problem:invalid-event" {
			t.Errorf("invalid UTF-8 key = %d %v; want 400 invalid-event naming idempotency_key", r.status, r.body)
		}
	}
	if r := h.post(t, "{\"idempotency_key\":\"ok\",\"type\":\"t\",\"recipients\":[\"u\"],\"data\":{\"x\":\"\xc3\"}}"); r.status != http.StatusBadRequest || r.body["field"] != "data" {
		t.Errorf("invalid UTF-8 in data = %d %v; want 400 naming data", r.status, r.body)
	}
	if got := h.rows(t); got != 0 {
		t.Errorf("spool rows = %d, want 0", got)
	}
}

func readyz(t *testing.T, h *harness) response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.url+"/readyz", nil)
	return do(t, req)
}

func TestReadinessSaysWhetherNewEventsWouldBeTaken(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{spoolMaxBytes: 24 << 10})
	if r := readyz(t, h); r.status != http.StatusOK {
		t.Fatalf("readyz of an empty relay = %d %v", r.status, r.body)
	}
	for i := 0; ; i++ {
		if r := h.post(t, event(fmt.Sprintf("fill-%d", i), strings.Repeat("t", 1000))); r.status != http.StatusAccepted {
			break
		}
	}
	if r := readyz(t, h); r.status != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(r.body["detail"]), "limit") {
		t.Errorf("readyz with the spool at its limit = %d %v; want 503 naming the limit", r.status, r.body)
	}
	h2 := newHarness(t, harnessOpts{})
	h2.server.Drain()
	if r := readyz(t, h2); r.status != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(r.body["detail"]), "shutting down") {
		t.Errorf("readyz while draining = %d %v; want 503 shutting down", r.status, r.body)
	}
	if r := h2.post(t, event("during-drain", "t")); r.status != http.StatusAccepted {
		t.Errorf("an event posted while draining = %d; want it still answered 202", r.status)
	}
}

func TestAFullDiskIs503WithItsOwnProblemUntilThereIsRoom(t *testing.T) {
	t.Parallel()
	dir := disktest.Small(t, 2<<20)
	h := newHarness(t, harnessOpts{spoolDir: dir})
	if r := h.post(t, event("before", "t")); r.status != http.StatusAccepted {
		t.Fatalf("first post = %d", r.status)
	}
	filler := disktest.Fill(t, dir, 0)
	var last response
	for i := range 500 {
		last = h.post(t, event(fmt.Sprintf("k%d", i), strings.Repeat("t", 1000)))
		if last.status != http.StatusAccepted {
			break
		}
	}
	if last.status != http.StatusServiceUnavailable || last.header.Get("Retry-After") == "" || last.body["type"] != "urn:spoolcast:problem:disk-full" {
		t.Fatalf("post on a full disk = %d %v %v; want 503 disk-full with Retry-After", last.status, last.header, last.body)
	}
	if r := readyz(t, h); r.status != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(r.body["detail"]), "disk is full") {
		t.Errorf("readyz on a full disk = %d %v; want 503 naming the disk", r.status, r.body)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if r := readyz(t, h); r.status != http.StatusOK {
		t.Errorf("readyz once space is freed = %d %v", r.status, r.body)
	}
	if r := h.post(t, event("after", "t")); r.status != http.StatusAccepted {
		t.Errorf("post once space is freed = %d %v", r.status, r.body)
	}
}

// An event that would push an empty banner is refused before it is spooled,
// saying why; a body alone is enough to push.
func TestAnEventThatWouldShowNothingIsRefusedAndABodyAloneIsTaken(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	r := h.post(t, `{"idempotency_key":"silent","type":"t","recipients":["u"]}`)
	if r.status != http.StatusBadRequest || r.body["field"] != "title" || !strings.Contains(fmt.Sprint(r.body["detail"]), "empty banner") {
		t.Errorf("an event with neither title nor body = %d %v; want 400 naming title and why", r.status, r.body)
	}
	if n := h.rows(t); n != 0 {
		t.Errorf("the refused event left %d rows in the spool", n)
	}
	if r := h.post(t, `{"idempotency_key":"body-only","type":"t","recipients":["u"],"body":"Starts Monday 10:00"}`); r.status != http.StatusAccepted {
		t.Errorf("an event with a body and no title = %d %v; want 202", r.status, r.body)
	}
}
