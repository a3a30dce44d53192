package webpush

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/sendtrace"
)

// DefaultTimeout bounds a request of NewSender's default client.
const DefaultTimeout = 30 * time.Second

// A VAPID token lives tokenLifetime (RFC 8292 allows at most 24 hours) and
// is used until tokenMargin before it expires, so that one still good when
// sent is not expired when checked by a push service whose clock is ahead.
const (
	tokenLifetime = 12 * time.Hour
	tokenMargin   = time.Hour
)

// Sender sends push messages as one application server. It is safe for
// concurrent use.
type Sender struct {
	key     *VAPIDKey
	subject string
	client  *http.Client
	clock   clock.Clock

	mu     sync.Mutex
	tokens map[string]vapidToken // by audience: the push service's origin
}

type vapidToken struct {
	header string    // the Authorization header
	renew  time.Time // when to sign a new one
}

// NewSender returns a sender that signs with key and names subject — a
// mailto: or https: URL where the push service's operator can reach ours
// (RFC 8292 §2.1). It sends with a copy of client that never follows a
// redirect; nil is a client with a DefaultTimeout.
func NewSender(key *VAPIDKey, subject string, client *http.Client) (*Sender, error) {
	if key == nil || key.private == nil {
		return nil, errors.New("push sender: no VAPID key")
	}
	if err := checkSubject(subject); err != nil {
		return nil, err
	}
	// A transport of its own: connections to push services are the sender's,
	// not closed by whatever else shares http.DefaultTransport.
	c := &http.Client{Timeout: DefaultTimeout, Transport: http.DefaultTransport.(*http.Transport).Clone()}
	if client != nil {
		copied := *client
		c = &copied
	}
	// A push service does not redirect; a redirect elsewhere would take the
	// message, and the VAPID token, to a server it was not meant for.
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Sender{key: key, subject: subject, client: c, clock: clock.Real{}, tokens: map[string]vapidToken{}}, nil
}

func checkSubject(subject string) error {
	u, err := url.Parse(subject)
	if err == nil && (u.Scheme == "mailto" && strings.Contains(u.Opaque, "@") || u.Scheme == "https" && u.Host != "") {
		return nil
	}
	return fmt.Errorf("VAPID subject %q: want a mailto: or https: URL, e.g. mailto:ops@example.com", subject)
}

// Send makes one request to deliver msg to sub: never retried here, and
// bounded by ctx and the client's timeout. Result says what became of it.
func (s *Sender) Send(ctx context.Context, sub Subscription, msg Message) Result {
	parsed, err := sub.check()
	if err == nil {
		err = msg.check()
	}
	if err != nil {
		return Result{Outcome: Invalid, Err: err}
	}
	// Whether the push service may have the request whole (sendtrace)
	// tells one it did not take (no connection, or one that broke while it
	// was written: it takes a message only once it has it whole) from one
	// it may have, erring towards sending once.
	ctx, trace := sendtrace.With(ctx)
	req, err := s.request(ctx, sub.Endpoint, parsed, msg)
	if err != nil {
		return Result{Outcome: Invalid, Err: err}
	}
	resp, err := s.client.Do(req)
	switch {
	case err != nil && trace.MaybeReceived():
		return Result{Outcome: Unknown, Err: fmt.Errorf("push: %w (it may have been delivered)", err)}
	case err != nil:
		return Result{Outcome: NotSent, Err: fmt.Errorf("push: %w", err)}
	}
	defer resp.Body.Close()
	return answer(resp, s.clock.Now())
}

// request is the POST of msg to endpoint, encrypted for its subscription.
func (s *Sender) request(ctx context.Context, endpoint string, sub parsedSubscription, msg Message) (*http.Request, error) {
	as, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("push: %w", err)
	}
	salt := make([]byte, 16)
	_, _ = rand.Read(salt) // never fails
	body, err := encrypt(msg.Payload, sub.p256dh, sub.auth, as, salt)
	if err != nil {
		return nil, fmt.Errorf("push: %w", err)
	}
	auth, err := s.authorization(sub.endpoint)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("push: %w", err)
	}
	req.Header.Set("Authorization", auth)
	req.Header.Set("Content-Encoding", "aes128gcm")
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("TTL", msg.ttlHeader())
	if msg.Urgency != "" {
		req.Header.Set("Urgency", msg.Urgency)
	}
	if msg.Topic != "" {
		req.Header.Set("Topic", msg.Topic)
	}
	return req, nil
}

// authorization is the VAPID Authorization header for endpoint (RFC 8292
// §3): a token for its origin, signed once and reused until near its expiry,
// so that sending costs no signature per message.
func (s *Sender) authorization(endpoint *url.URL) (string, error) {
	aud := origin(endpoint)
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.tokens[aud]; ok && now.Before(t.renew) {
		return t.header, nil
	}
	exp := now.Add(tokenLifetime)
	token, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{
		"aud": aud,
		"exp": exp.Unix(),
		"sub": s.subject,
	}).SignedString(s.key.private)
	if err != nil {
		return "", fmt.Errorf("push: sign VAPID token: %w", err)
	}
	for a, t := range s.tokens { // the tokens of push services no longer sent to
		if !now.Before(t.renew) {
			delete(s.tokens, a)
		}
	}
	header := "vapid t=" + token + ", k=" + s.key.public
	s.tokens[aud] = vapidToken{header: header, renew: exp.Add(-tokenMargin)}
	return header, nil
}

// origin is u's origin as RFC 6454 writes it, the VAPID token's audience:
// scheme and host, in lower case, with the port only when not the default.
func origin(u *url.URL) string {
	host := strings.ToLower(u.Host)
	if p := u.Port(); u.Scheme == "https" && p == "443" || u.Scheme == "http" && p == "80" {
		host = strings.TrimSuffix(host, ":"+p)
	}
	return u.Scheme + "://" + host
}
