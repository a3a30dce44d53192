package webpush

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/spoolcast/spoolcast/internal/clock"
)

const testSubject = "mailto:ops@spoolcast.test"

func newKey(t testing.TB) *VAPIDKey {
	t.Helper()
	pemBytes, err := GenerateVAPIDKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	key, err := LoadVAPIDKey(pemBytes)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func newSender(t testing.TB, key *VAPIDKey) *Sender {
	t.Helper()
	s, err := NewSender(key, testSubject, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newSubscription is a browser's subscription to endpoint, with fresh keys.
func newSubscription(t testing.TB, endpoint string) Subscription {
	t.Helper()
	ua, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	auth := make([]byte, 16)
	_, _ = rand.Read(auth)
	return Subscription{
		Endpoint: endpoint,
		P256dh:   base64.RawURLEncoding.EncodeToString(ua.PublicKey().Bytes()),
		Auth:     base64.RawURLEncoding.EncodeToString(auth),
	}
}

// recorder is a push service that answers with answer and keeps the requests.
type recorder struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []*http.Request
	body [][]byte
}

func newRecorder(t *testing.T, answer http.HandlerFunc) *recorder {
	t.Helper()
	rec := &recorder{}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.reqs, rec.body = append(rec.reqs, r), append(rec.body, b)
		rec.mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(rec.Close)
	return rec
}

func (rec *recorder) requests() []*http.Request {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.reqs
}

func created(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Location", "https://push.example/m/42")
	w.WriteHeader(http.StatusCreated)
}

func TestSendPostsOneEncryptedMessageWithItsHeaders(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, created)
	key := newKey(t)
	sender := newSender(t, key)
	sub := newSubscription(t, rec.URL+"/push/abc")
	cases := []struct {
		msg              Message
		ttl, urg, topic  string
		payloadBytesSent int
	}{
		{Message{Payload: []byte("hi"), TTL: 90 * time.Second, Urgency: UrgencyHigh, Topic: "build-1234"}, "90", "high", "build-1234", 2},
		{Message{Payload: []byte("hello")}, "2419200", "", "", 5},
		{Message{TTL: -time.Second, Urgency: UrgencyLow}, "0", "low", "", 0},
	}
	for _, c := range cases {
		res := sender.Send(context.Background(), sub, c.msg)
		if res.Outcome != Delivered || res.Status != 201 || res.MessageID != "https://push.example/m/42" || res.Err != nil {
			t.Fatalf("Send(%+v) = %+v", c.msg, res)
		}
	}
	for i, r := range rec.requests() {
		c := cases[i]
		h := r.Header
		if r.Method != http.MethodPost || r.URL.Path != "/push/abc" {
			t.Errorf("request %d: %s %s", i, r.Method, r.URL)
		}
		if h.Get("Content-Encoding") != "aes128gcm" || h.Get("Content-Type") != "application/octet-stream" {
			t.Errorf("request %d: Content-Encoding %q, Content-Type %q", i, h.Get("Content-Encoding"), h.Get("Content-Type"))
		}
		if h.Get("TTL") != c.ttl || h.Get("Urgency") != c.urg || h.Get("Topic") != c.topic {
			t.Errorf("request %d: TTL %q Urgency %q Topic %q, want %q %q %q", i, h.Get("TTL"), h.Get("Urgency"), h.Get("Topic"), c.ttl, c.urg, c.topic)
		}
		if n := len(rec.body[i]); n != headerLen+c.payloadBytesSent+1+tagLen {
			t.Errorf("request %d: a %d-byte body for a %d-byte payload: padded?", i, n, c.payloadBytesSent)
		}
	}
}

// TestTheVAPIDTokenNamesThePushServiceAndExpiresInTwelveHours checks the
// token against RFC 8292 §2 and §3: what web-push-testing does not check.
func TestTheVAPIDTokenNamesThePushServiceAndExpiresInTwelveHours(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, created)
	key := newKey(t)
	sender := newSender(t, key)
	before := time.Now()
	sender.Send(context.Background(), newSubscription(t, rec.URL+"/push/abc"), Message{})

	auth := rec.requests()[0].Header.Get("Authorization")
	token, k, ok := strings.Cut(strings.TrimPrefix(auth, "vapid t="), ", k=")
	if !strings.HasPrefix(auth, "vapid t=") || !ok || k != key.PublicKey() {
		t.Fatalf("Authorization %q, want vapid t=<jwt>, k=%s", auth, key.PublicKey())
	}
	var claims jwt.RegisteredClaims
	_, err := jwt.ParseWithClaims(token, &claims, func(*jwt.Token) (any, error) { return &key.private.PublicKey, nil },
		jwt.WithValidMethods([]string{"ES256"}), jwt.WithAudience(rec.URL), jwt.WithExpirationRequired())
	if err != nil {
		t.Fatalf("token %s: %v", token, err)
	}
	if claims.Subject != testSubject {
		t.Errorf("sub %q, want %q", claims.Subject, testSubject)
	}
	if exp := claims.ExpiresAt.Sub(before); exp < 12*time.Hour-time.Second || exp > 12*time.Hour+time.Second {
		t.Errorf("exp in %v, want 12h", exp)
	}
}

func TestTheVAPIDTokenIsReusedUntilAnHourBeforeItExpires(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, created)
	other := newRecorder(t, created)
	sender := newSender(t, newKey(t))
	fake := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	sender.clock = fake
	sub := newSubscription(t, rec.URL+"/push/abc")
	send := func(sub Subscription) {
		t.Helper()
		if res := sender.Send(context.Background(), sub, Message{}); res.Outcome != Delivered {
			t.Fatal(res.Err)
		}
	}

	// Concurrent sends, under -race, share a token.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { send(sub) })
	}
	wg.Wait()
	send(newSubscription(t, rec.URL+"/push/def")) // another subscription at the same push service
	fake.Advance(11*time.Hour - time.Second)
	send(sub)
	fake.Advance(time.Second)
	send(sub)
	send(newSubscription(t, other.URL+"/push/abc"))

	tokens := map[string]int{}
	for _, r := range rec.requests() {
		tokens[r.Header.Get("Authorization")]++
	}
	if len(tokens) != 2 {
		t.Errorf("%d tokens for %d messages, want 2: one until 11 h, then another", len(tokens), len(rec.requests()))
	}
	if a, b := rec.requests()[0].Header.Get("Authorization"), other.requests()[0].Header.Get("Authorization"); a == b {
		t.Error("two push services got the same token")
	}
}

func TestAnswersAreClassified(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	in90s := now.Add(90 * time.Second).Format(http.TimeFormat)
	cases := []struct {
		name       string
		status     int
		retryAfter string
		body       string
		want       Outcome
		wantAfter  time.Duration
	}{
		{"201 is delivered", 201, "", "", Delivered, 0},
		{"any other 2xx is delivered", 202, "", "", Delivered, 0},
		{"404 is gone", 404, "", "", Gone, 0},
		{"410 is gone", 410, "", `{"reason":"unsubscribed"}`, Gone, 0},
		{"413 is too large", 413, "", "", TooLarge, 0},
		{"429 waits the seconds it says", 429, "120", "", RateLimited, 2 * time.Minute},
		{"429 waits until the date it says", 429, in90s, "", RateLimited, 90 * time.Second},
		{"429 without Retry-After waits the default", 429, "", "", RateLimited, DefaultRetryAfter},
		{"429 with a Retry-After unread waits the default", 429, "soon", "", RateLimited, DefaultRetryAfter},
		{"429 waits at most a day", 429, "99999999999999999", "", RateLimited, 24 * time.Hour},
		{"400 is rejected", 400, "", `{"error":{"message":"Invalid Crypto-Key header sent"}}`, Rejected, 0},
		{"401 is rejected", 401, "", "", Rejected, 0},
		{"403 is rejected", 403, "", "BadJwtToken", Rejected, 0},
		{"500 is unavailable", 500, "", "", Unavailable, 0},
		{"503 is unavailable for as long as it says", 503, "30", "", Unavailable, 30 * time.Second},
		{"a gateway's 502 may hide a message taken: unknown", 502, "", "", Unknown, 0},
		{"a gateway's 504 may hide a message taken: unknown", 504, "", "", Unknown, 0},
		{"any other 5xx is unknown", 507, "", "", Unknown, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
				if c.retryAfter != "" {
					w.Header().Set("Retry-After", c.retryAfter)
				}
				w.WriteHeader(c.status)
				io.WriteString(w, c.body)
			})
			sender := newSender(t, newKey(t))
			sender.clock = clock.Frozen(now)
			res := sender.Send(context.Background(), newSubscription(t, rec.URL), Message{Payload: []byte("x")})
			if res.Outcome != c.want || res.Status != c.status {
				t.Errorf("%v %d (%v), want %v %d", res.Outcome, res.Status, res.Err, c.want, c.status)
			}
			if res.RetryAfter != c.wantAfter {
				t.Errorf("RetryAfter %v, want %v", res.RetryAfter, c.wantAfter)
			}
			if c.want == Delivered {
				if res.Err != nil {
					t.Errorf("Err %v", res.Err)
				}
				return
			}
			if res.Body != c.body || res.Err == nil || !strings.Contains(res.Err.Error(), c.body) {
				t.Errorf("Body %q, Err %v: want the body %q in both", res.Body, res.Err, c.body)
			}
		})
	}
}

func TestOnlyTheStartOfARefusalsBodyIsRead(t *testing.T) {
	t.Parallel()
	var written atomic.Int64
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		chunk := []byte(strings.Repeat("no ", 1000))
		for range 10_000 { // 30 MB, unless the client hangs up
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	res := newSender(t, newKey(t)).Send(context.Background(), newSubscription(t, rec.URL), Message{})
	if res.Outcome != Rejected || len(res.Body) > maxExcerpt {
		t.Errorf("%v with a %d-byte body excerpt", res.Outcome, len(res.Body))
	}
}

func TestARedirectIsNotFollowed(t *testing.T) {
	t.Parallel()
	elsewhere := newRecorder(t, created)
	for _, status := range []int{http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, elsewhere.URL+"/push/abc", status)
		})
		// The caller's client follows redirects; the sender's copy does not.
		sender, err := NewSender(newKey(t), testSubject, &http.Client{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		res := sender.Send(context.Background(), newSubscription(t, rec.URL), Message{Payload: []byte("secret")})
		if res.Outcome != Rejected || res.Status != status {
			t.Errorf("a %d: %v %d, want rejected %d", status, res.Outcome, res.Status, status)
		}
	}
	if n := len(elsewhere.requests()); n != 0 {
		t.Errorf("the server redirected to got %d requests", n)
	}
}

func TestAStalledPushServiceEndsWithTheContext(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	res := newSender(t, newKey(t)).Send(ctx, newSubscription(t, rec.URL), Message{Payload: []byte("x")})
	if res.Outcome != Unknown || !errors.Is(res.Err, context.DeadlineExceeded) {
		t.Errorf("%v (%v), want unknown, deadline exceeded", res.Outcome, res.Err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Send returned after %v", d)
	}
}

func TestAPushServiceThatCannotBeReachedIsNotSent(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	res := newSender(t, newKey(t)).Send(context.Background(), newSubscription(t, "http://"+addr+"/push"), Message{})
	if res.Outcome != NotSent || res.Err == nil {
		t.Errorf("%v (%v), want not sent", res.Outcome, res.Err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := newRecorder(t, created)
	res = newSender(t, newKey(t)).Send(ctx, newSubscription(t, rec.URL), Message{})
	if res.Outcome != NotSent || !errors.Is(res.Err, context.Canceled) || len(rec.requests()) != 0 {
		t.Errorf("with ctx done: %v (%v), want not sent", res.Outcome, res.Err)
	}
}

func TestInvalidMessagesAreNotSent(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, created)
	sender := newSender(t, newKey(t))
	sub := newSubscription(t, rec.URL)

	res := sender.Send(context.Background(), sub, Message{Payload: make([]byte, MaxPayload+1)})
	var tooLarge *PayloadTooLargeError
	if res.Outcome != Invalid || !errors.As(res.Err, &tooLarge) || tooLarge.Size != MaxPayload+1 {
		t.Errorf("a payload of MaxPayload+1: %v (%v)", res.Outcome, res.Err)
	}
	for _, msg := range []Message{
		{Urgency: "urgent"},
		{Topic: strings.Repeat("a", 33)},
		{Topic: "build/1234"},
		{Topic: "build 1234"},
	} {
		if res := sender.Send(context.Background(), sub, msg); res.Outcome != Invalid || !errors.Is(res.Err, ErrBadMessage) {
			t.Errorf("%+v: %v (%v), want invalid", msg, res.Outcome, res.Err)
		}
	}
	bad := sub
	bad.Auth = "short"
	if res := sender.Send(context.Background(), bad, Message{}); res.Outcome != Invalid || !errors.Is(res.Err, ErrBadSubscription) {
		t.Errorf("a bad subscription: %v (%v), want invalid", res.Outcome, res.Err)
	}
	if n := len(rec.requests()); n != 0 {
		t.Errorf("%d requests sent", n)
	}
}

func TestTopicForMakesAValidTopicOfAnyKey(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, key := range []string{"", "digest:user-42", "digest:user-43", strings.Repeat("long ", 1000), "ünï/çødé\x00"} {
		topic := TopicFor(key)
		if len(topic) != 32 || !validTopic(topic) || TopicFor(key) != topic || seen[topic] {
			t.Errorf("TopicFor(%.20q) = %q", key, topic)
		}
		seen[topic] = true
	}
}

func TestNewSenderWantsAMailtoOrHTTPSSubject(t *testing.T) {
	t.Parallel()
	key := newKey(t)
	for subject, ok := range map[string]bool{
		"mailto:ops@spoolcast.test":        true,
		"https://spoolcast.test/contact":   true,
		"ops@spoolcast.test":               false,
		"mailto:":                          false,
		"mailto:nobody":                    false,
		"http://spoolcast.test":            false,
		"https://":                         false,
		"":                                 false,
		"spoolcast.test":                   false,
		"mailto://ops@spoolcast.test/x%zz": false,
	} {
		_, err := NewSender(key, subject, nil)
		if (err == nil) != ok {
			t.Errorf("NewSender(subject %q): %v", subject, err)
		}
	}
	if _, err := NewSender(nil, testSubject, nil); err == nil {
		t.Error("NewSender without a key")
	}
}

func TestOriginIsTheVAPIDAudience(t *testing.T) {
	t.Parallel()
	for endpoint, want := range map[string]string{
		"https://fcm.googleapis.com/fcm/send/abc":                   "https://fcm.googleapis.com",
		"https://FCM.googleapis.com:443/fcm/send/abc":               "https://fcm.googleapis.com",
		"https://updates.push.services.mozilla.com:8443/wpush/v2/x": "https://updates.push.services.mozilla.com:8443",
		"http://127.0.0.1:80/notify/x":                              "http://127.0.0.1",
		"http://[::1]:8090/notify/x":                                "http://[::1]:8090",
	} {
		u, err := checkEndpoint(endpoint)
		if err != nil {
			t.Fatal(err)
		}
		if got := origin(u); got != want {
			t.Errorf("origin(%s) = %s, want %s", endpoint, got, want)
		}
	}
}

// What became of a request whose connection broke decides whether it may
// be sent again: one the push service took whole and never answered may
// have been delivered; one that broke while it was written was not.
func TestABrokenConnectionIsUnknownOnlyOnceTheRequestWasWrittenWhole(t *testing.T) {
	t.Parallel()
	t.Run("taken, and dropped before the answer", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			panic(http.ErrAbortHandler) // the connection is dropped, unanswered
		})
		res := newSender(t, newKey(t)).Send(context.Background(), newSubscription(t, rec.URL), Message{Payload: []byte("x")})
		if res.Outcome != Unknown {
			t.Errorf("%v (%v), want unknown", res.Outcome, res.Err)
		}
	})
	t.Run("broken while it was written", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder(t, created)
		var d net.Dialer
		client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err == nil {
				conn = &breakingConn{Conn: conn}
			}
			return conn, err
		}}}
		s, err := NewSender(newKey(t), testSubject, client)
		if err != nil {
			t.Fatal(err)
		}
		// Larger than the connection's write buffer, so that it breaks while
		// it is written (a smaller one is handed over whole, then flushed).
		res := s.Send(context.Background(), newSubscription(t, rec.URL), Message{Payload: bytes.Repeat([]byte("x"), 3900)})
		if res.Outcome != NotSent {
			t.Errorf("%v (%v), want not sent", res.Outcome, res.Err)
		}
	})
}

// breakingConn breaks while a request is written: the server gets its first
// bytes, never the whole request.
type breakingConn struct{ net.Conn }

func (b *breakingConn) Write(p []byte) (int, error) {
	n, _ := b.Conn.Write(p[:min(len(p), 10)])
	_ = b.Conn.Close()
	return n, errors.New("write: connection reset by peer")
}
