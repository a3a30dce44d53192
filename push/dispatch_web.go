package push

// This file holds how dispatches to browsers' Web Push subscriptions are
// sent: beside the pass, so that a slow push service holds only its own
// sends, never the pass nor the other pushes.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/egress"
	"github.com/spoolcast/spoolcast/internal/startstop"
	"github.com/spoolcast/spoolcast/push/webpush"
)

// Defaults of the Web Push sends.
const (
	DefaultWebConcurrency = 32
	DefaultWebTTL         = 24 * time.Hour
	DefaultWebTimeout     = 10 * time.Second
)

// webUnreachableRetry is how long a push to a push service that could not
// be reached waits before its one more try.
const webUnreachableRetry = 30 * time.Second

// The backoff between the tries of a push a push service answered 5xx,
// without Retry-After: doubling from webRetryMin, at most webRetryMax.
const (
	webRetryMin = 500 * time.Millisecond
	webRetryMax = 30 * time.Second
)

var webOutcomes = func() []string {
	var out []string
	for o := webpush.Unknown; o <= webpush.Invalid; o++ {
		out = append(out, o.String())
	}
	return out
}()

// webPayload is what the service worker receives: what it shows, and the
// notification's id to open.
type webPayload struct {
	Title string         `json:"title"`
	Body  string         `json:"body"`
	Data  map[string]any `json:"data"`
}

// webMessage is the Web Push message for one dispatch: the title and body
// shortened to fit the encrypted record (the feed keeps the whole text);
// critical notifications are urgent, and a digest's pushes share a topic
// so that a newer one replaces an older one still undelivered.
func (d *Dispatcher) webMessage(c created) webpush.Message {
	p := webPayload{Title: c.n.title, Body: c.n.body, Data: map[string]any{
		"notification_id": feed.ID{CreatedAt: c.n.createdAt, Seq: c.n.id}.String(),
		"category":        c.n.category,
	}}
	m := webpush.Message{TTL: d.cfg.WebTTL, Urgency: webpush.UrgencyNormal}
	if c.n.critical() {
		m.Urgency = webpush.UrgencyHigh
	}
	if c.n.digestCount > 0 {
		p.Data["digest"] = map[string]any{"key": c.n.digestKey, "count": c.n.digestCount}
		m.Topic = webpush.TopicFor("digest:" + c.n.digestKey)
	}
	for {
		m.Payload, _ = json.Marshal(p)
		over := len(m.Payload) - webpush.MaxPayload
		if over <= 0 {
			return m
		}
		// A multi-byte rune may cost more once escaped: each cut is
		// checked again by the loop.
		switch {
		case p.Body != "":
			p.Body = channel.Shorten(p.Body, len(p.Body)-over)
		case p.Title != "":
			p.Title = channel.Shorten(p.Title, len(p.Title)-over)
		default:
			return m // nothing left to shorten: the sender refuses it
		}
	}
}

// sendWeb starts the sends of web dispatches without waiting: at most
// WebConcurrency requests run at once in this process and twice as many
// may be started or waiting. A push service origin may take three quarters
// of each, so that one that stalls leaves a quarter to the others; a user
// an eighth, since origins are chosen by users (a browser's endpoint names
// any https origin): one whose twenty subscriptions stall on origins they
// control holds no more of the sends than that. A dispatch past a bound is
// given back to the queue, due again after webBusyRetry: a slow push
// service holds neither the pass nor the phones. Each send records its own
// outcome.
func (d *Dispatcher) sendWeb(ctx context.Context, items []created, by time.Time) {
	if len(items) == 0 {
		return
	}
	bg := context.WithoutCancel(ctx)
	if d.cfg.WebPush == nil {
		outcomes := make([]outcome, len(items))
		for i, c := range items {
			outcomes[i] = outcome{c: c, state: StateFailed, err: "Web Push is not set up on this replica (--vapid-key-file)"}
		}
		if err := d.persist(bg, func(ctx context.Context) error { return d.record(ctx, outcomes) }); err != nil {
			d.log.Error("record web dispatches; they stay queued and end failed (interrupted)", "err", err)
		}
		return
	}
	tokens, users := make([]string, len(items)), make([]string, len(items))
	for i, c := range items {
		tokens[i], users[i] = c.token, c.n.user
	}
	var subs map[string]webpush.Subscription
	if err := d.persist(ctx, func(ctx context.Context) (err error) {
		subs, err = d.cfg.Devices.subscriptions(ctx, tokens, users)
		return err
	}); err != nil {
		d.log.Warn("read web subscriptions; giving their dispatches back", "err", err)
		d.giveBack(bg, items, time.Time{})
		return
	}
	var busy []created
	for i, c := range items {
		if ctx.Err() != nil {
			d.giveBack(bg, items[i:], time.Time{})
			break
		}
		sub := subs[c.token]
		origin, user := d.takeWebShares(pushOrigin(sub.Endpoint), c.n.user)
		if origin == nil {
			busy = append(busy, c)
			continue
		}
		d.webSends.Add(1)
		go func() {
			defer func() { d.leaveWebShares(origin, user); d.webSends.Done() }()
			d.sendOneWeb(ctx, c, sub, user.slots, origin.slots, by)
		}()
	}
	if len(busy) > 0 {
		d.cfg.Metrics.webBusy.Add(float64(len(busy)))
		d.giveBack(bg, busy, d.cfg.Clock.Now().Add(webBusyRetry))
	}
}

// webBusyRetry is how long a web dispatch given back because the Web Push
// sends were at a bound waits in the queue.
const webBusyRetry = time.Second

// pushOrigin is the origin (scheme and host) of a push endpoint; "" for none.
func pushOrigin(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || endpoint == "" {
		return ""
	}
	return u.Scheme + "://" + strings.ToLower(u.Host)
}

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
	if err := d.persist(ctx, func(ctx context.Context) error { return d.release(ctx, items, notBefore) }); err != nil {
		d.log.Error("give back unsent web dispatches; they stay queued and end failed (interrupted)", "err", err)
	}
}

// sendOneWeb sends one web dispatch when a slot of its user's, then of its
// origin's, then of the process's frees, and records it. A push service that
// answers 5xx did not take the message: it is sent again after Retry-After,
// or with backoff, while the try can end by the lease's end (by), and holds
// no slot meanwhile.
func (d *Dispatcher) sendOneWeb(ctx context.Context, c created, sub webpush.Subscription, userSlots, originSlots chan struct{}, by time.Time) {
	bg := context.WithoutCancel(ctx)
	o := outcome{c: c}
	var res webpush.Result
	tries := 0
	for {
		tries++
		var ok bool
		if res, ok = d.tryWeb(ctx, c, sub, userSlots, originSlots); !ok {
			d.giveBack(bg, []created{c}, time.Time{}) // stopping: another replica takes it at once
			return
		}
		if res.Outcome != webpush.Unavailable {
			break
		}
		wait := cmp.Or(res.RetryAfter, startstop.Backoff(tries, webRetryMin, webRetryMax))
		if d.cfg.Clock.Now().Add(wait + d.cfg.WebTimeout).After(by) {
			break
		}
		if !startstop.Sleep(ctx, d.cfg.Clock, wait) {
			d.giveBack(bg, []created{c}, time.Time{})
			return
		}
	}
	now := d.cfg.Clock.Now()
	switch res.Outcome {
	case webpush.Delivered:
		// The push service took it: for Web Push, that is delivery (there
		// is no receipt to wait for).
		o.state, o.ticket = StateDelivered, res.MessageID
	case webpush.NotSent:
		if errors.Is(res.Err, egress.ErrPrivate) {
			// Resolved to a private address since it was registered:
			// refused again at every try.
			o.state, o.err = StateFailed, fmt.Sprintf("push service refused: %v", res.Err)
			break
		}
		if ctx.Err() != nil {
			// Stopping: another replica takes it at once.
			d.giveBack(bg, []created{c}, time.Time{})
			return
		}
		// Unreachable (refused, DNS, TLS): once more after a pause, rather
		// than at every pass until --push-max-age.
		if d.deferOnce(bg, c, now.Add(webUnreachableRetry), fmt.Sprintf("push service unreachable (%v)", res.Err)) {
			return
		}
		o.state, o.err = StateFailed, fmt.Sprintf("push service unreachable again, or past --push-max-age: %v", res.Err)
	case webpush.Gone:
		o.state, o.err = StateFailed, fmt.Sprintf("subscription gone (%d): the browser unsubscribed or it expired", res.Status)
	case webpush.RateLimited:
		// Once more, after Retry-After.
		if d.deferOnce(bg, c, now.Add(res.RetryAfter), "push service rate limited (429)") {
			return
		}
		o.state, o.err = StateFailed, "push service rate limited (429) again, or past --push-max-age"
	case webpush.Unknown:
		o.state, o.err = StateFailed, fmt.Sprintf("outcome unknown: %v; not retried, a retry could deliver twice", res.Err)
	case webpush.Unavailable:
		why := fmt.Sprintf("push service failed (%d %s), %d tries", res.Status, res.Body, tries)
		if res.RetryAfter > 0 && d.deferOnce(bg, c, now.Add(res.RetryAfter), why+", asked to wait past the lease") {
			return
		}
		o.state, o.err = StateFailed, why+"; it took nothing, and was tried again until the dispatch's lease"
	default: // TooLarge, Rejected, Invalid
		o.state = StateFailed
		if res.Err != nil {
			o.err = res.Err.Error()
		} else {
			o.err = fmt.Sprintf("push service refused it (%d %s)", res.Status, res.Body)
		}
	}
	if err := d.persist(bg, func(ctx context.Context) error { return d.record(ctx, []outcome{o}) }); err != nil {
		d.log.Error("record a web push; it stays queued and ends failed (interrupted)", "err", err)
	}
	if res.Outcome == webpush.Gone {
		// After the record, so a disabled subscription's last push is
		// already in the delivery log; a crash in between leaves it
		// enabled, and its next push meets the 410 again.
		if err := d.persist(bg, func(ctx context.Context) error {
			return d.cfg.Devices.disableAsOf(ctx, []string{c.token}, []time.Time{c.createdAt}, DisabledGone)
		}); err != nil {
			d.log.Warn("disable a gone web subscription", "err", err)
		}
	}
}

// tryWeb makes one request for a web dispatch, holding a slot of its
// user's, of its origin's and of the process's while it runs; ok is false
// when ctx ended first.
func (d *Dispatcher) tryWeb(ctx context.Context, c created, sub webpush.Subscription, userSlots, originSlots chan struct{}) (res webpush.Result, ok bool) {
	for _, slots := range []chan struct{}{userSlots, originSlots, d.webSlots} {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		case <-ctx.Done():
			return res, false
		}
	}
	if sub.Endpoint == "" {
		res = webpush.Result{Outcome: webpush.Invalid, Err: fmt.Errorf("the subscription was removed, disabled or signed in as another user since the push was queued")}
	} else {
		sctx, cancel := context.WithTimeout(ctx, d.cfg.WebTimeout)
		start := time.Now()
		res = d.cfg.WebPush.Send(sctx, sub, d.webMessage(c))
		cancel()
		d.cfg.Metrics.webTook.Observe(time.Since(start).Seconds())
	}
	d.cfg.Metrics.webSent.WithLabelValues(res.Outcome.String()).Inc()
	return res, true
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
		                        due_at, priority, digest_key, digest_window, digest_count, seen_waited, decided)
		SELECT $4, $5, $6, $7, $8, $9, $10, $11, $12, make_interval(secs => $13), $14, $15, true
		WHERE EXISTS (SELECT 1 FROM deferred)
		ON CONFLICT (notification_id) DO UPDATE SET `+retakeQueued,
		c.id, c.createdAt, why, n.id, n.createdAt, n.enqueuedAt, n.user, n.category, d.cfg.Replica,
		at, n.priority, key, window, count, n.seenWaited)
	return err
}
