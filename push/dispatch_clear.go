package push

// This file holds the clears: a notification read or archived on one device
// takes its banner off the user's other devices that got its push, by a
// silent message naming it. Migration 20's trigger writes one push_clears
// row per notification and device in the transaction of the change; a pass
// here claims due rows (queued → sending, in the claiming statement), sends
// one message per device with up to clearMaxIDs ids, and records what each
// came to. A row is never sent twice: one left sending by a replica killed
// mid-send ends failed, as a push Expo may have taken does.

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// Limits of the clears.
const (
	// clearMaxIDs is the most notifications one clear names; more go in the
	// device's next one, a second later.
	clearMaxIDs = 100
	// clearInterval is how often due clears are sent: the reads of a second
	// go to a device in one message, and a device gets at most one a second
	// (push_clear_devices keeps that across replicas).
	clearInterval = time.Second
	// clearBatch is the most devices one pass sends to.
	clearBatch = 500
	// clearRetry is how long a clear its provider did not take (a 429, a
	// 5xx, a request that never reached it) waits before its next try.
	clearRetry = 5 * time.Second
	// clearCredentialsRetry is how long a clear waits when its provider
	// refused this deployment's credentials: until an operator acts, each
	// try is refused again.
	clearCredentialsRetry = time.Minute
	// clearKeep is how long a clear's row is kept: past the 3 days of pushes
	// a read clears (migration 20), so that a notification read again
	// never clears twice.
	clearKeep = 4 * 24 * time.Hour
	// clearSweepInterval is how often expired, interrupted and old clears
	// are swept.
	clearSweepInterval = 15 * time.Second
)

// ClearTTL is how long a push service keeps a clear for a browser that is
// offline: a clear for a banner long gone is pointless.
const ClearTTL = time.Hour

// browserClearSkipped is why a browser gets no clear. A push whose service
// worker shows nothing is a silent push: Chrome pays for it from the
// site's budget and past it shows "This site has been updated in the
// background", Safari ends the subscription after a few, Firefox counts
// it against a quota; and central cannot know whether the banner a clear
// would take down is still shown. The inbox page closes the banners of
// what was read while it is open.
const browserClearSkipped = "a browser gets no clear: a push that shows nothing costs the site (Chrome's budget, Safari's and Firefox's limits); an open inbox page closes the banner"

// Results of a clear, the values of spoolcast_push_clears_total's result label.
const (
	ClearSent    = "sent"    // the provider took it (Expo: a ticket; Web Push: 201)
	ClearFailed  = "failed"  // refused, the device gone, or the outcome unknown: never sent again
	ClearRetried = "retried" // the provider took nothing (429, 5xx, no connection): sent again later
	ClearSkipped = "skipped" // --push-clear-on-read off, past --push-max-age, the device disabled, its provider not set up, or a browser (browserClearSkipped)
)

// Providers, the values of spoolcast_push_clears_total's provider label.
const (
	ProviderExpo    = devices.ProviderExpo
	ProviderWebPush = devices.ProviderWebPush
)

// clearDevice is one device's claimed clears, sent as one message.
type clearDevice struct {
	token    string
	provider string
	user     string
	ids      []int64
	public   []string
	enabled  bool   // still enabled, and the user's
	address  string // channel.Message.Address
	claimed  time.Time
}

// clearOutcome is what became of one device's clear.
type clearOutcome struct {
	dev    *clearDevice
	state  string // StateSent, StateFailed, StateSkipped, or StateQueued: given back, due at due
	ticket string
	err    string
	due    time.Time
	gone   bool
	// goneSince is when the provider says the token became invalid
	// (APNs' 410 timestamp); zero when it does not say.
	goneSince time.Time
	invalid   bool // the provider refuses the token: disabled, as for a push
	foreign   bool // the token is another app's: disabled, as for a push
}

// clearLoop runs a clear pass every clearInterval.
func (d *Dispatcher) clearLoop(ctx context.Context) {
	startstop.Every(ctx, startstop.Schedule{Interval: clearInterval, Clock: d.cfg.Clock}, func(ctx context.Context) bool {
		n, err := d.clearPass(ctx, d.sendContext())
		if err != nil && ctx.Err() == nil {
			d.failLog.Do(func(suppressed int64) {
				d.log.Error("clear pass failed", "err", err, "suppressed", suppressed)
			})
		}
		return n == clearBatch && err == nil
	})
}

// ClearPass sends the due clears (or, with ClearOnRead off, records them
// skipped) and returns to how many devices.
func (d *Dispatcher) ClearPass(ctx context.Context) (int, error) { return d.clearPass(ctx, ctx) }

// clearPass is ClearPass with two contexts, as pass: stop ends the claim,
// sends is the context of the requests and records after it.
func (d *Dispatcher) clearPass(stop, sends context.Context) (int, error) {
	d.sweepClears(stop)
	if !d.cfg.ClearOnRead {
		return d.skipClears(stop)
	}
	devs, err := d.claimClears(stop)
	if err != nil || len(devs) == 0 {
		return 0, err
	}
	byProvider := map[string][]*clearDevice{}
	var outcomes []clearOutcome
	for _, dev := range devs {
		switch {
		case !dev.enabled:
			outcomes = append(outcomes, clearOutcome{dev: dev, state: StateSkipped, err: "the device was disabled, or signed in as another user, since the push"})
		case dev.provider == ProviderWebPush:
			outcomes = append(outcomes, clearOutcome{dev: dev, state: StateSkipped, err: browserClearSkipped})
		case d.channels[dev.provider] == nil:
			outcomes = append(outcomes, clearOutcome{dev: dev, state: StateSkipped, err: dev.provider + " is not set up on this replica"})
		default:
			byProvider[dev.provider] = append(byProvider[dev.provider], dev)
		}
	}
	outcomes = append(outcomes, d.sendClears(sends, byProvider)...)
	bg := context.WithoutCancel(sends)
	if err := d.persist(bg, func(ctx context.Context) error { return d.recordClears(ctx, outcomes) }); err != nil {
		// Left sending: the sweep ends them failed, never sends them again.
		return len(devs), fmt.Errorf("record clears: %w", err)
	}
	gone, since := map[string][]string{}, map[string][]time.Time{}
	for _, o := range outcomes {
		result := map[string]string{StateSent: ClearSent, StateFailed: ClearFailed, StateSkipped: ClearSkipped, StateQueued: ClearRetried}[o.state]
		d.cfg.Metrics.clears.WithLabelValues(o.dev.provider, result).Inc()
		reason := goneReason(o.dev.provider)
		switch {
		case o.invalid:
			reason = devices.DisabledInvalid
		case o.foreign:
			reason = devices.DisabledForeign
		}
		if o.gone || o.invalid || o.foreign {
			asOf := o.dev.claimed
			if !o.goneSince.IsZero() && o.goneSince.Before(asOf) {
				asOf = o.goneSince
			}
			gone[reason], since[reason] = append(gone[reason], o.dev.token), append(since[reason], asOf)
		}
	}
	for reason, tokens := range gone {
		if err := d.cfg.Devices.DisableAsOf(bg, tokens, since[reason], reason); err != nil {
			d.log.Warn("disable devices their provider says are gone", "err", err)
		}
	}
	return len(devs), nil
}

// claimClears takes the due clears of up to clearBatch devices, at most
// clearMaxIDs each, of devices that got none in the last second. The
// device's row in push_clear_devices is the gate: its upsert takes the row's
// lock and checks the last clear's time again on the newest version, so two
// replicas never both pass it within a second (locked in token order, so
// they never deadlock). The rows move to sending in the same statement.
func (d *Dispatcher) claimClears(ctx context.Context) ([]*clearDevice, error) {
	rows, err := d.cfg.DB.Query(ctx, `WITH candidates AS (
			SELECT c.token FROM push_clears c
			WHERE c.state = 'queued' AND c.due_at <= greatest(now(), $3)
			  AND NOT EXISTS (SELECT 1 FROM push_clear_devices g WHERE g.token = c.token AND g.sent_at > now() - $4::interval)
			GROUP BY c.token ORDER BY min(c.due_at) LIMIT $1
		), gate AS (
			INSERT INTO push_clear_devices AS g (token, sent_at)
			SELECT token, now() FROM candidates ORDER BY token
			ON CONFLICT (token) DO UPDATE SET sent_at = EXCLUDED.sent_at WHERE g.sent_at <= EXCLUDED.sent_at - $4::interval
			RETURNING token
		), picked AS (
			SELECT notification_id, token FROM (
				SELECT c.notification_id, c.token, row_number() OVER (PARTITION BY c.token ORDER BY c.due_at, c.notification_id) AS n
				FROM push_clears c WHERE c.state = 'queued' AND c.due_at <= greatest(now(), $3) AND c.token IN (SELECT token FROM gate)) p
			WHERE n <= $5
		), claimed AS (
			UPDATE push_clears c SET state = 'sending', claimed_by = $2, sent_at = now()
			FROM picked p WHERE c.notification_id = p.notification_id AND c.token = p.token AND c.state = 'queued'
			RETURNING c.notification_id, c.notification_created_at, c.token, c.user_id, c.sent_at
		)
		SELECT c.notification_id, c.notification_created_at, c.token, c.user_id, c.sent_at,
		       coalesce(v.enabled AND v.user_id = c.user_id, false), `+devices.AddressColumn+`,
		       coalesce(v.provider, CASE WHEN c.token LIKE 'WebPush[%' THEN 'webpush' ELSE 'expo' END)
		FROM claimed c LEFT JOIN devices v ON v.token = c.token
		ORDER BY c.token, c.notification_created_at, c.notification_id`,
		clearBatch, d.cfg.Replica, d.cfg.Clock.Now(), clearInterval, clearMaxIDs)
	if err != nil {
		return nil, fmt.Errorf("claim clears: %w", err)
	}
	return collectClears(rows)
}

// collectClears groups the claimed rows by device, in feed order.
func collectClears(rows pgx.Rows) ([]*clearDevice, error) {
	defer rows.Close()
	byToken := map[string]*clearDevice{}
	var out []*clearDevice
	for rows.Next() {
		var id int64
		var created, claimed time.Time
		var token, user string
		var enabled bool
		var address, provider string
		if err := rows.Scan(&id, &created, &token, &user, &claimed, &enabled, &address, &provider); err != nil {
			return nil, fmt.Errorf("claim clears: %w", err)
		}
		dev := byToken[token]
		if dev == nil {
			// A browser is reached by its subscription: one removed since
			// the push has none.
			dev = &clearDevice{token: token, provider: provider, user: user, enabled: enabled && (provider != ProviderWebPush || address != ""), address: address, claimed: claimed}
			byToken[token] = dev
			out = append(out, dev)
		}
		dev.ids = append(dev.ids, id)
		dev.public = append(dev.public, feed.ID{CreatedAt: created, Seq: id}.String())
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim clears: %w", err)
	}
	return out, nil
}

// sendClears sends each provider's clears through its channel, the
// providers in parallel, and returns what each came to.
func (d *Dispatcher) sendClears(ctx context.Context, byProvider map[string][]*clearDevice) []clearOutcome {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var out []clearOutcome
	for provider, devs := range byProvider {
		wg.Go(func() {
			got := d.sendBatchedClears(ctx, d.channels[provider], devs)
			mu.Lock()
			out = append(out, got...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// clearMessage is dev's clear: a silent message (no title, body or
// sound, normal priority, data only) naming the notifications whose
// banners to take down, kept by the provider at most ClearTTL.
func (d *Dispatcher) clearMessage(dev *clearDevice) channel.Message {
	return channel.Message{Token: dev.token, Address: dev.address, Silent: true, Expires: d.cfg.Clock.Now().Add(ClearTTL),
		Data: map[string]any{"type": "clear", "ids": dev.public}}
}

// clearOutcomeOf is what a channel's answer to dev's clear comes to: what
// the provider did not take is given back for its Retry-After, or
// clearRetry; an unknown outcome is not sent again.
func (d *Dispatcher) clearOutcomeOf(provider string, dev *clearDevice, a channel.Outcome) clearOutcome {
	o := clearOutcome{dev: dev}
	if a.Credentials {
		d.cfg.Metrics.credentials.WithLabelValues(provider).Inc()
	}
	now := d.cfg.Clock.Now()
	if why, held := d.holdRefusal(provider, a, now); held {
		o.state, o.due, o.err = StateQueued, now.Add(refusalHold), why+"; sending again"
		return o
	}
	switch a.Kind {
	case channel.Delivered, channel.Accepted:
		o.state, o.ticket = StateSent, a.ID
	case channel.RetryAfter, channel.NotSent:
		wait := cmp.Or(a.Wait, clearRetry)
		if a.Credentials {
			// Refused until an operator acts (the alert says so).
			wait = max(wait, clearCredentialsRetry)
		}
		o.state, o.due, o.err = StateQueued, d.cfg.Clock.Now().Add(wait), fmt.Sprintf("%s took nothing (%s); sending again", provider, a.Reason)
	case channel.TokenGone:
		o.state, o.err, o.gone, o.goneSince = StateFailed, a.Reason, true, a.InvalidSince
	case channel.TokenInvalid:
		o.state, o.err, o.invalid = StateFailed, a.Reason+"; the token is disabled", true
	case channel.TokenForeign:
		o.state, o.err, o.foreign = StateFailed, a.Reason+"; the token is disabled", true
	case channel.Unknown:
		o.state, o.err = StateFailed, fmt.Sprintf("outcome unknown: %s; not retried, a retry could deliver twice", a.Reason)
	default:
		o.state, o.err = StateFailed, a.Reason
	}
	return o
}

// sendBatchedClears sends the clears of one channel's devices (Expo, APNs,
// FCM) in batches of the channel's MaxBatch.
func (d *Dispatcher) sendBatchedClears(ctx context.Context, ch channel.Channel, devs []*clearDevice) []clearOutcome {
	msgs := make([]channel.Message, len(devs))
	for i, dev := range devs {
		msgs[i] = d.clearMessage(dev)
	}
	answers := sendBatches(ctx, ch, msgs, nil)
	now := d.cfg.Clock.Now()
	for i, dev := range devs {
		d.refusals.observe(ch.Provider(), dev.token, answers[i], now)
	}
	out := make([]clearOutcome, len(devs))
	for i, dev := range devs {
		out[i] = d.clearOutcomeOf(ch.Provider(), dev, answers[i])
	}
	return out
}

// recordClears writes what became of the claimed clears: only rows still
// sending under this replica's claim change. A clear given back is queued
// again, due later.
func (d *Dispatcher) recordClears(ctx context.Context, outcomes []clearOutcome) error {
	var ids []int64
	var tokens, states, tickets, errs []string
	var due []*time.Time
	for _, o := range outcomes {
		var at *time.Time
		if o.state == StateQueued {
			at = &o.due
		}
		for _, id := range o.dev.ids {
			ids, tokens, states = append(ids, id), append(tokens, o.dev.token), append(states, o.state)
			tickets, errs, due = append(tickets, o.ticket), append(errs, o.err), append(due, at)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	_, err := d.cfg.DB.Exec(ctx, `UPDATE push_clears c
		SET state = u.state, ticket_id = NULLIF(u.ticket, ''), error = NULLIF(u.error, ''), due_at = coalesce(u.due, c.due_at),
		    sent_at = CASE WHEN u.state = 'queued' THEN NULL ELSE c.sent_at END
		FROM unnest($1::int8[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[]) AS u(nid, token, state, ticket, error, due)
		WHERE c.notification_id = u.nid AND c.token = u.token AND c.state = 'sending' AND c.claimed_by = $7`,
		ids, tokens, states, tickets, errs, due, d.cfg.Replica)
	return err
}

// skipClears records the due clears skipped, with ClearOnRead off: turned
// on later, the replicas do not send clears of reads long past.
func (d *Dispatcher) skipClears(ctx context.Context) (int, error) {
	rows, err := d.cfg.DB.Query(ctx, `WITH due AS (
			SELECT notification_id, token FROM push_clears WHERE state = 'queued' ORDER BY due_at, token LIMIT $1 FOR UPDATE SKIP LOCKED
		)
		UPDATE push_clears c SET state = 'skipped', error = 'not sent: --push-clear-on-read is off'
		FROM due WHERE c.notification_id = due.notification_id AND c.token = due.token
		RETURNING c.token || ' ' || coalesce((SELECT provider FROM devices v WHERE v.token = c.token),
		                                     CASE WHEN c.token LIKE 'WebPush[%' THEN 'webpush' ELSE 'expo' END)`, clearBatch*clearMaxIDs)
	if err != nil {
		return 0, fmt.Errorf("skip clears: %w", err)
	}
	skipped, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("skip clears: %w", err)
	}
	seen := map[string]bool{}
	for _, s := range skipped {
		if !seen[s] {
			seen[s] = true
			_, provider, _ := strings.Cut(s, " ") // tokens hold no spaces
			d.cfg.Metrics.clears.WithLabelValues(provider, ClearSkipped).Inc()
		}
	}
	return len(seen), nil
}

// sweepClears, at most every clearSweepInterval: clears left sending past
// the lease (a replica killed mid-send) end failed, never sent again, as
// their provider may have taken them; clears due longer than --push-max-age
// end skipped; rows past clearKeep, and devices' gates past their second,
// go.
func (d *Dispatcher) sweepClears(ctx context.Context) {
	now := d.cfg.Clock.Now()
	last := d.lastClearSweep.Load()
	if now.UnixNano()-last < int64(clearSweepInterval) || !d.lastClearSweep.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`UPDATE push_clears SET state = 'failed', error = 'interrupted: its replica stopped mid-send; not sent again, the provider may have taken it'
			WHERE state = 'sending' AND sent_at < greatest(now(), $1) - $2::interval`, []any{now, d.cfg.Lease}},
		{`UPDATE push_clears SET state = 'skipped', error = 'expired: due more than --push-max-age ago'
			WHERE state = 'queued' AND created_at < greatest(now(), $1) - $2::interval`, []any{now, d.cfg.MaxAge}},
		{`DELETE FROM push_clears WHERE created_at < now() - $1::interval`, []any{clearKeep}},
		{`DELETE FROM push_clear_devices WHERE sent_at < now() - $1::interval`, []any{time.Hour}},
	} {
		if _, err := d.cfg.DB.Exec(ctx, q.sql, q.args...); err != nil {
			if ctx.Err() == nil {
				d.log.Warn("sweep the clears", "err", err)
			}
			return
		}
	}
}
