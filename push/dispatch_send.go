package push

// This file holds how a pass's dispatches are handed to their providers,
// what each came to, and what a stopping pass gives back to the queue.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// outcome is what became of one dispatch.
type outcome struct {
	c      created
	state  string
	ticket string
	err    string
	gone   string // the provider says the device is gone: disabled as of the send, with this reason
	// goneSince, when set, is when the provider says the token became
	// invalid (APNs' 410 timestamp), if before the send: a device
	// registered again after it stays on.
	goneSince time.Time
}

// disabledAsOf is when a device the outcome says is gone must have been
// last registered for the answer to disable it.
func (o outcome) disabledAsOf() time.Time {
	if !o.goneSince.IsZero() && o.goneSince.Before(o.c.createdAt) {
		return o.goneSince
	}
	return o.c.createdAt
}

// send pushes the written dispatches, each provider's through its
// channel: the spread ones' (Web Push's) are started beside the pass
// (sendSpread), and the others' sent in batches while they answer
// (sendChannels).
func (d *Dispatcher) send(ctx context.Context, all []created, by time.Time) {
	byProvider := map[string][]created{}
	for _, c := range all {
		byProvider[c.provider] = append(byProvider[c.provider], c)
	}
	for provider, items := range byProvider {
		if ch, ok := d.channels[provider].(channel.Spread); ok {
			d.sendSpread(ctx, ch, items, by)
			delete(byProvider, provider)
		}
	}
	d.sendChannels(ctx, byProvider, by)
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
	var seenWaited, broadcast []bool
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
			broadcast = append(broadcast, c.n.broadcast)
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
		                        due_at, priority, digest_key, digest_window, digest_count, seen_waited, decided, broadcast)
		SELECT n.id, n.created_at, n.enqueued_at, n.user_id, n.category, $3,
		       greatest(n.due_at, $15), n.priority, n.digest_key, make_interval(secs => n.digest_window), n.digest_count, n.seen_waited, true, n.broadcast
		FROM unnest($4::int8[], $5::timestamptz[], $6::timestamptz[], $7::text[], $8::text[],
		            $9::timestamptz[], $10::text[], $11::text[], $12::int8[], $13::int8[], $14::bool[], $16::bool[])
		     AS n(id, created_at, enqueued_at, user_id, category, due_at, priority, digest_key, digest_window, digest_count, seen_waited, broadcast)
		WHERE n.id IN (SELECT notification_id FROM dropped)
		ON CONFLICT (notification_id) DO UPDATE SET `+retakeQueued,
		ids, items[0].createdAt, d.cfg.Replica, nid, ncreated, enqueued, users, categories,
		due, priorities, digestKeys, digestWindows, digestCounts, seenWaited, pgtype.Timestamptz{Time: notBefore, Valid: !notBefore.IsZero()}, broadcast)
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

// recordStatesSQL writes a pass's outcomes. The dispatches of one pass
// were written by one statement, so they share created_at: naming it
// keeps the update to one partition, where each row is found by its
// primary key. (A plain state condition here would tempt the planner into
// the state index, scanning the pass's rows once per row: IS TRUE keeps it
// a filter.) Only queued dispatches change: one the receipt pass ended
// failed (interrupted) meanwhile stays so.
const recordStatesSQL = `UPDATE push_dispatches d
		SET state = u.state, ticket_id = NULLIF(u.ticket, ''), error = NULLIF(u.error, ''),
		    sent_at = CASE WHEN u.state IN ('sent', 'delivered') THEN now() END, updated_at = now()
		FROM unnest($1::int8[], $2::text[], $3::text[], $4::text[]) AS u(id, state, ticket, error)
		WHERE d.id = u.id AND d.created_at = $5 AND (d.state = 'queued') IS TRUE`

// ClearLockClass is the first key of the per-user advisory lock that a read
// or archive (migration 26's push_clears trigger) and the record of a push
// sent take, hashtext of the user the second: whichever comes second sees
// the other committed, so a push sent as its notification is read gets
// its clear from one or the other.
const ClearLockClass = 0x636c7273 // "clrs"

// recordStates writes the outcomes. With clears on, the pushes sent are
// recorded under their users' clear locks, and a notification read or
// archived while its push was in flight (the read's trigger saw no push
// sent, so wrote no clear) gets its clear here, in a statement after the
// locks: the read committed before them, or waits for this record and
// then sees the push sent itself.
func (d *Dispatcher) recordStates(ctx context.Context, outcomes []outcome, ids []int64, states, tickets, errs []string) error {
	createdAt := outcomes[0].c.createdAt
	var users []string
	if d.cfg.ClearOnRead {
		for _, o := range outcomes {
			if o.state == StateSent || o.state == StateDelivered {
				users = append(users, o.c.n.user)
			}
		}
	}
	if len(users) == 0 {
		_, err := d.cfg.DB.Exec(ctx, recordStatesSQL, ids, states, tickets, errs, createdAt)
		return err
	}
	slices.Sort(users) // one order for every taker: no deadlock
	users = slices.Compact(users)
	return pgx.BeginFunc(ctx, d.cfg.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext(u)) FROM unnest($2::text[]) WITH ORDINALITY AS t(u, i) ORDER BY i`, ClearLockClass, users); err != nil {
			return fmt.Errorf("take the users' clear locks: %w", err)
		}
		// One statement, its snapshot taken after the locks: the record,
		// and the clears of the pushes it records sent whose notification
		// was read or archived meanwhile.
		_, err := tx.Exec(ctx, `WITH recorded AS (`+recordStatesSQL+`
			RETURNING d.notification_id, d.notification_created_at, d.token, d.user_id, d.state)
			INSERT INTO push_clears (notification_id, notification_created_at, token, user_id)
			SELECT r.notification_id, r.notification_created_at, r.token, r.user_id
			FROM recorded r
			JOIN notifications n ON n.id = r.notification_id AND n.created_at = r.notification_created_at
			CROSS JOIN LATERAL `+feed.MarksOf("n.user_id")+` m
			WHERE r.state IN ('sent', 'delivered') AND r.token IS NOT NULL AND `+feed.ReadOrArchived+`
			ON CONFLICT (notification_id, token) DO NOTHING`, ids, states, tickets, errs, createdAt)
		if err != nil {
			return fmt.Errorf("record pushes and clear those read meanwhile: %w", err)
		}
		return nil
	})
}

// record writes what became of dispatches and disables the tokens Expo no
// longer knows, unless they were registered again since the send.
func (d *Dispatcher) record(ctx context.Context, outcomes []outcome) error {
	if len(outcomes) == 0 {
		return nil
	}
	var ids []int64
	var states, tickets, errs []string
	gone, goneSince := map[string][]string{}, map[string][]time.Time{}
	for _, o := range outcomes {
		ids = append(ids, o.c.id)
		states, tickets, errs = append(states, o.state), append(tickets, o.ticket), append(errs, o.err)
		if o.gone != "" {
			gone[o.gone], goneSince[o.gone] = append(gone[o.gone], o.c.token), append(goneSince[o.gone], o.disabledAsOf())
		}
	}
	if err := d.recordStates(ctx, outcomes, ids, states, tickets, errs); err != nil {
		return err
	}
	for reason, tokens := range gone {
		if err := d.cfg.Devices.DisableAsOf(ctx, tokens, goneSince[reason], reason); err != nil {
			return err
		}
	}
	return nil
}
