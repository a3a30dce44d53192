package push

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// Receipter fetches push receipts: an *expo.Client.
type Receipter interface {
	Receipts(ctx context.Context, ids []string) (map[string]expo.Receipt, error)
}

var _ Receipter = (*expo.Client)(nil)

// ReceiptReconcilerConfig configures a receipt reconciler.
type ReceiptReconcilerConfig struct {
	// DB is Postgres. Required.
	DB DB
	// Receipter fetches receipts. Required.
	Receipter Receipter
	// Devices disables tokens Expo no longer knows. Required.
	Devices *devices.Store
	// Interval is how often a pass runs. Default 30s.
	Interval time.Duration
	// ReceiptWindow is how long Expo keeps receipts: a ticket older without
	// one ends receipt_missing. Default 24h.
	ReceiptWindow time.Duration
	// Interrupted is how long a dispatch may stay queued (written, not yet
	// sent) before it is taken for one whose dispatcher stopped mid-send and
	// ends failed. Default 10m.
	Interrupted time.Duration
	// MaxAge bounds the sends again of a push whose receipt says Expo did
	// not deliver it for sending too many to the device
	// (MessageRateExceeded): none is due later than MaxAge after its first
	// send (--push-max-age). Default 1h.
	MaxAge time.Duration
	// Clock times the passes and tells which tickets are past ReceiptWindow
	// and which dispatches past Interrupted. Default the wall clock.
	Clock clock.Clock
	// Metrics and Logger: defaults not exported, slog.Default().
	Metrics *Metrics
	Logger  *slog.Logger
}

// ReceiptReconciler turns tickets into outcomes: delivered, receipt_error,
// or receipt_missing. Several replicas share the work: each pass leases the
// tickets it checks.
type ReceiptReconciler struct {
	cfg     ReceiptReconcilerConfig
	log     *slog.Logger
	failLog *lograte.Limiter
	svc     startstop.Service
	// refusals tells one device's MismatchSenderId from the project's
	// FCM credentials at Expo refusing every Android device.
	refusals *refusalGuard
}

// receiptBatch is how many tickets one receipt request asks about.
const receiptBatch = expo.MaxIDsPerReceipts

// NewReceiptReconciler returns a reconciler; Start runs it.
func NewReceiptReconciler(cfg ReceiptReconcilerConfig) (*ReceiptReconciler, error) {
	switch {
	case cfg.DB == nil || cfg.Receipter == nil || cfg.Devices == nil:
		return nil, errors.New("receipt reconciler: a database, a receipt source and devices are required")
	case cfg.Interval < 0 || cfg.ReceiptWindow < 0 || cfg.Interrupted < 0 || cfg.MaxAge < 0:
		return nil, errors.New("receipt reconciler: interval and windows must not be negative")
	}
	cfg.MaxAge = cmp.Or(cfg.MaxAge, time.Hour)
	cfg.Interval = cmp.Or(cfg.Interval, 30*time.Second)
	cfg.ReceiptWindow = cmp.Or(cfg.ReceiptWindow, 24*time.Hour)
	cfg.Interrupted = cmp.Or(cfg.Interrupted, 10*time.Minute)
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &ReceiptReconciler{cfg: cfg, log: cfg.Logger.With("component", "receipts"), failLog: lograte.New(10 * time.Second), refusals: newRefusalGuard()}, nil
}

// Start runs passes every Interval in the background, the first one an
// Interval after Start; only the first call does.
func (r *ReceiptReconciler) Start(ctx context.Context) { r.svc.Start(ctx, r.loop) }

// Stop stops the passes and waits for one in flight, until ctx ends. Safe
// to call twice, and before Start.
func (r *ReceiptReconciler) Stop(ctx context.Context) error { return r.svc.Stop(ctx) }

// loop waits an Interval, runs a pass, and again; a failed pass is logged
// (at a limited rate) and the next one retries.
func (r *ReceiptReconciler) loop(ctx context.Context) {
	startstop.Every(ctx, startstop.Schedule{Interval: r.cfg.Interval, Clock: r.cfg.Clock, Delay: true}, func(ctx context.Context) bool {
		if err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.failLog.Do(func(suppressed int64) {
				r.log.Error("receipt pass failed; the next one retries", "err", err, "suppressed", suppressed)
			})
		}
		return false
	})
}

// Pass ends tickets past the receipt window as receipt_missing, queued
// dispatches left by a stopped dispatcher as failed, and asks Expo for the
// receipts of the sent ones, a thousand at a time until none is left that
// was not asked about in this pass.
func (r *ReceiptReconciler) Pass(ctx context.Context) error {
	cutoff := r.cfg.Clock.Now().Add(-r.cfg.ReceiptWindow)
	missing, err := r.cfg.DB.Exec(ctx, `UPDATE push_dispatches SET state = 'receipt_missing', updated_at = now(),
			error = 'no receipt within the receipt window'
		WHERE state = 'sent' AND sent_at < $1`, cutoff)
	if err != nil {
		return fmt.Errorf("end missing receipts: %w", err)
	}
	r.cfg.Metrics.receipts.WithLabelValues("missing", "").Add(float64(missing.RowsAffected()))
	if _, err := r.cfg.DB.Exec(ctx, `UPDATE push_dispatches SET state = 'failed', updated_at = now(),
			error = 'interrupted: the dispatcher stopped before recording the ticket'
		WHERE state = 'queued' AND created_at < $1`, r.cfg.Clock.Now().Add(-r.cfg.Interrupted)); err != nil {
		return fmt.Errorf("end interrupted dispatches: %w", err)
	}
	// receipt_checked_at is Postgres's time: the pass starts on the same
	// clock, or a clock ahead of Postgres's would take the same tickets again
	// and again within one pass.
	var passStart time.Time
	if err := r.cfg.DB.QueryRow(ctx, `SELECT now()`).Scan(&passStart); err != nil {
		return fmt.Errorf("read the pass's start: %w", err)
	}
	for ctx.Err() == nil {
		n, err := r.checkBatch(ctx, cutoff, passStart)
		if err != nil {
			return err
		}
		if n < receiptBatch {
			return nil
		}
	}
	return ctx.Err()
}

type sentTicket struct {
	id        int64
	createdAt time.Time
	ticket    string
	token     string
	// The notification pushed.
	notificationID        int64
	notificationCreatedAt time.Time
}

// checkBatch leases up to receiptBatch sent dispatches not checked since
// this pass began and records their receipts.
func (r *ReceiptReconciler) checkBatch(ctx context.Context, cutoff, passStart time.Time) (int, error) {
	rows, err := r.cfg.DB.Query(ctx, `UPDATE push_dispatches d SET receipt_checked_at = now()
		FROM (SELECT id, created_at FROM push_dispatches
		      WHERE state = 'sent' AND sent_at >= $1 AND (receipt_checked_at IS NULL OR receipt_checked_at < $2)
		      ORDER BY sent_at LIMIT $3 FOR UPDATE SKIP LOCKED) t
		WHERE d.id = t.id AND d.created_at = t.created_at
		RETURNING d.id, d.created_at, d.ticket_id, d.token, d.notification_id, d.notification_created_at`, cutoff, passStart, receiptBatch)
	if err != nil {
		return 0, fmt.Errorf("take tickets: %w", err)
	}
	sent, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (sentTicket, error) {
		var s sentTicket
		err := row.Scan(&s.id, &s.createdAt, &s.ticket, &s.token, &s.notificationID, &s.notificationCreatedAt)
		return s, err
	})
	if err != nil || len(sent) == 0 {
		return 0, err
	}
	ids := make([]string, len(sent))
	for i, s := range sent {
		ids[i] = s.ticket
	}
	receipts, err := r.cfg.Receipter.Receipts(ctx, ids)
	if err != nil {
		return 0, fmt.Errorf("fetch receipts: %w", err) // the rows stay sent; a later pass asks again
	}
	var upd []int64
	var updAt []time.Time
	var states, errs []string
	var gone, foreign []string
	var goneSince, foreignSince []time.Time
	now := r.cfg.Clock.Now()
	for _, s := range sent {
		if rc, ok := receipts[s.ticket]; ok {
			r.refusals.observe(ProviderExpo, s.token, receiptOutcome(rc), now)
		}
	}
	for _, s := range sent {
		rc, ok := receipts[s.ticket]
		if !ok {
			continue // not ready: stays sent for the next pass
		}
		state, detail := StateDelivered, ""
		if rc.Status != "ok" {
			state, detail = StateReceiptError, strings.TrimSpace(rc.Code()+": "+rc.Message)
			if rc.Code() == expo.MessageRateExceeded {
				// Expo did not deliver it: sending it again cannot deliver
				// twice. Expo: "implement exponential backoff and slowly
				// retry sending messages".
				r.cfg.Metrics.receipts.WithLabelValues(rc.Status, rc.Code()).Inc()
				resent, err := r.sendAgain(ctx, s, detail)
				if err != nil {
					return 0, err
				}
				if resent {
					continue
				}
				detail += "; not sent again: the next try would be past --push-max-age"
				upd, updAt, states, errs = append(upd, s.id), append(updAt, s.createdAt), append(states, state), append(errs, detail)
				continue
			}
			switch rc.Code() {
			case expo.DeviceNotRegistered:
				// As of the send, which may be hours old: a token registered
				// again since stays on.
				gone, goneSince = append(gone, s.token), append(goneSince, s.createdAt)
			case expo.MismatchSenderID:
				// This device's app has another FCM sender: disabled, unless
				// most devices answer so (the project's credentials at Expo).
				if held, refused, answered := r.refusals.holds(ProviderExpo, now); held {
					r.cfg.Metrics.refusalsHeld.WithLabelValues(ProviderExpo).Inc()
					detail += fmt.Sprintf("; the device is kept: Expo refused %d of the last %d devices it answered, so this project's FCM credentials at Expo are wrong", refused, answered)
					r.failLog.Do(func(suppressed int64) {
						r.log.Error("Expo's receipts refuse most Android devices' sender (MismatchSenderId): none is disabled; check the project's FCM credentials at Expo", "refused", refused, "devices", answered, "suppressed", suppressed)
					})
				} else {
					foreign, foreignSince = append(foreign, s.token), append(foreignSince, s.createdAt)
					detail += "; the token is disabled"
				}
			case expo.InvalidCredentials:
				// The project's push credentials at Expo: an operator's.
				r.cfg.Metrics.credentials.WithLabelValues(ProviderExpo).Inc()
			}
		}
		r.cfg.Metrics.receipts.WithLabelValues(rc.Status, rc.Code()).Inc()
		upd, updAt, states, errs = append(upd, s.id), append(updAt, s.createdAt), append(states, state), append(errs, detail)
	}
	if len(upd) > 0 {
		if _, err := r.cfg.DB.Exec(ctx, `UPDATE push_dispatches d SET state = u.state, error = NULLIF(u.error, ''), updated_at = now()
			FROM unnest($1::int8[], $2::timestamptz[], $3::text[], $4::text[]) AS u(id, created_at, state, error)
			WHERE d.id = u.id AND d.created_at = u.created_at`, upd, updAt, states, errs); err != nil {
			return 0, fmt.Errorf("record receipts: %w", err)
		}
	}
	if err := r.cfg.Devices.DisableUnreachable(ctx, gone, goneSince); err != nil {
		return 0, err
	}
	if err := r.cfg.Devices.DisableAsOf(ctx, foreign, foreignSince, devices.DisabledForeign); err != nil {
		return 0, err
	}
	return len(sent), nil
}

// receiptOutcome is what a receipt says of its device, in the channels'
// words, for the refusal guard.
func receiptOutcome(rc expo.Receipt) channel.Outcome {
	switch {
	case rc.Status == "ok":
		return channel.Outcome{Kind: channel.Delivered}
	case rc.Code() == expo.DeviceNotRegistered:
		return channel.Outcome{Kind: channel.TokenGone}
	case rc.Code() == expo.MismatchSenderID:
		return channel.Outcome{Kind: channel.TokenForeign}
	}
	return channel.Outcome{Kind: channel.Failed}
}

// RateExceededBackoff is the first wait before a push whose receipt said
// MessageRateExceeded is sent again; each further try waits twice the one
// before.
const RateExceededBackoff = time.Minute

// sendAgain defers a sent dispatch whose receipt says Expo did not deliver
// it (MessageRateExceeded) and queues its notification again, due after
// the backoff of its tries so far, for the next pass to send to this
// device alone (a deferred dispatch does not count as sent; the device's
// others do). It reports false, changing nothing, when that would be due
// past MaxAge after the first try. The push is sent again as its
// notification, at normal priority: a digest's push or a critical one
// keeps its text, not its digest count or its priority (the queue row that
// held them is gone by the time a receipt comes).
func (r *ReceiptReconciler) sendAgain(ctx context.Context, s sentTicket, why string) (bool, error) {
	var tries int
	var first time.Time
	if err := r.cfg.DB.QueryRow(ctx, `SELECT count(*), min(created_at) FROM push_dispatches
		WHERE notification_id = $1 AND notification_created_at = $2 AND token = $3`,
		s.notificationID, s.notificationCreatedAt, s.token).Scan(&tries, &first); err != nil {
		return false, fmt.Errorf("count a push's tries: %w", err)
	}
	wait := RateExceededBackoff << min(max(tries-1, 0), 16)
	due := r.cfg.Clock.Now().Add(wait)
	if !due.Before(first.Add(r.cfg.MaxAge)) {
		return false, nil
	}
	why = fmt.Sprintf("%s (receipt); sending again at %s", why, due.UTC().Format(time.RFC3339))
	_, err := r.cfg.DB.Exec(ctx, `WITH deferred AS (
			UPDATE push_dispatches SET state = 'deferred', error = $3, updated_at = now()
			WHERE id = $1 AND created_at = $2 AND state = 'sent'
			RETURNING notification_id
		)
		INSERT INTO push_queue (notification_id, notification_created_at, enqueued_at, user_id, category, claimed_by,
		                        due_at, priority, decided, broadcast)
		SELECT n.id, n.created_at, n.created_at, n.user_id, n.category, 'receipts', $6, 'normal', true, n.topic IS NOT NULL
		FROM deferred JOIN notifications n ON n.id = $4 AND n.created_at = $5
		ON CONFLICT (notification_id) DO UPDATE SET `+retakeQueued,
		s.id, s.createdAt, why, s.notificationID, s.notificationCreatedAt, due)
	if err != nil {
		return false, fmt.Errorf("queue a push again: %w", err)
	}
	return true, nil
}
