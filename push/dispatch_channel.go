package push

// This file holds how dispatches reach the providers behind the channel
// shape (package channel): the dispatcher builds each message, hands a
// provider's batch to its channel, and turns the one vocabulary of
// outcomes into the delivery log, the devices' state and the queue.

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/chaosplant"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// The backoff between the tries of messages a channel's provider did not
// take and named no wait for: doubling from channelRetryMin, at most
// channelRetryMax.
const (
	channelRetryMin = 500 * time.Millisecond
	channelRetryMax = 30 * time.Second
)

// channelRetryPause is how long a message a provider did not take waits
// in the queue when another pass is trying that provider again, and the
// least a deferred one waits.
const channelRetryPause = 5 * time.Second

// channelAnswerReserve is kept, at the lease's end, for a try's answer:
// a try that could not end by then is not made.
const channelAnswerReserve = 10 * time.Second

// channelMessage is the message for one dispatch, for any channel.
func channelMessage(c created) channel.Message {
	m := channel.Message{
		Token:    c.token,
		Address:  c.address,
		ID:       feed.ID{CreatedAt: c.n.createdAt, Seq: c.n.id}.String(),
		Title:    c.n.title,
		Body:     c.n.body,
		Category: c.n.category,
		Urgent:   c.n.critical(),
	}
	if c.n.digestCount > 0 {
		// A digest's pushes share a collapse id: a newer replaces an
		// older one still undelivered.
		m.Data = map[string]any{"digest": map[string]any{"key": c.n.digestKey, "count": c.n.digestCount}}
		m.CollapseKey = "digest:" + c.n.digestKey
	}
	return m
}

// sendChannels sends each provider's dispatches through its channel, the
// providers in parallel, and returns when each is recorded.
func (d *Dispatcher) sendChannels(ctx context.Context, byProvider map[string][]created, by time.Time) {
	var wg sync.WaitGroup
	for provider, items := range byProvider {
		wg.Go(func() { d.sendChannel(ctx, provider, items, by) })
	}
	wg.Wait()
}

// sendChannel sends one provider's dispatches. What the provider did not
// take (RetryAfter) and named no wait for is sent again with backoff while
// a try can end by the lease's end (by), by one pass per provider at a
// time, and then ends failed; the other passes give it back to the queue
// for channelRetryPause, so that an outage of a provider holds one worker
// and the other providers' pushes of the next passes go on. A wait the
// provider named that the lease cannot hold (a Retry-After, Expo's
// MessageRateExceeded) defers the push to it, once. Refused credentials
// are deferred once, never retried in the pass. Unknown outcomes are
// final: at most once.
func (d *Dispatcher) sendChannel(ctx context.Context, provider string, items []created, by time.Time) {
	bg := context.WithoutCancel(ctx)
	ch := d.channels[provider]
	if ch == nil {
		d.notSetUp(bg, provider, items)
		return
	}
	retrier := false
	select {
	case d.channelRetriers[provider] <- struct{}{}:
		defer func() { <-d.channelRetriers[provider] }()
		retrier = true
	default:
	}
	var settled settled
	reserve := min(channelAnswerReserve, d.cfg.Lease/4)
	pending := items
	for tries := 1; len(pending) > 0; tries++ {
		sendCtx := ctx
		if retrier {
			// The retrier's channel may retry within the lease itself
			// (Expo's client does), so that its outcome is recorded in it.
			sendCtx = channel.WithRetryBudget(ctx, clock.Until(d.cfg.Clock, by)-reserve)
		}
		answers := d.channelSend(sendCtx, ch, pending)
		now := d.cfg.Clock.Now()
		// The whole batch is seen before any device of it is judged: a
		// wrong setting refuses all of them at once.
		for i, o := range answers {
			d.refusals.observe(provider, pending[i].token, o, now)
		}
		var retry []created
		var backoff time.Duration
		var lastWhy string
		for i, o := range answers {
			if v := d.judge(&settled, provider, pending[i], o, retrier, now, by, reserve); v.retry {
				retry = append(retry, pending[i])
				backoff, lastWhy = max(backoff, o.Wait), o.Reason
			}
		}
		if len(retry) == 0 {
			break
		}
		backoff = cmp.Or(backoff, startstop.Backoff(tries, channelRetryMin, channelRetryMax))
		if ctx.Err() != nil || now.Add(backoff+reserve).After(by) || !startstop.Sleep(ctx, d.cfg.Clock, backoff) {
			settled.retryEnded(ctx, provider, retry, lastWhy)
			break
		}
		pending = retry
	}
	d.finish(bg, provider, &settled)
}

// notSetUp gives back the dispatches of a provider not set up on this
// replica (a rollout of its flags, one replica misconfigured), for the
// others, until --push-max-age ends them skipped. Counted, so that the
// alert on not_sent tells.
func (d *Dispatcher) notSetUp(ctx context.Context, provider string, items []created) {
	d.failLog.Do(func(suppressed int64) {
		d.log.Warn("pushes to devices of a provider not set up on this replica are given back for the others; set it up on every replica", "provider", provider, "suppressed", suppressed)
	})
	d.cfg.Metrics.channelSent.WithLabelValues(provider, channel.NotSent.String()).Add(float64(len(items)))
	d.giveBack(ctx, items, d.cfg.Clock.Now().Add(channelRetryPause))
}

// settled is what a send's outcomes came to, to be written (finish).
type settled struct {
	final         []outcome
	invalid       []created // disabled as invalid tokens
	unsent, later []created // given back at once, and after channelRetryPause
	deferred      []deferredSend
}

type deferredSend struct {
	c   created
	at  time.Time
	why string
}

// verdict is what judge decided for one outcome that is not settled yet.
type verdict struct{ retry bool }

// judge settles one dispatch's outcome (its answer already observed by
// the refusal guard, with the rest of its batch), or asks for another try in this
// pass (retry: a retrier's, for a provider that took nothing and named no
// wait longer than channelRetryPause, while a try can end by by).
func (d *Dispatcher) judge(s *settled, provider string, c created, o channel.Outcome, retrier bool, now, by time.Time, reserve time.Duration) verdict {
	if chaosplant.Enabled && o.Kind == channel.TokenForeign && chaosplant.Plant(chaosplant.MisjudgeRefusal) {
		o.Kind, o.Credentials = channel.Failed, true // a planted defect (chaos self-check builds only)
	}
	d.cfg.Metrics.channelSent.WithLabelValues(provider, o.Kind.String()).Inc()
	if o.Credentials {
		d.cfg.Metrics.credentials.WithLabelValues(provider).Inc()
	}
	if why, held := d.holdRefusal(provider, o, now); held {
		s.deferred = append(s.deferred, deferredSend{c, now.Add(refusalHold), why})
		return verdict{}
	}
	switch o.Kind {
	case channel.Accepted:
		// Taken, and named for a receipt: sent until it comes.
		s.final = append(s.final, outcome{c: c, state: StateSent, ticket: o.ID})
	case channel.Delivered:
		s.final = append(s.final, outcome{c: c, state: StateDelivered, ticket: o.ID})
	case channel.TokenGone:
		s.final = append(s.final, outcome{c: c, state: StateFailed, err: o.Reason, gone: goneReason(provider), goneSince: o.InvalidSince})
	case channel.TokenInvalid:
		s.final = append(s.final, outcome{c: c, state: StateFailed, err: o.Reason + "; the token is disabled"})
		s.invalid = append(s.invalid, c)
	case channel.TokenForeign:
		s.final = append(s.final, outcome{c: c, state: StateFailed, err: o.Reason + "; the token is disabled", gone: devices.DisabledForeign})
	case channel.Unknown:
		s.final = append(s.final, outcome{c: c, state: StateFailed, err: fmt.Sprintf("outcome unknown: %s; not retried, a retry could deliver twice", o.Reason)})
	case channel.Failed:
		s.final = append(s.final, outcome{c: c, state: StateFailed, err: o.Reason})
	case channel.NotSent:
		s.unsent = append(s.unsent, c)
	default:
		s.final = append(s.final, outcome{c: c, state: StateFailed, err: fmt.Sprintf("%s answered an outcome of kind %d: %s", provider, o.Kind, o.Reason)})
	case channel.RetryAfter:
		d.failLog.Do(func(suppressed int64) {
			d.log.Warn("a push provider did not take a message; sending it again", "provider", provider, "reason", o.Reason, "credentials", o.Credentials, "suppressed", suppressed)
		})
		switch {
		case o.Credentials:
			// Refused until an operator acts (the alert says so).
			s.deferred = append(s.deferred, deferredSend{c, now.Add(max(o.Wait, channelRetryPause)), fmt.Sprintf("%s: %s refused this deployment's credentials", o.Reason, provider)})
		case o.Wait > channelRetryPause || now.Add(o.Wait+reserve).After(by):
			// A long wait holds no pass: deferred to it, once.
			s.deferred = append(s.deferred, deferredSend{c, now.Add(o.Wait), fmt.Sprintf("%s: %s asked to wait %s", o.Reason, provider, o.Wait)})
		case !retrier:
			s.later = append(s.later, c)
		default:
			return verdict{retry: true}
		}
	}
	return verdict{}
}

// holdRefusal reports whether o refuses its device while provider refuses
// most devices (refusalGuard): then the device is kept, the push waits,
// the refusal is counted for the page, and why says so.
func (d *Dispatcher) holdRefusal(provider string, o channel.Outcome, now time.Time) (why string, held bool) {
	if !refusedDevice(o) {
		return "", false
	}
	held, refused, answered := d.refusals.holds(provider, now)
	if !held {
		return "", false
	}
	d.cfg.Metrics.refusalsHeld.WithLabelValues(provider).Inc()
	d.failLog.Do(func(suppressed int64) {
		d.log.Error("a push provider refuses most devices' tokens: none is disabled, their pushes wait; check this deployment's settings for it", "provider", provider,
			"reason", o.Reason, "refused", refused, "devices", answered, "suppressed", suppressed)
	})
	return fmt.Sprintf("%s; %s refused %d of the last %d devices it answered, so this deployment's settings are wrong, not the device's token (%s): the device is kept",
		o.Reason, provider, refused, answered, settingsFor(provider)), true
}

// settingsFor names the settings that make provider refuse every device.
func settingsFor(provider string) string {
	switch provider {
	case "apns":
		return "--apns-sandbox, --apns-topic"
	case "fcm":
		return "--fcm-credentials-file, --fcm-project"
	case ProviderWebPush:
		return "--vapid-key-file"
	case ProviderExpo:
		return "--expo-access-token-file, --expo-experience"
	}
	return "its credentials"
}

// retryEnded settles what was to be tried again when no try can be made:
// given back if the process is stopping, else failed, the provider having
// taken nothing within the lease.
func (s *settled) retryEnded(ctx context.Context, provider string, retry []created, why string) {
	if ctx.Err() != nil {
		s.unsent = append(s.unsent, retry...)
		return
	}
	for _, c := range retry {
		s.final = append(s.final, outcome{c: c, state: StateFailed, err: fmt.Sprintf("%s; %s took nothing, and was tried again while a try could end within the dispatch's lease", why, provider)})
	}
}

// finish writes what the sends came to. Recorded first, even if the
// process is stopping: what was not sent is given back after, so that
// whoever takes it again sees which devices already have it.
func (d *Dispatcher) finish(ctx context.Context, provider string, s *settled) {
	d.recordOrLog(ctx, s.final)
	for _, w := range s.deferred {
		if !d.deferOnce(ctx, w.c, w.at, w.why) {
			d.recordOrLog(ctx, []outcome{{c: w.c, state: StateFailed, err: w.why + "; deferred once already, or past --push-max-age"}})
		}
	}
	d.giveBack(ctx, s.unsent, time.Time{})
	if len(s.later) > 0 {
		d.giveBack(ctx, s.later, d.cfg.Clock.Now().Add(channelRetryPause))
	}
	if len(s.invalid) > 0 {
		tokens, since := make([]string, len(s.invalid)), make([]time.Time, len(s.invalid))
		for i, c := range s.invalid {
			tokens[i], since[i] = c.token, c.createdAt
		}
		if err := d.persist(ctx, func(ctx context.Context) error {
			return d.cfg.Devices.DisableAsOf(ctx, tokens, since, devices.DisabledInvalid)
		}); err != nil {
			d.log.Warn("disable tokens the provider refused", "provider", provider, "err", err)
		}
	}
}

// goneReason is the disabled_reason of a device its provider says is gone.
func goneReason(provider string) string {
	if provider == ProviderWebPush {
		return devices.DisabledGone
	}
	return devices.DisabledUnreachable
}

// channelSend hands items' pushes to ch (sendBatches), timed and, in the
// chaos self-check's build only, sent twice where planted.
func (d *Dispatcher) channelSend(ctx context.Context, ch channel.Channel, items []created) []channel.Outcome {
	msgs := make([]channel.Message, len(items))
	for i, c := range items {
		msgs[i] = channelMessage(c)
	}
	return sendBatches(ctx, ch, msgs, func(batch []channel.Message) []channel.Outcome {
		start := time.Now()
		got := ch.Send(ctx, batch)
		d.cfg.Metrics.channelTook.WithLabelValues(ch.Provider()).Observe(time.Since(start).Seconds())
		if chaosplant.Enabled {
			for i, m := range batch {
				if i < len(got) && (got[i].Kind == channel.Accepted || got[i].Kind == channel.Delivered) && chaosplant.Plant(chaosplant.DoublePush) {
					_ = ch.Send(ctx, []channel.Message{m}) // a planted defect (chaos self-check builds only)
				}
			}
		}
		return got
	})
}

// sendBatches hands msgs to ch in batches of at most its MaxBatch, the
// batches in parallel, each through send (nil: ch.Send), and returns one
// answer per message, in order: Failed for those a channel left
// unanswered.
func sendBatches(ctx context.Context, ch channel.Channel, msgs []channel.Message, send func([]channel.Message) []channel.Outcome) []channel.Outcome {
	if send == nil {
		send = func(batch []channel.Message) []channel.Outcome { return ch.Send(ctx, batch) }
	}
	answers := make([]channel.Outcome, len(msgs))
	size := max(1, ch.MaxBatch())
	var wg sync.WaitGroup
	for lo := 0; lo < len(msgs); lo += size {
		hi := min(lo+size, len(msgs))
		wg.Go(func() {
			got := send(msgs[lo:hi])
			for i := range hi - lo {
				if i < len(got) {
					answers[lo+i] = got[i]
				} else {
					answers[lo+i] = channel.Outcome{Kind: channel.Failed, Reason: ch.Provider() + " answered fewer outcomes than messages"}
				}
			}
		})
	}
	wg.Wait()
	return answers
}

// recordOrLog records outcomes, for at most the lease.
func (d *Dispatcher) recordOrLog(ctx context.Context, outcomes []outcome) {
	if err := d.persist(ctx, func(ctx context.Context) error { return d.record(ctx, outcomes) }); err != nil {
		d.log.Error("record pushes; they stay queued and end failed (interrupted)", "err", err)
	}
}

// validToken reports whether token has its provider's shape; a provider
// not set up here is not judged (its dispatch says it is not set up).
func (d *Dispatcher) validToken(token, provider string) bool {
	if provider == ProviderWebPush {
		return devices.IsWebToken(token)
	}
	if r, ok := d.channels[provider].(channel.Registrar); ok {
		return r.ValidToken(token)
	}
	return true
}
