package main

// The apps: one user each, one Expo device registered, one stream open
// (even users a WebSocket, odd users server-sent events), read by a
// goroutine that notes when each notification frame arrived. When a
// replica is killed (-wave), its apps reconnect as the SDK does: after a
// full-jitter backoff (uniform below 500 ms·2^attempt, at most 20 s), to
// a replica still up, resuming after the last cursor they read.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolcast/spoolcast/internal/devauth"
	"github.com/spoolcast/spoolcast/internal/sseclient"
	"github.com/spoolcast/spoolcast/internal/wsclient"
)

func userName(i int) string { return fmt.Sprintf("user-%05d", i) }

// stream is either transport of the live stream.
type stream interface {
	Next(d time.Duration) (wsclient.Message, error)
	Close() error
}

// apps are the open streams and their readers.
type apps struct {
	ctx     context.Context
	bases   []string
	tokens  []string
	mu      sync.Mutex // guards streams and moves once the readers run
	streams []stream
	// readyCursors are the cursors of the streams' "ready" frames: where
	// each resumes before any frame came.
	readyCursors []string
	moves        []move
	readers      sync.WaitGroup
	closing      atomic.Bool
	// dropped counts streams that ended while the run went on and did not
	// come back.
	dropped atomic.Int64
	// down is the index of the replica killed on purpose, -1 while none is:
	// a stream that ends then moves to another replica instead of counting
	// as dropped.
	down atomic.Int32
}

// move is one app's reconnection after its replica was killed.
type move struct {
	lost, ready time.Time
	attempts    int
	cursor      string // resumed after
}

// The SDK's reconnect backoff (client.ts): full jitter, 500 ms doubling,
// at most 20 s.
const (
	backoffMin = 500 * time.Millisecond
	backoffMax = 20 * time.Second
)

// openApps registers each user's device and opens its stream on replica
// i mod len(bases), at most 64 at a time, each ready (its "ready" frame
// read) before it counts; then starts the readers.
func openApps(ctx context.Context, bases []string, issuer *devauth.Issuer, n int, l *ledger) (*apps, error) {
	a := &apps{ctx: ctx, bases: bases, tokens: make([]string, n), streams: make([]stream, n), readyCursors: make([]string, n), moves: make([]move, n)}
	a.down.Store(-1)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	next := atomic.Int64{}
	errs := make(chan error, 64)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				base := bases[i%len(bases)]
				token, err := issuer.Mint(userName(i), nil, 24*time.Hour)
				if err != nil {
					errs <- err
					return
				}
				a.tokens[i] = token
				if err := registerDevice(ctx, client, base, token, pushToken(i)); err != nil {
					errs <- fmt.Errorf("%s: %w", userName(i), err)
					return
				}
				s, ready, err := dialReady(ctx, base, token, i%2 == 1, "", nil)
				if err != nil {
					errs <- fmt.Errorf("%s's stream: %w", userName(i), err)
					return
				}
				a.streams[i], a.readyCursors[i] = s, ready
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		a.close()
		return nil, err
	}
	for i, s := range a.streams {
		a.readers.Go(func() { a.read(s, i, a.readyCursors[i], l) })
	}
	return a, nil
}

func registerDevice(ctx context.Context, client *http.Client, base, token, device string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, base+"/v1/devices", strings.NewReader(fmt.Sprintf(`{"token":%q,"platform":"ios"}`, device)))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("PUT /v1/devices: %d", resp.StatusCode)
	}
	return nil
}

// dialReady opens a stream, after cursor when one is given, and reads up
// to its "ready" frame, whose cursor it returns; the frames a resume
// replays before it go to replayed.
func dialReady(ctx context.Context, base, token string, sse bool, cursor string, replayed func(wsclient.Message, time.Time)) (stream, string, error) {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var s stream
	if sse {
		o := sseclient.Options{Token: token}
		if cursor != "" {
			o.Header = http.Header{"Last-Event-Id": {cursor}}
		}
		c, err := sseclient.Dial(dctx, base, o)
		if err != nil {
			return nil, "", err
		}
		s = c
	} else {
		c, err := wsclient.Dial(dctx, base, token, cursor)
		if err != nil {
			return nil, "", err
		}
		s = c
	}
	for {
		m, err := s.Next(30 * time.Second)
		if err != nil {
			s.Close()
			return nil, "", err
		}
		if m.Type == "ready" {
			return s, m.Cursor, nil
		}
		if replayed != nil {
			replayed(m, time.Now())
		}
	}
}

// read notes every notification frame of user's stream until it closes,
// moving it to another replica if its own was killed.
func (a *apps) read(s stream, user int, cursor string, l *ledger) {
	note := func(m wsclient.Message, at time.Time) {
		if m.Cursor != "" {
			cursor = m.Cursor
		}
		if m.Type != "notification" {
			return
		}
		var it struct {
			Title     string    `json:"title"`
			CreatedAt time.Time `json:"created_at"`
		}
		if json.Unmarshal(m.Data, &it) == nil {
			l.frame(it.Title, user, at, it.CreatedAt)
		}
	}
	for {
		m, err := s.Next(time.Minute)
		at := time.Now()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if a.closing.Load() {
				return
			}
			if s, cursor = a.moveAway(user, cursor, note); s == nil {
				a.dropped.Add(1)
				return
			}
			continue
		}
		note(m, at)
	}
}

// moveAway reconnects user's stream to a replica still up, after the
// SDK's backoff, resuming after cursor, and returns it with the cursor it
// is at; nil when its replica was not killed on purpose, or the run is
// over.
func (a *apps) moveAway(user int, cursor string, replayed func(wsclient.Message, time.Time)) (stream, string) {
	down := int(a.down.Load())
	if down < 0 || len(a.bases) < 2 {
		return nil, ""
	}
	mv := move{lost: time.Now(), cursor: cursor}
	var up []string
	for i, b := range a.bases {
		if i != down {
			up = append(up, b)
		}
	}
	for ; a.ctx.Err() == nil && !a.closing.Load(); mv.attempts++ {
		wait := min(backoffMax, backoffMin<<min(mv.attempts, 10))
		time.Sleep(time.Duration(rand.Int64N(int64(wait))))
		s, ready, err := dialReady(a.ctx, up[user%len(up)], a.tokens[user], user%2 == 1, cursor, replayed)
		if err != nil {
			continue
		}
		mv.ready, mv.attempts = time.Now(), mv.attempts+1
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.closing.Load() {
			s.Close()
			return nil, ""
		}
		a.streams[user], a.moves[user] = s, mv
		return s, ready
	}
	return nil, ""
}

// moved returns each app's move (zero for the apps that did not move).
func (a *apps) moved() []move {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.moves)
}

// close closes every stream and waits for the readers.
func (a *apps) close() {
	a.mu.Lock()
	a.closing.Store(true)
	for _, s := range a.streams {
		if s != nil {
			s.Close()
		}
	}
	a.mu.Unlock()
	a.readers.Wait()
}
