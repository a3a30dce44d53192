package live

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/internal/startstop"
)

// Presence, for suppress-if-seen (push waits for a user with an open stream
// to see the notification). A replica records in Postgres which users hold
// a socket on it (stream_presence); the push dispatchers of every replica
// read it beside how far each user has seen the stream (stream_seen,
// seen.go).

// Presence timings: changes are written within presenceWrite; every row is
// refreshed each presenceRefresh and lives presenceTTL, so the rows of a
// replica killed expire on their own.
const (
	presenceWrite   = time.Second
	presenceRefresh = 20 * time.Second
	presenceTTL     = 60 * time.Second
	// presenceChunk bounds the users one statement writes.
	presenceChunk = 5000
)

// presence is the state of the presence writer.
type presence struct {
	mu       sync.Mutex
	appeared map[string]bool // users whose first socket opened since the last write
	left     map[string]bool // users whose last socket closed since the last write
	replica  string
}

func newPresence(replica string) *presence {
	if replica == "" {
		host, _ := os.Hostname()
		replica = fmt.Sprintf("%s-%d-%d", host, os.Getpid(), time.Now().UnixNano())
	}
	return &presence{appeared: map[string]bool{}, left: map[string]bool{}, replica: replica}
}

func (p *presence) opened(user string) {
	p.mu.Lock()
	p.appeared[user] = true
	delete(p.left, user)
	p.mu.Unlock()
}

func (p *presence) closed(user string) {
	p.mu.Lock()
	p.left[user] = true
	delete(p.appeared, user)
	p.mu.Unlock()
}

// take returns and clears what changed since the last write.
func (p *presence) take() (appeared, left []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for u := range p.appeared {
		appeared = append(appeared, u)
	}
	for u := range p.left {
		left = append(left, u)
	}
	p.appeared, p.left = map[string]bool{}, map[string]bool{}
	return appeared, left
}

// presenceLoop writes presence each presenceWrite, and refreshes every
// present user each presenceRefresh. On stop it deletes the
// replica's rows: its sockets are closing.
func (h *Hub) presenceLoop(ctx context.Context) {
	lastRefresh := time.Time{}
	startstop.Every(ctx, startstop.Schedule{Interval: presenceWrite, Clock: h.cfg.Clock}, func(ctx context.Context) bool {
		all := h.cfg.Clock.Now().Sub(lastRefresh) >= presenceRefresh
		if err := h.writePresence(ctx, all); err != nil {
			if ctx.Err() == nil {
				h.log.Warn("record stream presence; pushes are not held for seen meanwhile", "err", err)
			}
			return false
		}
		if all {
			lastRefresh = h.cfg.Clock.Now()
			if err := h.expirePresence(ctx); err != nil && ctx.Err() == nil {
				h.log.Warn("delete expired stream presence", "err", err)
			}
		}
		return false
	})
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var n int
	_ = h.cfg.DB.QueryRow(bg, `WITH d AS (DELETE FROM stream_presence WHERE replica = $1 RETURNING 1) SELECT count(*) FROM d`, h.presence.replica).Scan(&n)
}

// writePresence writes what changed: users that appeared (or, with all,
// every present user) get a fresh expiry, users that left are deleted.
// What fails to be written is taken again at the next write.
func (h *Hub) writePresence(ctx context.Context, all bool) error {
	appeared, left := h.presence.take()
	fail := func(err error) error {
		for _, u := range appeared {
			h.presence.opened(u)
		}
		return err
	}
	if all {
		h.mu.RLock()
		appeared = appeared[:0]
		for u := range h.users {
			appeared = append(appeared, u)
		}
		h.mu.RUnlock()
	}
	for lo := 0; lo < len(appeared); lo += presenceChunk {
		chunk := appeared[lo:min(lo+presenceChunk, len(appeared))]
		var n int
		if err := h.cfg.DB.QueryRow(ctx, `WITH u AS (
				INSERT INTO stream_presence (user_id, replica, expires_at)
				SELECT u, $2, now() + $3::interval FROM unnest($1::text[]) AS u
				ON CONFLICT (user_id, replica) DO UPDATE SET expires_at = EXCLUDED.expires_at
				RETURNING 1)
			SELECT count(*) FROM u`, chunk, h.presence.replica, presenceTTL).Scan(&n); err != nil {
			return fail(err)
		}
	}
	if len(left) > 0 {
		// A user who left but has a socket again (a reconnect) stays.
		h.mu.RLock()
		gone := left[:0]
		for _, u := range left {
			if len(h.users[u]) == 0 {
				gone = append(gone, u)
			}
		}
		h.mu.RUnlock()
		var n int
		if err := h.cfg.DB.QueryRow(ctx, `WITH d AS (
				DELETE FROM stream_presence WHERE replica = $2 AND user_id = ANY($1) RETURNING 1)
			SELECT count(*) FROM d`, gone, h.presence.replica).Scan(&n); err != nil {
			for _, u := range gone {
				h.presence.closed(u)
			}
			return fail(err)
		}
	}
	return nil
}

// expirePresence deletes the presence rows that expired (replicas killed,
// whose rows nobody refreshes). Seen positions are kept: they are the
// users' seen state (seen.go).
func (h *Hub) expirePresence(ctx context.Context) error {
	var n int
	return h.cfg.DB.QueryRow(ctx, `WITH p AS (DELETE FROM stream_presence WHERE expires_at < now() RETURNING 1)
		SELECT count(*) FROM p`).Scan(&n)
}
