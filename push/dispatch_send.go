package push

// This file holds how a pass's dispatches reach Expo: the requests, what
// each came to, and what a stopping pass gives back to the queue.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/spoolcast/spoolcast/expo"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/chaosplant"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// outcome is what became of one dispatch.
type outcome struct {
	c      created
	state  string
	ticket string
	err    string
	gone   bool // Expo says DeviceNotRegistered
	unsent bool // ctx ended before its request reached Expo: given back
	later  bool // Expo did not take it, and another pass is retrying: given back for expoRetryPause
	// slower: Expo's ticket says MessageRateExceeded, too many to the
	// device: sent again once, expoRateExceededWait later.
	slower bool
}

// expoRetryPause is how long a push Expo did not take waits in the queue
// when another pass of this replica is already trying Expo again.
const expoRetryPause = 5 * time.Second

// expoRateExceededWait is how long a push whose ticket said
// MessageRateExceeded waits before its one more try: Expo asks for such
// messages to be retried slowly, with backoff.
const expoRateExceededWait = time.Minute

// send pushes the written dispatches: to Expo in requests of at most 100
// messages, in parallel (the client caps requests in flight), recording the
// tickets; to browsers by sendWeb. What a provider did not take (Expo: a 429,
// a 5xx, a request never written whole) is sent again with backoff, as the
// provider asks, while that can end by the time the pass's lease does (by),
// so that its outcome is recorded within it. One pass at a time tries Expo
// for that long (expoRetrier); another makes the client's few tries and
// gives back what Expo still did not take, due after expoRetryPause: an
// outage of Expo holds one worker, and the next passes' browsers go on.
// A request ctx ended before it reached Expo is given back to the queue; one
// Expo may have taken without answering is not retried: at most once.
func (d *Dispatcher) send(ctx context.Context, all []created, by time.Time) {
	var items, web []created
	for _, c := range all {
		if IsWebToken(c.token) {
			web = append(web, c)
		} else {
			items = append(items, c)
		}
	}
	if len(items) == 0 {
		d.sendWeb(ctx, web, by)
		return
	}
	sendCtx, retrier := ctx, false
	select {
	case d.expoRetrier <- struct{}{}:
		defer func() { <-d.expoRetrier }()
		sendCtx, retrier = expo.RetryFor(ctx, clock.Until(d.cfg.Clock, by)), true
	default:
	}
	outcomes := make([]outcome, len(items))
	var wg sync.WaitGroup
	for lo := 0; lo < len(items); lo += expo.MaxMessagesPerSend {
		hi := min(lo+expo.MaxMessagesPerSend, len(items))
		wg.Go(func() {
			msgs := make([]expo.Message, hi-lo)
			for i, c := range items[lo:hi] {
				msgs[i] = message(c)
			}
			tickets, err := d.cfg.Sender.Send(sendCtx, msgs)
			if chaosplant.Enabled && err == nil {
				for _, m := range msgs {
					if chaosplant.Plant(chaosplant.DoublePush) { // a planted defect (chaos self-check builds only)
						_, _ = d.cfg.Sender.Send(sendCtx, []expo.Message{m})
					}
				}
			}
			var re *expo.RequestError
			for i, c := range items[lo:hi] {
				o := outcome{c: c}
				switch {
				case errors.Is(err, expo.ErrNotSent):
					o.unsent = true
				case errors.As(err, &re) && re.Unknown:
					o.state, o.err = StateFailed, fmt.Sprintf("outcome unknown: %v; not retried, a retry could deliver twice", err)
					d.cfg.Metrics.sent.WithLabelValues(SentFailed).Inc()
				case errors.As(err, &re) && re.Retryable() && !retrier:
					o.later = true
				case errors.As(err, &re) && re.Retryable():
					o.state, o.err = StateFailed, fmt.Sprintf("%v; Expo took nothing, and was tried again while a try could end within the dispatch's lease", err)
					d.cfg.Metrics.sent.WithLabelValues(SentFailed).Inc()
				case err != nil:
					o.state, o.err = StateFailed, err.Error()
					d.cfg.Metrics.sent.WithLabelValues(SentFailed).Inc()
				case tickets[i].Status == "ok":
					o.state, o.ticket = StateSent, tickets[i].ID
					d.cfg.Metrics.sent.WithLabelValues(SentOK).Inc()
				default:
					o.state, o.err = StateFailed, strings.TrimSpace(tickets[i].Code()+": "+tickets[i].Message)
					o.gone = tickets[i].Code() == expo.DeviceNotRegistered
					o.slower = tickets[i].Code() == expo.MessageRateExceeded
					d.cfg.Metrics.sent.WithLabelValues(SentError).Inc()
				}
				outcomes[lo+i] = o
			}
		})
	}
	// The browsers' pushes are handed to their own sends while Expo answers.
	d.sendWeb(ctx, web, by)
	wg.Wait()
	bg := context.WithoutCancel(ctx)
	var answered []outcome
	var unsent, later []created
	for _, o := range outcomes {
		switch {
		case o.unsent:
			unsent = append(unsent, o.c)
		case o.later:
			later = append(later, o.c)
		case o.slower && d.deferOnce(bg, o.c, d.cfg.Clock.Now().Add(expoRateExceededWait), "Expo: "+o.err):
		default:
			answered = append(answered, o)
		}
	}
	// Even if the process is stopping: the tickets were sent, and what was
	// not is given back (after the tickets, so that whoever takes it again
	// sees which devices already have it).
	if err := d.persist(bg, func(ctx context.Context) error { return d.record(ctx, answered) }); err != nil {
		d.log.Error("record push tickets; the dispatches stay queued and end failed (interrupted)", "err", err)
	}
	if err := d.persist(bg, func(ctx context.Context) error { return d.release(ctx, unsent, time.Time{}) }); err != nil {
		d.log.Error("give back unsent dispatches; they stay queued and end failed (interrupted)", "err", err)
	}
	if err := d.persist(bg, func(ctx context.Context) error {
		return d.release(ctx, later, d.cfg.Clock.Now().Add(expoRetryPause))
	}); err != nil {
		d.log.Error("give back dispatches Expo did not take; they stay queued and end failed (interrupted)", "err", err)
	}
}

// persist runs write until it succeeds, for at most the lease: what it
// writes (tickets of pushes Expo took, dispatches to give back) exists only
// in this process, and a failover or a restart of Postgres takes seconds.
// Each try gets 10 s.
func (d *Dispatcher) persist(ctx context.Context, write func(context.Context) error) error {
	deadline := d.cfg.Clock.Now().Add(d.cfg.Lease)
	for failures := 1; ; failures++ {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := write(tctx)
		cancel()
		if err == nil {
			return nil
		}
		wait := startstop.Backoff(failures, 100*time.Millisecond, 5*time.Second)
		if d.cfg.Clock.Now().Add(wait).After(deadline) || !startstop.Sleep(ctx, d.cfg.Clock, wait) {
			return err
		}
		if failures == 1 {
			d.log.Warn("cannot write what became of pushes; trying again until Postgres answers", "err", err)
		}
	}
}

// release gives back to the queue the notifications of dispatches whose
// request never reached Expo, for any dispatcher to take at once: in one
// statement, it deletes those dispatches (nothing was sent for them; whoever
// takes the notification writes them again) and queues their notifications
// unclaimed. The queue rows keep claimed_by, which marks them retaken: the
// next dispatcher skips the devices the notification was already sent to.
func (d *Dispatcher) release(ctx context.Context, items []created, notBefore time.Time) error {
	if len(items) == 0 {
		return nil
	}
	var ids, nid []int64
	var ncreated, enqueued, due []time.Time
	var users, categories, priorities []string
	var seenWaited []bool
	var digestKeys []*string
	var digestWindows, digestCounts []*int64
	seen := map[int64]bool{}
	for _, c := range items {
		ids = append(ids, c.id)
		if !seen[c.n.id] {
			seen[c.n.id] = true
			nid, ncreated, enqueued = append(nid, c.n.id), append(ncreated, c.n.createdAt), append(enqueued, c.n.enqueuedAt)
			users, categories = append(users, c.n.user), append(categories, c.n.category)
			due, priorities, seenWaited = append(due, c.n.dueAt), append(priorities, c.n.priority), append(seenWaited, c.n.seenWaited)
			key, window, count := c.n.digestArgs()
			digestKeys, digestWindows, digestCounts = append(digestKeys, key), append(digestWindows, window), append(digestCounts, count)
		}
	}
	// The dispatches of one pass share created_at (see record). The queue
	// rows come back as they were: due when they were, with their digest.
	tag, err := d.cfg.DB.Exec(ctx, `WITH dropped AS (
			DELETE FROM push_dispatches WHERE id = ANY($1) AND created_at = $2 AND state = 'queued'
			RETURNING notification_id
		)
		INSERT INTO push_queue (notification_id, notification_created_at, enqueued_at, user_id, category, claimed_by,
		                        due_at, priority, digest_key, digest_window, digest_count, seen_waited, decided)
		SELECT n.id, n.created_at, n.enqueued_at, n.user_id, n.category, $3,
		       greatest(n.due_at, $15), n.priority, n.digest_key, make_interval(secs => n.digest_window), n.digest_count, n.seen_waited, true
		FROM unnest($4::int8[], $5::timestamptz[], $6::timestamptz[], $7::text[], $8::text[],
		            $9::timestamptz[], $10::text[], $11::text[], $12::int8[], $13::int8[], $14::bool[])
		     AS n(id, created_at, enqueued_at, user_id, category, due_at, priority, digest_key, digest_window, digest_count, seen_waited)
		WHERE n.id IN (SELECT notification_id FROM dropped)
		ON CONFLICT (notification_id) DO UPDATE SET `+retakeQueued,
		ids, items[0].createdAt, d.cfg.Replica, nid, ncreated, enqueued, users, categories,
		due, priorities, digestKeys, digestWindows, digestCounts, seenWaited, pgtype.Timestamptz{Time: notBefore, Valid: !notBefore.IsZero()})
	if err != nil {
		return err
	}
	d.cfg.Metrics.released.Add(float64(tag.RowsAffected()))
	return nil
}

// retakeQueued is what giving back a dispatch does to its notification's
// queue row when one is there already (another device's dispatch given back
// before): it takes the row from any pass holding it. That pass read the
// dispatch just deleted as done; its write now finds the row no longer its
// own and writes nothing for the notification, and the pass that takes it
// next sends to every device that has no dispatch, this one included.
const retakeQueued = `claimed_by = EXCLUDED.claimed_by, claimed_until = NULL, decided = true,
	due_at = least(push_queue.due_at, EXCLUDED.due_at)`

// digestArgs are the notification's digest columns as the queue stores
// them: all nil without a digest, the count nil for a member.
func (q *queued) digestArgs() (key *string, windowSeconds, count *int64) {
	if q.digestKey == "" {
		return nil, nil, nil
	}
	k, w, n := q.digestKey, int64(q.digestWindow.Seconds()), int64(q.digestCount)
	if n > 0 {
		count = &n
	}
	return &k, &w, count
}

// record writes what became of dispatches and disables the tokens Expo no
// longer knows, unless they were registered again since the send.
func (d *Dispatcher) record(ctx context.Context, outcomes []outcome) error {
	if len(outcomes) == 0 {
		return nil
	}
	var ids []int64
	var states, tickets, errs []string
	var gone []string
	var goneSince []time.Time
	for _, o := range outcomes {
		ids = append(ids, o.c.id)
		states, tickets, errs = append(states, o.state), append(tickets, o.ticket), append(errs, o.err)
		if o.gone {
			gone, goneSince = append(gone, o.c.token), append(goneSince, o.c.createdAt)
		}
	}
	// The dispatches of one pass were written by one statement, so they share
	// created_at: naming it keeps the update to one partition, where each row
	// is found by its primary key. (A plain state condition here would
	// tempt the planner into the state index, scanning the pass's rows once
	// per row: IS TRUE keeps it a filter.) Only queued dispatches change: one
	// the receipt pass ended failed (interrupted) meanwhile stays so.
	_, err := d.cfg.DB.Exec(ctx, `UPDATE push_dispatches d
		SET state = u.state, ticket_id = NULLIF(u.ticket, ''), error = NULLIF(u.error, ''),
		    sent_at = CASE WHEN u.state IN ('sent', 'delivered') THEN now() END, updated_at = now()
		FROM unnest($1::int8[], $2::text[], $3::text[], $4::text[]) AS u(id, state, ticket, error)
		WHERE d.id = u.id AND d.created_at = $5 AND (d.state = 'queued') IS TRUE`,
		ids, states, tickets, errs, outcomes[0].c.createdAt)
	if err != nil {
		return err
	}
	return d.cfg.Devices.disableUnreachable(ctx, gone, goneSince)
}

// message is the push for one dispatch: the title and body, shortened to fit
// Expo's 4 KiB (the feed keeps the whole text), and the notification's id.
func message(c created) expo.Message {
	m := expo.Message{
		To:       c.token,
		Title:    c.n.title,
		Body:     c.n.body,
		Sound:    "default",
		Priority: expoPriority(c.n),
		Data: map[string]any{
			"notification_id": feed.ID{CreatedAt: c.n.createdAt, Seq: c.n.id}.String(),
			"category":        c.n.category,
		},
	}
	if c.n.digestCount > 0 {
		// A digest's push names it, so that the app can show it as one.
		m.Data["digest"] = map[string]any{"key": c.n.digestKey, "count": c.n.digestCount}
	}
	for size, _ := expo.Size(m); size > expo.MaxMessageBytes; size, _ = expo.Size(m) {
		over := size - expo.MaxMessageBytes + len("…")
		switch {
		case len(m.Body) > 0:
			m.Body = shorten(m.Body, over)
		case len(m.Title) > 0:
			m.Title = shorten(m.Title, over)
		default:
			return m // nothing left to shorten: the client refuses it as too big
		}
	}
	return m
}

// shorten cuts at least n bytes off s, at a rune boundary, and marks the cut.
func shorten(s string, n int) string {
	cut := max(0, len(s)-n)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if cut == 0 {
		return ""
	}
	return s[:cut] + "…"
}

// expoPriority is Expo's priority for a notification: high for critical
// ones, Expo's default otherwise.
func expoPriority(q *queued) string {
	if q.critical() {
		return "high"
	}
	return ""
}
