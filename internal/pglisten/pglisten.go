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
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/internal/lograte"
)

// Listener is one LISTEN connection and its subscribers.
type Listener struct {
	url     string
	channel string
	log     *slog.Logger
	failLog *lograte.Limiter
	subs    []chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
	start   sync.Once
	mu      sync.Mutex
}

// New returns a listener on channel; Subscribe, then Start.
func New(url, channel string, log *slog.Logger) *Listener {
	return &Listener{url: url, channel: channel, log: log.With("component", "listen", "channel", channel),
		failLog: lograte.New(30 * time.Second), done: make(chan struct{})}
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
func (l *Listener) Start(ctx context.Context) {
	l.start.Do(func() {
		ctx, l.cancel = context.WithCancel(ctx)
		go l.run(ctx)
	})
}

// Stop stops listening and closes the connection, until ctx ends. Safe to
// call twice, and before Start.
func (l *Listener) Stop(ctx context.Context) error {
	l.start.Do(func() {})
	if l.cancel == nil {
		return nil
	}
	l.cancel()
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

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

func (l *Listener) run(ctx context.Context) {
	defer close(l.done)
	for failures := 0; ctx.Err() == nil; failures++ {
		err := l.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		l.failLog.Do(func(suppressed int64) {
			l.log.Warn("LISTEN connection lost; readers fall back to their intervals until it is back", "err", err, "suppressed", suppressed)
		})
		d := min(5*time.Second, 100*time.Millisecond<<min(failures, 6))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d/2 + rand.N(d/2+1)):
		}
	}
}

// listen holds one connection until it fails or ctx ends.
func (l *Listener) listen(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, l.url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		return err
	}
	l.wake() // hints sent while no one listened are lost: read now
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		l.wake()
	}
}
