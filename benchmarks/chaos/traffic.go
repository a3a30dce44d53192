package main

// What users send: producers emitting through the relays with retries (the
// client package), and apps on the live stream and the API.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolcast/spoolcast/client"
	"github.com/spoolcast/spoolcast/event"
)

// scheduledEvents: producers send some events with a send_at (-scheduled).
var scheduledEvents bool

// appUsers have apps; fan-outs also reach bulk users, who have none.
const (
	appUsers  = 16
	bulkUsers = 200
)

func appUser(i int) string  { return fmt.Sprintf("app-%02d", i) }
func bulkUser(i int) string { return fmt.Sprintf("bulk-%03d", i) }

// sent is what producers were told about one event.
type sent struct {
	recipients []string
	accepted   bool // a 2xx answer: the event is promised
	rejected   bool // a 4xx answer
}

// ledger is every answer producers got.
type ledger struct {
	mu     sync.Mutex
	events map[string]*sent // idempotency key →
	// digests names the digest key of each event sent with one; scheduled,
	// the events sent with a send_at.
	digests   map[string]string
	scheduled map[string]bool
	// cancels are the scheduled events producers cancelled; reuses, the
	// keys they sent again with another body.
	cancels map[string]*cancellation
	reuses  map[string]*reuse
	// bad5xx are answers 5xx other than 503 with Retry-After.
	bad5xx    []string
	answers   map[int]int // status → count, over every attempt
	emitErrs  map[string]int
	halfClose atomic.Int64
}

func newLedger() *ledger {
	return &ledger{events: map[string]*sent{}, answers: map[int]int{}, emitErrs: map[string]int{}, digests: map[string]string{}, scheduled: map[string]bool{},
		cancels: map[string]*cancellation{}, reuses: map[string]*reuse{}}
}

// cancellation is one DELETE of a scheduled event and what it was told:
// through a relay (202, the outcome unknown to the producer) or central's
// internal ingress (200 cancelled or 409 already sent).
type cancellation struct {
	viaCentral bool
	status     int       // the last answer; 0 if none came
	stopped    int       // "notifications" of a 200
	answeredAt time.Time // when that answer came
	sendAt     time.Time
}

// reuse is a key sent again with another body, and its answer.
type reuse struct {
	status int // 422 wanted; 0 if none came
	extra  string
}

func (l *ledger) answered(status int, retryAfter string, where string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answers[status]++
	if status >= 500 && !(status == http.StatusServiceUnavailable && retryAfter != "") && len(l.bad5xx) < 20 {
		l.bad5xx = append(l.bad5xx, fmt.Sprintf("%d from %s", status, where))
	}
}

func (l *ledger) record(key string, recipients []string, accepted, rejected bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.events[key]
	if s == nil {
		s = &sent{recipients: recipients}
		l.events[key] = s
	}
	s.accepted = s.accepted || accepted
	s.rejected = s.rejected || rejected
}

// recording is a transport that notes every answer a producer gets.
type recording struct {
	next http.RoundTripper
	l    *ledger
}

func (t recording) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(r)
	if err == nil {
		t.l.answered(resp.StatusCode, resp.Header.Get("Retry-After"), r.URL.Host)
	}
	return resp, err
}

// uuid4 is a random UUIDv4, the key producers send.
func uuid4(rng *rand.Rand) string {
	var b [16]byte
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// producer emits events until ctx ends: mostly one or two app users, now
// and then a fan-out or the largest legal event, sometimes the same event
// again (to either relay), sometimes an invalid one, sometimes over a socket
// it half-closes after the request.
func producer(ctx context.Context, w *world, l *ledger, seed uint64, n int) {
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	clients := make([]*client.Client, len(w.relays))
	for i, r := range w.relays {
		c, err := client.New(client.Config{
			RelayURL:    r.base,
			HTTPClient:  &http.Client{Transport: recording{http.DefaultTransport, l}},
			MaxAttempts: 100, MaxElapsed: 3 * time.Minute, MaxBackoff: 2 * time.Second,
		})
		if err != nil {
			panic(err) // the configuration above is valid
		}
		clients[i] = c
	}
	var cancels sync.WaitGroup
	for ctx.Err() == nil {
		// About 15 events a second per producer: a load the machine's one
		// Postgres and the pushes' Expo rate (600/s) keep up with, so that
		// the run ends settled.
		sleep(ctx, time.Duration(40+rng.IntN(50))*time.Millisecond)
		ev := client.Event{IdempotencyKey: uuid4(rng), Type: "chaos.event", Category: "chaos"}
		ev.Recipients = []string{appUser(rng.IntN(appUsers))}
		if rng.IntN(3) == 0 {
			ev.Recipients = append(ev.Recipients, appUser(rng.IntN(appUsers)))
		}
		switch r := rng.IntN(100); {
		case r < 1: // a fan-out
			for range 50 + rng.IntN(150) {
				ev.Recipients = append(ev.Recipients, bulkUser(rng.IntN(bulkUsers)))
			}
		case r < 4: // the largest legal event
			ev.Title = strings.Repeat("t", event.MaxTitleLen)
			ev.Body = strings.Repeat("b", event.MaxBodyLen)
		case r < 5: // invalid: answered 422, never stored
			ev.Type = ""
		case r < 10 && scheduledEvents: // scheduled a few seconds ahead: stored when it fires
			ev.SendAt = time.Now().Add(time.Duration(2+rng.IntN(18)) * time.Second)
			if rng.IntN(5) == 0 { // an announcement: the firers and a cancel race over many rows
				for range 50 + rng.IntN(150) {
					ev.Recipients = append(ev.Recipients, bulkUser(rng.IntN(bulkUsers)))
				}
			}
		case r < 25: // a chat message, pushed in a digest per room
			ev.Digest = &client.Digest{Key: fmt.Sprintf("room-%d", rng.IntN(3)), Window: event.MinDigestWindow}
		}
		ev.Recipients = dedupe(ev.Recipients)
		if ev.Title == "" {
			ev.Title = "chaos " + ev.IdempotencyKey
		}
		l.mu.Lock()
		if ev.Digest != nil {
			l.digests[ev.IdempotencyKey] = ev.Digest.Key
		}
		if !ev.SendAt.IsZero() {
			l.scheduled[ev.IdempotencyKey] = true
		}
		l.mu.Unlock()
		relay := rng.IntN(len(clients))
		if ev.Type == "" || rng.IntN(50) == 0 { // the client would refuse an invalid event itself
			halfClosed(ctx, w.relays[relay].base, ev, l)
			continue
		}
		emit(ctx, clients[relay], ev, l)
		if rng.IntN(10) == 0 { // a retry by the producer, the same key
			emit(ctx, clients[rng.IntN(len(clients))], ev, l)
		}
		switch {
		case !ev.SendAt.IsZero() && rng.IntN(3) == 0: // cancelled, often at its send_at
			delay := time.Until(ev.SendAt)
			switch r := rng.IntN(4); {
			case r < 2: // as it fires: the firers' passes come within a second after send_at
				delay += time.Duration(rng.IntN(1200)-100) * time.Millisecond
			case r < 3: // before it
				delay = time.Duration(rng.Float64() * float64(delay))
			default: // after it
				delay += time.Duration(rng.IntN(2000)) * time.Millisecond
			}
			viaCentral := rng.IntN(2) == 0
			cancels.Go(func() { cancelLater(ctx, w, l, ev, max(0, delay), relay, viaCentral) })
		case ev.SendAt.IsZero() && rng.IntN(100) == 0: // the key reused for another event
			reuseKey(ctx, clients[relay], ev, l, bulkUser(rng.IntN(bulkUsers)))
		}
	}
	cancels.Wait()
}

// cancelLater cancels ev after delay, through its relay or central's
// internal ingress, retrying what is to be retried, as a producer would.
func cancelLater(ctx context.Context, w *world, l *ledger, ev client.Event, delay time.Duration, relay int, viaCentral bool) {
	sleep(ctx, delay)
	if ctx.Err() != nil {
		return
	}
	c := &cancellation{viaCentral: viaCentral, sendAt: ev.SendAt}
	l.mu.Lock()
	if s := l.events[ev.IdempotencyKey]; s == nil || !s.accepted {
		l.mu.Unlock()
		return // cancels only what was promised
	}
	l.cancels[ev.IdempotencyKey] = c
	l.mu.Unlock()
	path := "/v1/events/" + url.PathEscape(ev.IdempotencyKey)
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; ctx.Err() == nil && time.Now().Before(deadline); i++ {
		base := w.relays[relay].base
		if viaCentral {
			base, path = w.centrals[i%len(w.centrals)].base, "/internal/v1/events/"+url.PathEscape(ev.IdempotencyKey)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, base+path, nil)
		if viaCentral {
			req.Header.Set("Authorization", "Bearer "+w.serviceToken)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		var body struct {
			Notifications int `json:"notifications"`
		}
		_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&body)
		resp.Body.Close()
		l.answered(resp.StatusCode, resp.Header.Get("Retry-After"), req.URL.Host)
		l.mu.Lock()
		c.status, c.stopped, c.answeredAt = resp.StatusCode, body.Notifications, time.Now()
		l.mu.Unlock()
		if resp.StatusCode < 500 {
			return
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// reuseKey sends ev's key again with another body to the relay that took
// ev: a producer's bug the relay must refuse (422), storing nothing of it.
func reuseKey(ctx context.Context, c *client.Client, ev client.Event, l *ledger, extra string) {
	l.mu.Lock()
	promised := l.events[ev.IdempotencyKey].accepted
	l.mu.Unlock()
	if !promised {
		return
	}
	other := ev
	other.Title = "another event " + ev.IdempotencyKey
	other.Recipients = dedupe(append(append([]string(nil), ev.Recipients...), extra))
	r := &reuse{extra: extra}
	_, err := c.Emit(ctx, other)
	var se *client.StatusError
	switch {
	case err == nil:
		r.status = http.StatusAccepted
	case errors.Is(err, client.ErrConflict):
		r.status = http.StatusUnprocessableEntity
	case errors.As(err, &se):
		r.status = se.StatusCode
	}
	l.mu.Lock()
	l.reuses[ev.IdempotencyKey] = r
	l.mu.Unlock()
}

func dedupe(users []string) []string {
	seen := map[string]bool{}
	out := users[:0]
	for _, u := range users {
		if !seen[u] {
			seen[u] = true
			out = append(out, u)
		}
	}
	return out
}

func emit(ctx context.Context, c *client.Client, ev client.Event, l *ledger) {
	_, err := c.Emit(ctx, ev)
	var se *client.StatusError
	switch {
	case err == nil:
		l.record(ev.IdempotencyKey, ev.Recipients, true, false)
	case errors.Is(err, client.ErrInvalidEvent) || errors.Is(err, client.ErrConflict) ||
		errors.As(err, &se) && se.StatusCode >= 400 && se.StatusCode < 500:
		l.record(ev.IdempotencyKey, ev.Recipients, false, true)
	default:
		if ctx.Err() == nil {
			l.mu.Lock()
			l.emitErrs[errKind(err)]++
			l.mu.Unlock()
		}
		l.record(ev.IdempotencyKey, ev.Recipients, false, false)
	}
}

func errKind(err error) string {
	s := err.Error()
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}

// halfClosed sends ev over a connection it half-closes after the request,
// as a producer that stops writing before it reads.
func halfClosed(ctx context.Context, base string, ev client.Event, l *ledger) {
	u, _ := url.Parse(base)
	body, _ := json.Marshal(ev)
	conn, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", u.Host)
	if err != nil {
		l.record(ev.IdempotencyKey, ev.Recipients, false, false)
		return
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(conn, "POST /v1/events HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", u.Host, len(body), body)
	_ = conn.(*net.TCPConn).CloseWrite()
	l.halfClose.Add(1)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		l.record(ev.IdempotencyKey, ev.Recipients, false, false)
		return
	}
	resp.Body.Close()
	l.answered(resp.StatusCode, resp.Header.Get("Retry-After"), u.Host)
	ok := resp.StatusCode/100 == 2
	l.record(ev.IdempotencyKey, ev.Recipients, ok, resp.StatusCode/100 == 4)
}
