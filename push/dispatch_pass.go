package push

// This file holds one dispatch pass: what it took from the queue, how it
// decides each notification's dispatches, and the statement that writes
// them.

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/preferences"
)

// queued is a notification taken from the push queue.
type queued struct {
	id         int64
	createdAt  time.Time
	enqueuedAt time.Time
	user       string
	category   string
	title      string
	body       string
	// dueAt is when the row became due: its enqueuing, or the end of the
	// quiet hours that deferred it.
	dueAt    time.Time
	priority string
	// digestKey and digestWindow: the notification's digest. A digest's own
	// push (digestCount > 0) gathers digestCount notifications.
	digestKey    string
	digestWindow time.Duration
	digestCount  int
	// seenWaited: the push was held once for its user to see it.
	seenWaited bool
	// decided: the delivery policies let the push through before it was
	// given back to the queue; they are not decided again.
	decided bool
	// retaken: the queue row had been claimed before, by a dispatcher whose
	// lease ran out or that gave it back, and may have dispatched it to
	// some of the devices already.
	retaken bool
	// claimedBy is the pass's claim token (claimToken), which its later
	// statements name.
	claimedBy string
	// broadcast: a topic fan-out's push, claimed after the direct ones.
	broadcast bool
}

func (q *queued) critical() bool { return q.priority == "critical" }

// digestMember reports whether the notification joins a digest rather than
// being pushed alone.
func (q *queued) digestMember() bool { return q.digestKey != "" && q.digestCount == 0 }

// since is when the push became due: what --push-max-age counts from.
func (q *queued) since() time.Time {
	if q.dueAt.After(q.createdAt) {
		return q.dueAt
	}
	return q.createdAt
}

// dispatchRow is a dispatch to write.
type dispatchRow struct {
	n     *queued
	token *string
	state string
	err   *string
}

// Pass takes up to BatchSize notifications from the queue and dispatches
// them: it records one row per device (or one skipped row), sends, and
// records the tickets. It returns how many notifications it took. A ctx that
// ends mid-pass gives back to the queue what was not sent.
func (d *Dispatcher) Pass(ctx context.Context) (int, error) { return d.pass(ctx, ctx) }

// pass is Pass with two contexts: stop ends the taking — a pass stopped
// before it has written its dispatches gives its notifications back — and
// sends is the context of everything after the claim: the lookups, the
// writes and the requests to Expo.
func (d *Dispatcher) pass(stop, sends context.Context) (n int, err error) {
	d.releaseOrphans(stop)
	token, ended := d.claimToken()
	defer ended()
	leased := d.cfg.Clock.Now() // the rows' lease runs from about here
	claimed, err := d.claim(stop, token)
	if err != nil && !pgconn.SafeToRetry(err) {
		// The claim may have committed though its answer was lost: give
		// back what this pass may hold, or its rows wait out the lease.
		if perr := d.persist(stop, func(ctx context.Context) error { return d.unclaimAll(ctx, token) }); perr != nil {
			d.log.Warn("give back the push queue's rows of a failed claim; they are taken again after the lease", "err", perr)
		}
	}
	if err != nil || len(claimed) == 0 {
		return 0, err
	}
	ctx := sends // from here on, a stop lets the pass finish
	written := false
	defer func() {
		// A pass stopped or failed before writing its dispatches gives its
		// rows back at once, rather than leave them leased for the lease's
		// length.
		if !written && err != nil && len(claimed) > 0 {
			// Written again until Postgres answers: a pass that failed
			// because Postgres went away (a failover) would otherwise leave
			// its rows leased, and their pushes late, for the lease's length.
			if uerr := d.persist(context.WithoutCancel(ctx), func(ctx context.Context) error { return d.unclaim(ctx, claimed) }); uerr != nil {
				d.log.Warn("give back the push queue's rows; they are taken again after the lease", "err", uerr)
			}
		}
	}()
	users := make([]string, 0, len(claimed))
	seen := map[string]bool{}
	for _, q := range claimed {
		if !seen[q.user] {
			seen[q.user] = true
			users = append(users, q.user)
		}
	}
	tokens, enabled, err := d.cfg.Devices.EnabledTokens(ctx, users)
	if err != nil {
		return len(claimed), err
	}
	// Preferences are asked only for users with a device: a broadcast to a
	// million topic members, most without one, would otherwise be a
	// million lookups (with --prefs-url, requests to your service) for
	// pushes that go nowhere.
	reachable := make([]string, 0, len(users))
	for _, u := range users {
		if len(tokens[u]) > 0 {
			reachable = append(reachable, u)
		}
	}
	off := map[string]map[string]bool{}
	if len(reachable) > 0 {
		off = d.cfg.Preferences.PushOff(ctx, reachable)
	}
	done, err := d.dispatched(ctx, claimed)
	if err != nil {
		return len(claimed), err
	}
	if stop.Err() != nil {
		// Stopping, and nothing written yet: another replica may take them
		// now (given back above).
		return 0, stop.Err()
	}
	now := d.cfg.Clock.Now()
	quiet, qerr := preferences.QuietHours(ctx, d.cfg.DB, users)
	if qerr != nil {
		d.failLog.Do(func(suppressed int64) {
			d.log.Warn("quiet hours unreadable; pushing (fail open)", "err", qerr, "suppressed", suppressed)
		})
	}
	seenNow := d.seenState(ctx, claimed, users, now)
	var p plan
	var invalid []string
	oldest := now.Add(-d.cfg.MaxAge)
	for i := range claimed {
		q := &claimed[i]
		// A notification dispatched before, in part (see dispatched), goes
		// only to the devices it has not been dispatched to.
		before, dispatchedBefore := done[q.id]
		var skipped string
		var sends []dispatchRow
		switch {
		case q.since().Before(oldest):
			skipped = fmt.Sprintf("expired: due more than %s ago (--push-max-age)", d.cfg.MaxAge)
		case off[q.user][q.category]:
			skipped = fmt.Sprintf("push is off for category %q", q.category)
		default:
			for _, t := range tokens[q.user] {
				switch {
				case !d.validToken(t, enabled[t].Provider):
					invalid = append(invalid, t)
				case !before[t]:
					sends = append(sends, dispatchRow{n: q, token: &t, state: StateQueued})
				}
			}
			if len(sends) == 0 {
				skipped = "no enabled device"
			}
		}
		switch {
		case skipped != "":
			if !dispatchedBefore { // no skipped row beside earlier dispatches
				p.rows = append(p.rows, dispatchRow{n: q, state: StateSkipped, err: &skipped})
			}
		case q.decided && !q.critical() && p.deferInQuiet(q, quiet[q.user], now):
			// Decided, then given back (a stop, a 429's Retry-After, a busy
			// push service), and come again in quiet hours that began
			// meanwhile: held until they end, still decided.
		case dispatchedBefore || q.decided:
			// Its policies were decided when it was first dispatched.
			p.rows = append(p.rows, sends...)
		default:
			p.decide(q, sends, quiet[q.user], now, qerr != nil, d.cfg.Throttle, seenNow)
		}
	}
	if err := d.cfg.Devices.DisableTokens(ctx, invalid, devices.DisabledInvalid); err != nil {
		d.log.Warn("disable invalid tokens", "err", err)
	}
	created, err := d.write(ctx, claimed, &p, now)
	if err != nil {
		// The write may have committed though its answer was lost (Postgres
		// went away during the commit, which a synchronous standby kept):
		// then its dispatches are queued and no one else will send them.
		var committed bool
		if perr := d.persist(ctx, func(ctx context.Context) (err error) {
			created, committed, err = d.written(ctx, claimed)
			return err
		}); perr != nil || !committed {
			return len(claimed), err
		}
		d.log.Warn("the dispatches' write had committed though its answer was lost; sending them", "err", err)
	} else {
		p.count(d.cfg.Metrics)
	}
	written = true
	for i := range created {
		dev := enabled[created[i].token]
		created[i].provider, created[i].address = dev.Provider, dev.Address
	}
	d.send(ctx, created, leased.Add(d.cfg.Lease))
	return len(claimed), nil
}

// written tells whether a write of claimed's dispatches (create) committed,
// and if so returns its queued dispatches. The write deletes the claimed
// queue rows in the same statement: either all are gone or none is. Its
// dispatches are read from those still queued and written within the lease.
func (d *Dispatcher) written(ctx context.Context, claimed []queued) ([]created, bool, error) {
	ids := make([]int64, len(claimed))
	byKey := map[string]*queued{}
	for i := range claimed {
		ids[i] = claimed[i].id
		byKey[fmt.Sprint(claimed[i].id)] = &claimed[i]
	}
	var left int
	if err := d.cfg.DB.QueryRow(ctx, `SELECT count(*) FROM push_queue WHERE notification_id = ANY($1) AND claimed_by = $2`, ids, claimed[0].claimedBy).Scan(&left); err != nil {
		return nil, false, err
	}
	if left > 0 {
		return nil, false, nil
	}
	rows, err := d.cfg.DB.Query(ctx, `SELECT id, created_at, notification_id, coalesce(token, ''), state FROM push_dispatches
		WHERE state = 'queued' AND created_at > now() - $2::interval AND notification_id = ANY($1)`, ids, 2*d.cfg.Lease)
	if err != nil {
		return nil, false, err
	}
	out, err := collectCreated(rows, byKey)
	return out, err == nil, err
}

// created is a queued dispatch, written.
type created struct {
	id        int64
	createdAt time.Time
	n         *queued
	token     string
	provider  string // the device's, as the pass read it
	address   string // the device's, for a provider whose token is not one (channel.Message.Address)
}

// create writes the dispatch rows and takes the notifications out of the
// queue, in one statement: only those still leased to this dispatcher (a
// pass that outlived its lease writes nothing for rows another has taken).
func create(ctx context.Context, tx pgx.Tx, claimed []queued, rows []dispatchRow) ([]created, error) {
	ids := make([]int64, len(claimed))
	for i, q := range claimed {
		ids[i] = q.id
	}
	var nid []int64
	var ncreated []time.Time
	var users []string
	var tokens, errs []*string
	var states []string
	for _, r := range rows {
		nid, ncreated, users = append(nid, r.n.id), append(ncreated, r.n.createdAt), append(users, r.n.user)
		tokens, states, errs = append(tokens, r.token), append(states, r.state), append(errs, r.err)
	}
	byKey := map[string]*queued{}
	for i := range claimed {
		byKey[fmt.Sprint(claimed[i].id)] = &claimed[i]
	}
	res, err := tx.Query(ctx, `WITH released AS (
			DELETE FROM push_queue WHERE notification_id = ANY($1) AND claimed_by = $2
			RETURNING notification_id
		)
		INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, token, state, error)
		SELECT r.nid, r.ncreated, r.user_id, r.token, r.state, r.error
		FROM unnest($3::int8[], $4::timestamptz[], $5::text[], $6::text[], $7::text[], $8::text[])
		     AS r(nid, ncreated, user_id, token, state, error)
		WHERE r.nid IN (SELECT notification_id FROM released)
		RETURNING id, created_at, notification_id, coalesce(token, ''), state`,
		ids, claimed[0].claimedBy, nid, ncreated, users, tokens, states, errs)
	if err != nil {
		return nil, err
	}
	return collectCreated(res, byKey)
}

func collectCreated(rows pgx.Rows, byKey map[string]*queued) ([]created, error) {
	defer rows.Close()
	var out []created
	for rows.Next() {
		var c created
		var nid int64
		var state string
		if err := rows.Scan(&c.id, &c.createdAt, &nid, &c.token, &state); err != nil {
			return nil, err
		}
		if state != StateQueued {
			continue
		}
		c.n = byKey[fmt.Sprint(nid)]
		out = append(out, c)
	}
	return out, rows.Err()
}
