package push

// This file holds how the dispatches of a spread channel (channel.Spread:
// Web Push, whose browsers' push services are many, chosen by users) are
// sent: beside the pass, each holding a share of its destination's and of
// its user's, so that a slow push service holds only its own sends, never
// the pass nor the other pushes.

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/webpush"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// Defaults of the Web Push sends.
const (
	DefaultWebConcurrency = 32
	DefaultWebTTL         = 24 * time.Hour
	DefaultWebTimeout     = 10 * time.Second
)

var webOutcomes = func() []string {
	var out []string
	for o := webpush.Unknown; o <= webpush.Invalid; o++ {
		out = append(out, o.String())
	}
	return out
}()

// sendSpread starts the sends of a spread channel's dispatches (Web
// Push's) without waiting: at most WebConcurrency requests run at once in
// this process and twice as many may be started or waiting. A destination
// (a push service origin) may take three quarters of each, so that one
// that stalls leaves a quarter to the others; a user an eighth, since
// destinations are chosen by users (a browser's endpoint names any https
// origin): one whose twenty subscriptions stall on origins they control
// holds no more of the sends than that. A dispatch past a bound is given
// back to the queue, due again after webBusyRetry: a slow push service
// holds neither the pass nor the phones. Each send records its own
// outcome.
func (d *Dispatcher) sendSpread(ctx context.Context, ch channel.Spread, items []created, by time.Time) {
	bg := context.WithoutCancel(ctx)
	var busy []created
	for i, c := range items {
		if ctx.Err() != nil {
			d.giveBack(bg, items[i:], time.Time{})
			break
		}
		msg := channelMessage(c)
		origin, user := d.takeWebShares(ch.Destination(msg), c.n.user)
		if origin == nil {
			busy = append(busy, c)
			continue
		}
		d.webSends.Add(1)
		go func() {
			defer func() { d.leaveWebShares(origin, user); d.webSends.Done() }()
			d.sendOneSpread(ctx, ch, c, msg, user.slots, origin.slots, by)
		}()
	}
	if len(busy) > 0 {
		d.cfg.Metrics.webBusy.Add(float64(len(busy)))
		d.giveBack(bg, busy, d.cfg.Clock.Now().Add(webBusyRetry))
	}
}

// webBusyRetry is how long a dispatch given back because the spread sends
// were at a bound waits in the queue.
const webBusyRetry = time.Second

// takeWebShares counts one more send started or waiting for the origin, the
// user and the process, unless one of them is at its bound (nils then).
func (d *Dispatcher) takeWebShares(origin, user string) (*share, *share) {
	o := d.webOrigins.take(origin)
	if o == nil {
		return nil, nil
	}
	u := d.webUsers.take(user)
	if u == nil {
		d.webOrigins.leave(o)
		return nil, nil
	}
	select {
	case d.webWaiting <- struct{}{}:
		return o, u
	default:
		d.webUsers.leave(u)
		d.webOrigins.leave(o)
		return nil, nil
	}
}

func (d *Dispatcher) leaveWebShares(origin, user *share) {
	<-d.webWaiting
	d.webUsers.leave(user)
	d.webOrigins.leave(origin)
}

// giveBack returns dispatches that were never sent to the queue, due again
// at notBefore (zero: as they were).
func (d *Dispatcher) giveBack(ctx context.Context, items []created, notBefore time.Time) {
	if len(items) == 0 {
		return
	}
	if err := d.persist(ctx, func(ctx context.Context) error { return d.release(ctx, items, notBefore) }); err != nil {
		d.log.Error("give back unsent dispatches; they stay queued and end failed (interrupted)", "err", err)
	}
}

// sendOneSpread sends one dispatch of a spread channel when a slot of its
// user's, then of its destination's, then of the process's frees, and
// records it. Each send is its own retrier (judge): what the service did
// not take is sent again after its Retry-After, or with backoff, while the
// try can end by the lease's end (by), holding no slot meanwhile.
func (d *Dispatcher) sendOneSpread(ctx context.Context, ch channel.Spread, c created, msg channel.Message, userSlots, originSlots chan struct{}, by time.Time) {
	var s settled
	reserve := d.cfg.WebTimeout
	for tries := 1; ; tries++ {
		o, ok := d.trySpread(ctx, ch, msg, userSlots, originSlots)
		if !ok {
			s.unsent = append(s.unsent, c) // stopping: another replica takes it at once
			break
		}
		now := d.cfg.Clock.Now()
		d.refusals.observe(ch.Provider(), c.token, o, now)
		if !d.judge(&s, ch.Provider(), c, o, true, now, by, reserve).retry {
			break
		}
		wait := cmp.Or(o.Wait, startstop.Backoff(tries, channelRetryMin, channelRetryMax))
		if ctx.Err() != nil || now.Add(wait+reserve).After(by) || !startstop.Sleep(ctx, d.cfg.Clock, wait) {
			s.retryEnded(ctx, ch.Provider(), []created{c}, fmt.Sprintf("%s, %d tries", o.Reason, tries))
			break
		}
	}
	d.finish(context.WithoutCancel(ctx), ch.Provider(), &s)
}

// trySpread makes one request for a spread channel's message, holding a
// slot of its user's, of its destination's and of the process's while it
// runs; ok is false when ctx ended first.
func (d *Dispatcher) trySpread(ctx context.Context, ch channel.Channel, msg channel.Message, userSlots, originSlots chan struct{}) (o channel.Outcome, ok bool) {
	for _, slots := range []chan struct{}{userSlots, originSlots, d.webSlots} {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		case <-ctx.Done():
			return o, false
		}
	}
	start := time.Now()
	o = ch.Send(ctx, []channel.Message{msg})[0]
	d.cfg.Metrics.channelTook.WithLabelValues(ch.Provider()).Observe(time.Since(start).Seconds())
	return o, true
}

// deferOnce defers a dispatch its provider never took (so sending it again
// cannot deliver twice) to at, saying why, unless it was retaken already or
// at is past --push-max-age; it reports whether it did.
func (d *Dispatcher) deferOnce(ctx context.Context, c created, at time.Time, why string) bool {
	if c.n.retaken || !at.Before(c.n.since().Add(d.cfg.MaxAge)) {
		return false
	}
	why = fmt.Sprintf("%s; sending again at %s", why, at.UTC().Format(time.RFC3339))
	if err := d.persist(ctx, func(ctx context.Context) error { return d.requeueAt(ctx, c, at, why) }); err != nil {
		d.log.Error("defer a dispatch; it stays queued and ends failed (interrupted)", "err", err, "why", why)
	}
	return true
}

// requeueAt marks a queued dispatch deferred, with why, and queues its
// notification again, due at: the next dispatcher sends it to this device
// only (deferred dispatches do not count as sent; the others do).
func (d *Dispatcher) requeueAt(ctx context.Context, c created, at time.Time, why string) error {
	n := c.n
	key, window, count := n.digestArgs()
	_, err := d.cfg.DB.Exec(ctx, `WITH deferred AS (
			UPDATE push_dispatches SET state = 'deferred', error = $3, updated_at = now()
			WHERE id = $1 AND created_at = $2 AND state = 'queued'
			RETURNING notification_id
		)
		INSERT INTO push_queue (notification_id, notification_created_at, enqueued_at, user_id, category, claimed_by,
		                        due_at, priority, digest_key, digest_window, digest_count, seen_waited, decided, broadcast)
		SELECT $4, $5, $6, $7, $8, $9, $10, $11, $12, make_interval(secs => $13), $14, $15, true, $16
		WHERE EXISTS (SELECT 1 FROM deferred)
		ON CONFLICT (notification_id) DO UPDATE SET `+retakeQueued,
		c.id, c.createdAt, why, n.id, n.createdAt, n.enqueuedAt, n.user, n.category, d.cfg.Replica,
		at, n.priority, key, window, count, n.seenWaited, n.broadcast)
	return err
}
