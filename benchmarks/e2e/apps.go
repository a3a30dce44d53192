package main

// The apps: one user each, one Expo device registered, one stream open
// (even users a WebSocket, odd users server-sent events), read by a
// goroutine that notes when each notification frame arrived.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
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
	streams []stream
	readers sync.WaitGroup
	closing atomic.Bool
	// dropped counts streams that ended while the run went on.
	dropped atomic.Int64
}

// openApps registers each user's device and opens its stream on replica
// i mod len(bases), at most 64 at a time, each ready (its "ready" frame
// read) before it counts; then starts the readers.
func openApps(ctx context.Context, bases []string, issuer *devauth.Issuer, n int, l *ledger) (*apps, error) {
	a := &apps{streams: make([]stream, n)}
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
				if err := registerDevice(ctx, client, base, token, pushToken(i)); err != nil {
					errs <- fmt.Errorf("%s: %w", userName(i), err)
					return
				}
				s, err := dialReady(ctx, base, token, i%2 == 1)
				if err != nil {
					errs <- fmt.Errorf("%s's stream: %w", userName(i), err)
					return
				}
				a.streams[i] = s
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
		a.readers.Go(func() { a.read(s, i, l) })
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

// dialReady opens a stream and reads up to its "ready" frame.
func dialReady(ctx context.Context, base, token string, sse bool) (stream, error) {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var s stream
	if sse {
		c, err := sseclient.Dial(dctx, base, sseclient.Options{Token: token})
		if err != nil {
			return nil, err
		}
		s = c
	} else {
		c, err := wsclient.Dial(dctx, base, token, "")
		if err != nil {
			return nil, err
		}
		s = c
	}
	for {
		m, err := s.Next(30 * time.Second)
		if err != nil {
			s.Close()
			return nil, err
		}
		if m.Type == "ready" {
			return s, nil
		}
	}
}

// read notes every notification frame of user's stream until it closes.
func (a *apps) read(s stream, user int, l *ledger) {
	for {
		m, err := s.Next(time.Minute)
		at := time.Now()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if !a.closing.Load() {
				a.dropped.Add(1)
			}
			return
		}
		if m.Type != "notification" {
			continue
		}
		var it struct {
			Title     string    `json:"title"`
			CreatedAt time.Time `json:"created_at"`
		}
		if json.Unmarshal(m.Data, &it) != nil {
			continue
		}
		l.frame(it.Title, user, at, it.CreatedAt)
	}
}

// close closes every stream and waits for the readers.
func (a *apps) close() {
	a.closing.Store(true)
	for _, s := range a.streams {
		if s != nil {
			s.Close()
		}
	}
	a.readers.Wait()
}
