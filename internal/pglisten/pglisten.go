// Package pglisten keeps one connection LISTENing on a Postgres channel and
// tells subscribers when a notification arrives. A NOTIFY is only a hint to
// read now: the connection is re-made after it is lost, and every subscriber
// is woken once it is back, since hints sent meanwhile were lost.
//
// LISTEN holds session state, so the URL must reach Postgres directly, not
// through PgBouncer in transaction mode.
package pglisten

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// Listener is one LISTEN connection and its subscribers.
type Listener struct {
	url     string
	channel string
	log     *slog.Logger
	failLog *lograte.Limiter
	clock   clock.Clock
	// checkEvery is how long a wait for a notification lasts before the
	// listener checks that its server still takes writes.
	checkEvery time.Duration
	subs       []chan struct{}
	svc        startstop.Service
	mu         sync.Mutex
}

// New returns a listener on channel whose reconnections wait on clk (nil:
// the wall clock); Subscribe, then Start.
func New(url, channel string, clk clock.Clock, log *slog.Logger) *Listener {
	return &Listener{url: url, channel: channel, clock: clock.Or(clk), checkEvery: 10 * time.Second, log: log.With("component", "listen", "channel", channel),
		failLog: lograte.New(30 * time.Second)}
}

// Subscribe returns a channel that receives after notifications: one value
// may stand for many. Call it before Start.
func (l *Listener) Subscribe() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch := make(chan struct{}, 1)
	l.subs = append(l.subs, ch)
	return ch
}

// Start listens in the background; only the first call does.
func (l *Listener) Start(ctx context.Context) { l.svc.Start(ctx, l.run) }

// Stop stops listening and closes the connection, until ctx ends. Safe to
// call twice, and before Start.
func (l *Listener) Stop(ctx context.Context) error { return l.svc.Stop(ctx) }

func (l *Listener) wake() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ch := range l.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// run keeps a connection listening. The backoff counts failures since the
// last connection that listened: a drop after hours of service waits the
// minimum again, not the cap reached by the failures of an earlier outage.
func (l *Listener) run(ctx context.Context) {
	for failures := 0; ctx.Err() == nil; {
		listened, err := l.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		if listened {
			failures = 0
		}
		failures++
		l.failLog.Do(func(suppressed int64) {
			l.log.Warn("LISTEN connection lost; readers fall back to their intervals until it is back", "err", err, "suppressed", suppressed)
		})
		if !startstop.Sleep(ctx, l.clock, startstop.Backoff(failures, 100*time.Millisecond, 5*time.Second)) {
			return
		}
	}
}

// listen holds one connection until it fails or ctx ends; listened reports
// whether its LISTEN succeeded.
func (l *Listener) listen(ctx context.Context) (listened bool, err error) {
	conn, err := pgx.Connect(ctx, l.url)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		return false, err
	}
	l.wake() // hints sent while no one listened are lost: read now
	for {
		// Wait a while at most, then ask whether the server still takes
		// writes: a primary fenced read-only in a failover keeps this
		// connection open, but the hints now come from the promoted one.
		wctx, cancel := context.WithTimeout(ctx, l.checkEvery)
		_, err := conn.WaitForNotification(wctx)
		timedOut := wctx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case timedOut:
			var readOnly bool
			if err := conn.QueryRow(ctx, pgpool.ReadOnlySQL).Scan(&readOnly); err != nil {
				return true, err
			}
			if readOnly {
				return true, errReadOnly
			}
		case err != nil:
			return true, err
		default:
			l.wake()
		}
	}
}

// errReadOnly: the server listened to no longer takes writes (a standby, or
// a primary fenced during a failover); the listener connects again, to the
// primary its URL leads to.
var errReadOnly = errors.New("the server turned read-only (a failover): listening on the primary again")
