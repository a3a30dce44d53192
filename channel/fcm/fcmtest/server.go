// Package fcmtest is a fake of Firebase Cloud Messaging's HTTP v1 API and
// of the Google OAuth token endpoint in front of it, for tests and for the
// chaos harness (it imports no testing, and runs in a plain binary).
//
// The token endpoint takes what Google's does: a JWT grant signed RS256 by
// a service account's key, which it verifies (signature, kid, iss, aud,
// scope, iat and exp), and answers an access token that lasts as long as it
// is told. The fake FCM takes only access tokens it issued and that have
// not expired, checks the project and the message's shape, records what it
// took, and fails as it is told: per-token errors with Google's exact error
// bodies, the next requests answered 503 or 429 with Retry-After, slow
// answers, connections dropped without an answer (the next requests', or
// those of every request in flight).
//
// Both listen on loopback, plain HTTP/1.1.
package fcmtest

import (
	"cmp"
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// DefaultProjectID is the project of a Config that names none.
const DefaultProjectID = "spoolcast-test"

// Config configures a fake.
type Config struct {
	// ProjectID is the project whose messages it takes. Default DefaultProjectID.
	ProjectID string
	// Addr is where the fake FCM listens. Default "127.0.0.1:0".
	Addr string
	// TokenAddr is where the token endpoint listens. Default "127.0.0.1:0".
	TokenAddr string
	// TokenLifetime is the expires_in of the access tokens it issues. Default 1h.
	TokenLifetime time.Duration
	// Key is the key of the service account Start makes. Default a new
	// 2048-bit RSA key: a tenth of a second, or several under the race
	// detector, which a suite of many fakes saves by sharing one.
	Key *rsa.PrivateKey
}

// Server is a running fake FCM and token endpoint. It is safe for
// concurrent use.
type Server struct {
	project  string
	fcm      *http.Server
	token    *http.Server
	fcmURL   string
	tokenURL string
	account  *ServiceAccount
	closing  chan struct{}
	closed   sync.Once

	mu sync.Mutex
	// The token endpoint's.
	accounts      map[string]*ServiceAccount // by private_key_id
	lifetime      time.Duration
	issued        map[string]time.Time // access token → when it expires
	grants        []Grant
	refused       int
	tokenFailure  int // the token endpoint's answer while not 0
	tokenRequests int
	// The FCM's.
	messages    []Message
	requests    int
	badBearers  int
	tokenErrors map[string]Error
	next        []Error // the next requests' answers
	delay       time.Duration
	answerAfter int // requests answered before dropping starts
	drop        int // requests to drop then
	dropped     int
	inFlight    int
	maxInFlight int
	onMessage   func(Message)
	cut         chan struct{} // closed by CutConnections
	seq         int
}

// Start starts a fake, with a service account of its project that its
// token endpoint trusts (Account).
func Start(cfg Config) (*Server, error) {
	s := &Server{
		project:     cmp.Or(cfg.ProjectID, DefaultProjectID),
		closing:     make(chan struct{}),
		accounts:    map[string]*ServiceAccount{},
		lifetime:    cmp.Or(cfg.TokenLifetime, time.Hour),
		issued:      map[string]time.Time{},
		tokenErrors: map[string]Error{},
		cut:         make(chan struct{}),
	}
	fcmLn, err := net.Listen("tcp", cmp.Or(cfg.Addr, "127.0.0.1:0"))
	if err != nil {
		return nil, fmt.Errorf("fake FCM: %w", err)
	}
	tokenLn, err := net.Listen("tcp", cmp.Or(cfg.TokenAddr, "127.0.0.1:0"))
	if err != nil {
		fcmLn.Close()
		return nil, fmt.Errorf("fake token endpoint: %w", err)
	}
	s.fcmURL = "http://" + fcmLn.Addr().String()
	s.tokenURL = "http://" + tokenLn.Addr().String() + "/token"
	if cfg.Key != nil {
		s.account = newServiceAccount(s.project, s.tokenURL, cfg.Key)
	} else if s.account, err = NewServiceAccount(s.project, s.tokenURL); err != nil {
		fcmLn.Close()
		tokenLn.Close()
		return nil, err
	}
	s.Trust(s.account)
	s.fcm = &http.Server{Handler: http.HandlerFunc(s.serveSend), ReadHeaderTimeout: 10 * time.Second}
	s.token = &http.Server{Handler: http.HandlerFunc(s.serveToken), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.fcm.Serve(fcmLn) }()
	go func() { _ = s.token.Serve(tokenLn) }()
	return s, nil
}

// URL is the fake FCM's base URL, in place of https://fcm.googleapis.com.
func (s *Server) URL() string { return s.fcmURL }

// TokenURL is the token endpoint, the token_uri of its accounts.
func (s *Server) TokenURL() string { return s.tokenURL }

// ProjectID is the project whose messages it takes.
func (s *Server) ProjectID() string { return s.project }

// Account is the service account Start made, which the token endpoint trusts.
func (s *Server) Account() *ServiceAccount { return s.account }

// WriteCredentials writes Account's key file to path: what
// --fcm-credentials-file names.
func (s *Server) WriteCredentials(path string) error { return s.account.WriteFile(path) }

// Trust makes the token endpoint take grants signed by sa's key.
func (s *Server) Trust(sa *ServiceAccount) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.accounts[sa.PrivateKeyID] = sa
}

// Close stops both servers, cutting their connections and any answer
// still waiting. It is safe to call twice.
func (s *Server) Close() error {
	var err error
	s.closed.Do(func() {
		close(s.closing)
		err = errors.Join(s.fcm.Close(), s.token.Close())
	})
	return err
}

// Token endpoint faults and records.

// SetTokenLifetime sets the expires_in of the access tokens issued from now on.
func (s *Server) SetTokenLifetime(d time.Duration) { s.mu.Lock(); s.lifetime = d; s.mu.Unlock() }

// RefuseGrants makes the token endpoint refuse every grant (400
// invalid_grant, as Google answers for a deleted key) while on.
func (s *Server) RefuseGrants(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokenFailure = 0
	if on {
		s.tokenFailure = http.StatusBadRequest
	}
}

// FailTokens makes the token endpoint answer status to every request
// until called with 0: an outage (a 5xx) or a refusal (a 4xx).
func (s *Server) FailTokens(status int) { s.mu.Lock(); s.tokenFailure = status; s.mu.Unlock() }

// ExpireTokens makes every access token issued so far expired: the
// fake FCM answers them 401 UNAUTHENTICATED.
func (s *Server) ExpireTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for t := range s.issued {
		s.issued[t] = time.Time{}
	}
}

// TokensIssued is how many access tokens the token endpoint issued.
func (s *Server) TokensIssued() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.issued) }

// TokenRequests is how many requests the token endpoint got, refused ones included.
func (s *Server) TokenRequests() int { s.mu.Lock(); defer s.mu.Unlock(); return s.tokenRequests }

// RefusedGrants is how many grants the token endpoint refused for what they said.
func (s *Server) RefusedGrants() int { s.mu.Lock(); defer s.mu.Unlock(); return s.refused }

// Grants returns the grants the token endpoint took, in order.
func (s *Server) Grants() []Grant {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Grant(nil), s.grants...)
}

// FCM faults and records.

// FailToken makes every message to token answer e, until ClearToken.
func (s *Server) FailToken(token string, e Error) {
	s.mu.Lock()
	s.tokenErrors[token] = e
	s.mu.Unlock()
}

// ClearToken makes messages to token taken again.
func (s *Server) ClearToken(token string) { s.mu.Lock(); delete(s.tokenErrors, token); s.mu.Unlock() }

// FailNext makes the next n requests with a valid bearer answer e,
// whatever their token: an outage (Unavailable with a RetryAfter), a
// quota (QuotaExceeded).
func (s *Server) FailNext(n int, e Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.next = append(s.next, e)
	}
}

// SetDelay makes every answer wait d after its message was taken: FCM
// has it, and the answer comes late (or never, to a client that gives up
// first).
func (s *Server) SetDelay(d time.Duration) { s.mu.Lock(); s.delay = d; s.mu.Unlock() }

// DropConnections answers the next after requests and then takes the n
// after those and closes their connections without an answer: the
// messages are recorded (FCM may have delivered them) and the client
// cannot tell.
func (s *Server) DropConnections(after, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answerAfter, s.drop = after, n
}

// CutConnections closes, without an answer, the connection of every
// request whose answer is waiting (SetDelay): a connection that dies with
// requests in flight. Their messages were taken.
func (s *Server) CutConnections() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.cut)
	s.cut = make(chan struct{})
}

// SetOnMessage makes the fake call f with each message it takes, before
// its answer is written (or dropped).
func (s *Server) SetOnMessage(f func(Message)) { s.mu.Lock(); s.onMessage = f; s.mu.Unlock() }

// Messages returns the messages taken, in order.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.messages...)
}

// Requests is how many send requests the fake FCM got, refused ones included.
func (s *Server) Requests() int { s.mu.Lock(); defer s.mu.Unlock(); return s.requests }

// BadBearers is how many send requests were refused for their access
// token: unknown, or expired.
func (s *Server) BadBearers() int { s.mu.Lock(); defer s.mu.Unlock(); return s.badBearers }

// Dropped is how many requests had their connection dropped.
func (s *Server) Dropped() int { s.mu.Lock(); defer s.mu.Unlock(); return s.dropped }

// MaxInFlight is the most send requests the fake FCM was handling at once.
func (s *Server) MaxInFlight() int { s.mu.Lock(); defer s.mu.Unlock(); return s.maxInFlight }

// wait waits d, or less when the request or the server ends first, or
// its connection is cut (cut true).
func (s *Server) wait(ctx context.Context, d time.Duration, cutting <-chan struct{}) (cut bool) {
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-s.closing:
	case <-cutting:
		return true
	}
	return false
}
