// Package apnstest is a fake APNs that speaks the provider API as Apple
// serves it: HTTP/2 over TLS, negotiated by ALPN or nothing; POST
// /3/device/{token}; a provider token (an ES256 JWT) checked on every
// request; the reasons APNs answers with. A test scripts the rest: one
// token's answer, the next requests failing, slow answers, connections
// that die with streams in flight. It records every request it receives.
//
// It imports no testing package: the chaos harness runs it in a binary.
package apnstest

import (
	"cmp"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// APNs' limits, as the fake enforces them.
const (
	MaxPayload    = 4096 // bytes of JSON
	MaxCollapseID = 64   // bytes of apns-collapse-id
)

// Reply is a scripted answer.
type Reply struct {
	Status int
	// Reason is APNs' reason code, sent as {"reason": ...}.
	Reason string
	// RetryAfter, when positive, is sent as a Retry-After header in whole
	// seconds. (APNs does not document one; proxies and a future APNs may.)
	RetryAfter time.Duration
	// Timestamp is a 410's "timestamp": when APNs last confirmed the
	// token invalid. Zero: the time of the answer.
	Timestamp time.Time
}

// Request is one request the fake received.
type Request struct {
	Token   string
	Header  http.Header
	Payload []byte
	// JWT is the provider token presented; IssuedAt its iat claim, zero
	// when its signature, kid or iss did not verify.
	JWT      string
	IssuedAt time.Time
	// Conn is the client's address: one per connection.
	Conn string
	// Status and Reason are what the fake answered; Status 0: no answer
	// (the connection was killed, or the client gave up first).
	Status int
	Reason string
	// APNsID is the apns-id answered (the request's, or a new UUID).
	APNsID string
	// At is when it arrived, on the fake's clock.
	At time.Time
}

// Server is a running fake APNs on a loopback port.
type Server struct {
	keyID, teamID string
	pub           *ecdsa.PublicKey
	url           string
	pool          *x509.CertPool
	certPEM       []byte
	srv           *http.Server
	closeOnce     sync.Once

	mu                    sync.Mutex
	now                   func() time.Time
	answers               map[string]Reply
	otherEnvironment      bool
	failNext              int
	failReply             Reply
	delay                 time.Duration
	killAfter             int // requests still to receive before the kill; 0: none armed
	conns                 map[net.Conn]struct{}
	requests              []Request
	jwts                  map[string]struct{}
	signed                map[string]time.Time // bearer → iat, of JWTs whose signature, kid and iss verified
	updateEvery           time.Duration        // LimitTokenUpdates; 0: no limit
	newestIat             time.Time            // of the newest JWT taken, for updateEvery
	tooManyUpdates        int
	inFlight, maxInFlight int
}

// New starts a fake APNs that accepts provider tokens signed by pub's
// private key, with kid keyID and iss teamID. Like httptest.NewServer it
// panics if it cannot listen on the loopback interface.
func New(keyID, teamID string, pub *ecdsa.PublicKey) *Server {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("apnstest: listen: %v", err))
	}
	cert, pool := selfSigned()
	s := &Server{
		keyID:   keyID,
		teamID:  teamID,
		pub:     pub,
		url:     "https://" + ln.Addr().String(),
		pool:    pool,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}),
		now:     time.Now,
		answers: map[string]Reply{},
		conns:   map[net.Conn]struct{}{},
		jwts:    map[string]struct{}{},
		signed:  map[string]time.Time{},
	}
	// HTTP/2 only, as Apple: a client that does not negotiate h2 by ALPN
	// fails its handshake, or finds the connection closed.
	var protocols http.Protocols
	protocols.SetHTTP2(true)
	s.srv = &http.Server{
		Handler:   s,
		Protocols: &protocols,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}},
		ConnState: s.track,
		ErrorLog:  log.New(io.Discard, "", 0), // killed connections and refused handshakes are the point
	}
	go func() { _ = s.srv.ServeTLS(ln, "", "") }()
	return s
}

// URL is the fake's base URL (https://127.0.0.1:port), a client's host.
func (s *Server) URL() string { return s.url }

// CertPool trusts the fake's self-signed certificate.
func (s *Server) CertPool() *x509.CertPool { return s.pool }

// CertPEM is the fake's self-signed certificate, PEM: what a process
// given --apns-ca-file trusts.
func (s *Server) CertPEM() []byte { return s.certPEM }

// Close stops the fake and drops its connections; safe to call twice.
func (s *Server) Close() {
	s.closeOnce.Do(func() { _ = s.srv.Close() })
}

// SetClock sets the fake's clock, against which a token's iat is judged.
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}

// OtherEnvironment makes the fake the APNs environment the devices'
// tokens are not of (a client pointed at production with development
// builds' tokens, or the reverse: a wrong --apns-sandbox): every device
// token is answered 400 BadDeviceToken, as Apple does, until called with
// false.
func (s *Server) OtherEnvironment(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.otherEnvironment = on
}

// Answer makes every later request for token that passes the checks
// answer r; Reply{Status: 200} restores the default.
func (s *Server) Answer(token string, r Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers[token] = r
}

// FailNext makes the next n requests that pass the checks, whatever their
// token, answer r (a 503 Shutdown, a 429).
func (s *Server) FailNext(n int, r Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext, s.failReply = n, r
}

// SetDelay holds every later answer for d.
func (s *Server) SetDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// KillAfter closes every connection, abruptly, when n more requests have
// been received: the nth and every stream still in flight get no answer.
// It fires once; later connections are served.
func (s *Server) KillAfter(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killAfter = n
}

// Requests is every request received so far, in order of arrival.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.requests))
	copy(out, s.requests)
	return out
}

// LimitTokenUpdates makes the fake refuse, as Apple does, a provider
// token newer than the newest it took by less than every (Apple: 20
// minutes): 429 TooManyProviderTokenUpdates. 0 lifts the limit.
func (s *Server) LimitTokenUpdates(every time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.updateEvery = every
}

// TooManyTokenUpdates is how many requests were refused for
// TooManyProviderTokenUpdates.
func (s *Server) TooManyTokenUpdates() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tooManyUpdates
}

// JWTs is how many distinct provider tokens were presented.
func (s *Server) JWTs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.jwts)
}

// Connections is how many connections carried a request.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	for _, r := range s.requests {
		seen[r.Conn] = true
	}
	return len(seen)
}

// MaxInFlight is the most requests the fake held at once, unanswered.
func (s *Server) MaxInFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxInFlight
}

// track keeps the open connections, for KillAfter.
func (s *Server) track(c net.Conn, state http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch state {
	case http.StateNew:
		s.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(s.conns, c)
	}
}

// kill closes the TCP connections under TLS: no close_notify, no GOAWAY,
// as a connection that dies.
func (s *Server) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if tc, ok := c.(*tls.Conn); ok {
			c = tc.NetConn()
		}
		_ = c.Close()
	}
	clear(s.conns)
}

// ServeHTTP answers as APNs: the path and method, then the provider
// token, then the headers and payload, then what the test scripted.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token, ok := strings.CutPrefix(r.URL.Path, "/3/device/")
	if !ok {
		reply(w, Reply{Status: http.StatusNotFound, Reason: "BadPath"}, newUUID())
		return
	}
	if r.Method != http.MethodPost {
		reply(w, Reply{Status: http.StatusMethodNotAllowed, Reason: "MethodNotAllowed"}, newUUID())
		return
	}
	payload, _ := io.ReadAll(r.Body)
	bearer, _ := strings.CutPrefix(r.Header.Get("authorization"), "bearer ")

	s.mu.Lock()
	iat, authErr := s.verify(bearer)
	idx := len(s.requests)
	s.requests = append(s.requests, Request{
		Token: token, Header: r.Header.Clone(), Payload: payload,
		JWT: bearer, IssuedAt: iat, Conn: r.RemoteAddr, At: s.now(),
	})
	if bearer != "" {
		s.jwts[bearer] = struct{}{}
	}
	killNow := false
	if s.killAfter > 0 {
		s.killAfter--
		killNow = s.killAfter == 0
	}
	delay := s.delay
	s.inFlight++
	s.maxInFlight = max(s.maxInFlight, s.inFlight)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()

	if killNow {
		s.kill()
		<-r.Context().Done() // returning would answer 200
		return
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}

	answer := s.judge(token, r.Header, payload, authErr)
	id := r.Header.Get("apns-id")
	if id == "" {
		id = newUUID()
	}
	s.mu.Lock()
	s.requests[idx].Status, s.requests[idx].Reason, s.requests[idx].APNsID = answer.Status, answer.Reason, id
	s.mu.Unlock()
	reply(w, answer, id)
}

// judge is the answer to a request received: a refusal of its token,
// headers or payload, else the scripted answer, else 200.
func (s *Server) judge(token string, h http.Header, payload []byte, authErr string) Reply {
	switch {
	case authErr == "TooManyProviderTokenUpdates":
		return Reply{Status: http.StatusTooManyRequests, Reason: authErr}
	case authErr != "":
		return Reply{Status: http.StatusForbidden, Reason: authErr}
	case token == "":
		return Reply{Status: http.StatusBadRequest, Reason: "MissingDeviceToken"}
	case h.Get("apns-topic") == "":
		return Reply{Status: http.StatusBadRequest, Reason: "MissingTopic"}
	case len(h.Get("apns-collapse-id")) > MaxCollapseID:
		return Reply{Status: http.StatusBadRequest, Reason: "BadCollapseId"}
	case len(payload) > MaxPayload:
		return Reply{Status: http.StatusRequestEntityTooLarge, Reason: "PayloadTooLarge"}
	case len(payload) == 0:
		return Reply{Status: http.StatusBadRequest, Reason: "PayloadEmpty"}
	case h.Get("apns-push-type") == "background" && h.Get("apns-priority") != "5":
		// Apple: a background notification's priority must be 5.
		return Reply{Status: http.StatusBadRequest, Reason: "BadPriority"}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failNext > 0 {
		s.failNext--
		return s.failReply
	}
	if s.otherEnvironment {
		return Reply{Status: http.StatusBadRequest, Reason: "BadDeviceToken"}
	}
	if a, ok := s.answers[token]; ok && a.Status != 0 {
		return a
	}
	return Reply{Status: http.StatusOK}
}

// verify checks a provider token as APNs does, answering its iat or the
// reason for a 403. Called with s.mu held, for the clock.
func (s *Server) verify(bearer string) (time.Time, string) {
	if bearer == "" {
		return time.Time{}, "MissingProviderToken"
	}
	// A JWT's signature, kid and iss are checked once (its bearer is
	// reused for up to an hour); its age at every request.
	at, ok := s.signed[bearer]
	if !ok {
		at, ok = s.parse(bearer)
		if !ok {
			return time.Time{}, "InvalidProviderToken"
		}
		if s.updateEvery > 0 && at.After(s.newestIat) && !s.newestIat.IsZero() && at.Sub(s.newestIat) < s.updateEvery {
			s.tooManyUpdates++
			return at, "TooManyProviderTokenUpdates"
		}
		s.signed[bearer] = at
		if at.After(s.newestIat) {
			s.newestIat = at
		}
	}
	now := s.now()
	switch {
	case at.After(now):
		return time.Time{}, "InvalidProviderToken"
	case now.Sub(at) > time.Hour:
		return at, "ExpiredProviderToken"
	}
	return at, ""
}

// parse checks bearer's signature, kid and iss, and returns its iat.
func (s *Server) parse(bearer string) (time.Time, bool) {
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(bearer, claims, func(t *jwt.Token) (any, error) {
		if kid, _ := t.Header["kid"].(string); kid != s.keyID {
			return nil, fmt.Errorf("kid %q, want %q", kid, s.keyID)
		}
		return s.pub, nil
	}, jwt.WithValidMethods([]string{"ES256"}), jwt.WithoutClaimsValidation())
	if err != nil {
		return time.Time{}, false
	}
	iss, _ := claims.GetIssuer()
	at, err := claims.GetIssuedAt()
	if iss != s.teamID || err != nil || at == nil {
		return time.Time{}, false
	}
	return at.Time, true
}

// reply writes an answer: apns-id always, the reason as JSON on a refusal,
// and the timestamp APNs adds to a 410.
func reply(w http.ResponseWriter, a Reply, id string) {
	w.Header().Set("apns-id", id)
	if a.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(a.RetryAfter/time.Second)))
	}
	if a.Status == http.StatusOK {
		w.WriteHeader(http.StatusOK)
		return
	}
	body := map[string]any{"reason": a.Reason}
	if a.Status == http.StatusGone {
		body["timestamp"] = cmp.Or(a.Timestamp, time.Now()).UnixMilli()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.Status)
	_ = json.NewEncoder(w).Encode(body) // fails only when the client is gone
}

// newUUID is a random (version 4) UUID, as APNs makes an apns-id.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
