package main

// An app on the live stream and the API, as a user runs it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/wsclient"
	"github.com/spoolcast/spoolcast/live"
)

// app is one user's app: a socket it keeps open (reconnecting with its last
// cursor), and what it does through the API.
type app struct {
	user, token string
	bases       []string
	// handovers records the take-overs of users' phones.
	handovers *handovers
	// direct registers the user's APNs or FCM device ("": none).
	direct string

	mu sync.Mutex
	// frames counts the notification frames per id, over every socket.
	frames map[string]int
	// loaded are ids the app read from the feed after a cursor was refused.
	loaded map[string]bool
	// read is the app's view of each notification's read state, from its
	// frames (and feed reloads).
	read    map[string]bool
	created map[string]feed.ID
	// readFrameAt is when a read frame (or a read-all's) last marked each
	// notification read.
	readFrameAt map[string]time.Time
	cursor      string
	resumes     int
	refusals    int
	// refreshedReads counts the notifications a refresh after a resume
	// found read before any frame said so: read while the app was away, or
	// read just now, their frame on its way.
	refreshedReads int
	refreshes      sync.WaitGroup
	// disorder counts frames whose position came before the previous one
	// on the same socket.
	disorder int
	apiCalls map[string]int
	// sessions describes each socket the app opened, for the report of a
	// notification it never saw.
	sessions []string
}

func newApp(user, token string, bases []string, h *handovers) *app {
	return &app{user: user, token: token, bases: bases, handovers: h, frames: map[string]int{}, loaded: map[string]bool{},
		read: map[string]bool{}, created: map[string]feed.ID{}, apiCalls: map[string]int{}, readFrameAt: map[string]time.Time{}}
}

// stream keeps a socket open until ctx ends, on either replica.
func (a *app) stream(ctx context.Context, rng *rand.Rand) {
	defer a.refreshes.Wait()
	for ctx.Err() == nil {
		base := a.bases[rng.IntN(len(a.bases))]
		a.mu.Lock()
		cursor := a.cursor
		a.mu.Unlock()
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := wsclient.Dial(dctx, base, a.token, cursor)
		cancel()
		if err != nil {
			if strings.Contains(err.Error(), "HTTP 400") {
				a.mu.Lock()
				a.refusals++
				a.cursor = ""
				a.mu.Unlock()
			}
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		if cursor != "" {
			a.mu.Lock()
			a.resumes++
			a.mu.Unlock()
		}
		opened := time.Now()
		first, last, ready, n := a.readFrames(ctx, c, base, cursor != "")
		c.Close()
		a.mu.Lock()
		if len(a.sessions) < 200 {
			after, _ := live.ParseCursor(cursor)
			a.sessions = append(a.sessions, fmt.Sprintf("[%s %s after %d/%d ready %d/%d frames %d: %d/%d..%d/%d]", opened.Format("15:04:05.000"), base,
				after.Tx, after.ID, ready.Tx, ready.ID, n, first.Tx, first.ID, last.Tx, last.ID))
		}
		a.mu.Unlock()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (a *app) readFrames(ctx context.Context, c *wsclient.Conn, base string, resumed bool) (first, last, ready live.Position, frames int) {
	for ctx.Err() == nil {
		m, err := c.Next(time.Second)
		if err != nil {
			var ne net.Error
			if _, closed := wsclient.Closed(err); closed || !errors.As(err, &ne) || !ne.Timeout() {
				return first, last, ready, frames
			}
			continue
		}
		a.mu.Lock()
		switch m.Type {
		case "notification":
			var it struct {
				ID     string     `json:"id"`
				ReadAt *time.Time `json:"read_at"`
			}
			if json.Unmarshal(m.Data, &it) == nil {
				a.frames[it.ID]++
				a.read[it.ID] = it.ReadAt != nil
				if id, err := feed.ParseID(it.ID); err == nil {
					a.created[it.ID] = id
				}
			}
			if c, err := live.ParseCursor(m.Cursor); err == nil {
				if c.Position.Less(last) || c.Position == last {
					a.disorder++
				}
				last = c.Position
				if frames == 0 {
					first = c.Position
				}
				frames++
			}
		case "read":
			a.applyRead(m)
		case "ready":
			if c, err := live.ParseCursor(m.Cursor); err == nil {
				ready = c.Position
			}
		}
		// Started over without a cursor, as after a refused one: what
		// committed before ready is in the feed, read after it.
		fresh := m.Type == "ready" && a.cursor == "" && a.refusals > 0
		if m.Cursor != "" {
			a.cursor = m.Cursor
		}
		a.mu.Unlock()
		switch {
		case fresh:
			a.reload(ctx, base)
		case m.Type == "ready" && resumed:
			// Read frames are live only (docs/api.md): what was marked read
			// while the app was away is refreshed from the feed, beside the
			// frames, which the app goes on reading.
			a.refreshes.Go(func() { a.refreshRead(ctx, base) })
		}
	}
	return first, last, ready, frames
}

// applyRead applies a read frame: one notification, or a read-all through
// one in feed order, but for those it names unread.
func (a *app) applyRead(m wsclient.Message) {
	now := time.Now()
	if m.ID != "" {
		a.read[m.ID] = true
		a.readFrameAt[m.ID] = now
		return
	}
	through, err := feed.ParseID(m.Through)
	if err != nil {
		return
	}
	unread := map[string]bool{}
	for _, id := range m.Unread {
		unread[id] = true
	}
	for id, at := range a.created {
		if !unread[id] && !afterInFeed(at, through) {
			a.read[id] = true
			a.readFrameAt[id] = now
		}
	}
}

// afterInFeed: a comes before b in feed order (newer).
func afterInFeed(a, b feed.ID) bool {
	return a.CreatedAt.After(b.CreatedAt) || a.CreatedAt.Equal(b.CreatedAt) && a.Seq > b.Seq
}

// call makes one API request as the app's user, and again after
// Retry-After while it is answered 429 (the user's rate limit), as an app
// should.
func (a *app) call(ctx context.Context, method, u, body string) (int, []byte) {
	for {
		status, raw, retry := a.callOnce(ctx, method, u, body)
		if status != http.StatusTooManyRequests || ctx.Err() != nil {
			return status, raw
		}
		a.mu.Lock()
		a.apiCalls["429, waited Retry-After"]++
		a.mu.Unlock()
		sleep(ctx, retry)
	}
}

func (a *app) callOnce(ctx context.Context, method, u, body string) (int, []byte, time.Duration) {
	req, err := http.NewRequestWithContext(ctx, method, u, strings.NewReader(body))
	if err != nil {
		return 0, nil, 0
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, 0
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	retry := time.Second
	if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && n > 0 {
		retry = time.Duration(n) * time.Second
	}
	return resp.StatusCode, raw, retry
}

type feedPage struct {
	Data []struct {
		ID     string     `json:"id"`
		ReadAt *time.Time `json:"read_at"`
	} `json:"data"`
	NextCursor string `json:"next_cursor"`
}

// wholeFeed reads every page of the user's feed: id → read.
func (a *app) wholeFeed(ctx context.Context, base string) (map[string]bool, error) {
	out := map[string]bool{}
	cursor := ""
	for {
		u := base + "/v1/notifications?limit=100"
		if cursor != "" {
			u += "&cursor=" + url.QueryEscape(cursor)
		}
		status, raw := a.call(ctx, http.MethodGet, u, "")
		if status != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %d %s", u, status, raw)
		}
		var p feedPage
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		for _, it := range p.Data {
			out[it.ID] = it.ReadAt != nil
		}
		if p.NextCursor == "" {
			return out, nil
		}
		cursor = p.NextCursor
	}
}

// refreshRead is what an app does after it resumed: it reads its feed's
// read state for the notifications it holds. Read state only moves to read,
// so a live read frame that came meanwhile is kept.
func (a *app) refreshRead(ctx context.Context, base string) {
	f := a.feedUntilRead(ctx, base)
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, read := range f {
		if was, held := a.read[id]; held && read && !was {
			a.read[id] = true
			a.refreshedReads++
		}
	}
}

// reload is what an app does when its cursor is refused: it reads its feed.
func (a *app) reload(ctx context.Context, base string) {
	f := a.feedUntilRead(ctx, base)
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, read := range f {
		a.loaded[id] = true
		a.read[id] = read
		if fid, err := feed.ParseID(id); err == nil {
			a.created[id] = fid
		}
	}
}

// feedUntilRead reads the whole feed, again each second until it can (nil
// once ctx ends).
func (a *app) feedUntilRead(ctx context.Context, base string) map[string]bool {
	for ctx.Err() == nil {
		if f, err := a.wholeFeed(ctx, base); err == nil {
			return f
		}
		sleep(ctx, time.Second)
	}
	return nil
}

// act does what users do in the app, now and then, until ctx ends: read a
// page, mark one read, read all, register (again) a device, or take over
// another user's phone.
func (a *app) act(ctx context.Context, rng *rand.Rand, others []*app) {
	for ctx.Err() == nil {
		sleep(ctx, time.Duration(500+rng.IntN(2000))*time.Millisecond)
		base := a.bases[rng.IntN(len(a.bases))]
		var name string
		var status int
		switch r := rng.IntN(100); {
		case r < 40:
			name = "page"
			var raw []byte
			status, raw = a.call(ctx, http.MethodGet, base+"/v1/notifications?limit=20", "")
			var p feedPage
			if status == http.StatusOK && json.Unmarshal(raw, &p) == nil && len(p.Data) > 0 && rng.IntN(2) == 0 {
				name = "mark-read"
				status, _ = a.call(ctx, http.MethodPost, base+"/v1/notifications/"+p.Data[rng.IntN(len(p.Data))].ID+"/read", "")
			}
		case r < 50:
			name = "read-all"
			status, _ = a.call(ctx, http.MethodPost, base+"/v1/notifications/read-all", "")
		case r < 60:
			name = "unread-count"
			status, _ = a.call(ctx, http.MethodGet, base+"/v1/notifications/unread-count", "")
		case r < 90:
			name = "register-device"
			status, _ = a.call(ctx, http.MethodPut, base+"/v1/devices", fmt.Sprintf(`{"token":"ExponentPushToken[%s]","platform":"ios"}`, a.user))
			if status == http.StatusOK {
				a.handovers.regained(a.user, time.Now())
			}
			if a.direct != "" && status == http.StatusOK {
				status, _ = a.call(ctx, http.MethodPut, base+"/v1/devices", a.direct)
			}
		default:
			name = "take-over-device"
			other := others[rng.IntN(len(others))]
			if other != a && other.direct == "" { // one with an APNs or FCM device still has a device
				a.handovers.lost(other.user, time.Now())
			}
			status, _ = a.call(ctx, http.MethodPut, base+"/v1/devices", fmt.Sprintf(`{"token":"ExponentPushToken[%s]","platform":"android"}`, other.user))
		}
		a.mu.Lock()
		a.apiCalls[fmt.Sprintf("%s %d", name, status)]++
		a.mu.Unlock()
	}
}
