// Package channel is the shape every push provider takes. The dispatcher
// decides who gets what (devices, preferences, delivery policies, the
// queue, its lease, the delivery log); a channel only sends: it takes a
// batch of messages for its provider and answers, per message, one Outcome
// from one vocabulary. Adding a provider is one package implementing
// Channel and one line of wiring.
package channel

import (
	"context"
	"fmt"
	"time"
)

// Message is one push to one device.
type Message struct {
	// Token is the device's token as its provider knows it: an APNs
	// device token (hex), an FCM registration token, an Expo push token.
	Token string
	// Address is how to reach the device when its token alone does not
	// say: a Web Push subscription (JSON, as the browser gave it: endpoint
	// and keys). "" for providers whose token is the address.
	Address string
	// ID is the notification's id. Providers that can replace a banner
	// not yet read use it as the collapse id, so that a push sent again
	// after an unknown outcome replaces the first instead of adding a
	// second; the app receives it as data (id).
	ID string
	// Title and Body are what the banner shows; each channel shortens
	// them to its provider's size limit (the feed keeps the whole text).
	Title, Body string
	// Category is the notification's category, passed to the app as data.
	Category string
	// Data is more for the app (the digest it gathers); may be nil.
	Data map[string]any
	// Urgent asks for immediate delivery (a critical notification):
	// APNs priority 10, FCM HIGH; otherwise the provider may save power.
	Urgent bool
	// Expires is when the provider may drop the push undelivered (a
	// phone offline until then); zero: the channel's default.
	Expires time.Time
	// CollapseKey, when set, replaces ID as the collapse id: a digest's
	// pushes share one, so a newer replaces an older still undelivered.
	CollapseKey string
	// Silent is a background message the app handles without showing
	// anything (a clear: take these banners down): no title, body, sound or
	// collapse id, normal priority; Data is all it carries (APNs
	// content-available, FCM data only).
	Silent bool
}

// Collapse is the id under which the provider replaces an undelivered push.
func (m Message) Collapse() string {
	if m.CollapseKey != "" {
		return m.CollapseKey
	}
	return m.ID
}

// Kind is what became of one message.
type Kind uint8

// The outcomes a channel answers.
const (
	// Delivered: the provider took the message, and will not say more
	// (APNs 200, FCM 200, a Web Push service's 201). Final.
	Delivered Kind = iota
	// Accepted: the provider took the message and names it (Outcome.ID)
	// for a receipt that says later whether it reached the device.
	Accepted
	// RetryAfter: the provider did not take the message and asks for it
	// again, after Outcome.Wait when it said how long (0: the
	// dispatcher's backoff). Sending it again cannot deliver twice.
	RetryAfter
	// TokenGone: the device no longer has the app, or the token expired
	// (APNs 410, FCM UNREGISTERED). Final; the device is disabled.
	TokenGone
	// TokenInvalid: the provider does not accept the token (APNs
	// BadDeviceToken, FCM INVALID_ARGUMENT on the token). Final; the
	// device is disabled.
	TokenInvalid
	// Unknown: the request was written and no answer came (a connection
	// that died, a timeout): the provider may have taken it. Final: not
	// sent again, so that a push is delivered at most once.
	Unknown
	// Failed: the provider refused the message for a reason of its own
	// (Outcome.Reason). Final. Outcome.Credentials marks a refusal of
	// our credentials, which is an operator's alert, never the device's
	// fault.
	Failed
	// NotSent: ctx ended before the request was written. The dispatcher
	// gives the message back to the queue for another replica.
	NotSent
	// TokenForeign: the token is valid, but another app's (another Expo
	// project's, APNs DeviceTokenNotForTopic, FCM SENDER_ID_MISMATCH, a
	// browser subscribed with another VAPID key). Final; the device is
	// disabled with a reason of its own, and no one is paged: one user's
	// stray token is told apart from a deployment's wrong settings (which
	// answer so for most devices: the dispatcher's refusal guard).
	TokenForeign
)

var kindNames = [...]string{"delivered", "accepted", "retry_after", "token_gone", "token_invalid", "unknown", "failed", "not_sent", "token_foreign"}

// String is the kind's name, the value of the metrics' outcome label.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Kinds lists every kind, in order.
func Kinds() []Kind {
	out := make([]Kind, len(kindNames))
	for i := range out {
		out[i] = Kind(i)
	}
	return out
}

// Outcome is what became of one message, in the provider's words.
type Outcome struct {
	Kind Kind
	// ID is the provider's id of a message it took: APNs' apns-id, FCM's
	// message name, an Expo ticket (Accepted: the receipt's key).
	ID string
	// Wait is how long the provider asked to wait (Retry-After), for
	// RetryAfter; 0 when it did not say.
	Wait time.Duration
	// Status is the HTTP status of the provider's answer; 0 without one.
	Status int
	// Code is the provider's reason code (APNs reason, FCM error code,
	// Expo error), "" without one.
	Code string
	// Reason says why, for the delivery log: the provider's words.
	Reason string
	// Credentials: the provider refused this deployment's credentials or
	// settings (an APNs 403 but ExpiredProviderToken, a topic refused,
	// TooManyProviderTokenUpdates; an FCM 403 or a fresh access token's
	// 401; a token endpoint refusing the grant; Expo InvalidCredentials):
	// the page. Never set for one device's refusal (TokenForeign).
	Credentials bool
	// InvalidSince, for TokenGone, is when the provider last confirmed
	// the token invalid (APNs' 410 timestamp); zero when it does not say.
	// A device registered again after it is a newer token and stays on.
	InvalidSince time.Time
}

// Final reports whether the outcome ends the message's dispatch.
func (o Outcome) Final() bool { return o.Kind != RetryAfter && o.Kind != NotSent }

// Channel sends messages to one provider.
type Channel interface {
	// Provider is the provider's name: the devices' provider column and
	// the metrics' provider label ("apns", "fcm", ...).
	Provider() string
	// MaxBatch is the most messages one Send takes.
	MaxBatch() int
	// Send sends msgs and answers one outcome per message, in order.
	// It bounds its own requests in flight and is safe for concurrent
	// use; a message whose request ctx ended before is NotSent.
	Send(ctx context.Context, msgs []Message) []Outcome
}

// Spread is a channel whose messages go to services the users chose
// rather than to one provider (Web Push: each browser's push service, any
// https origin). The dispatcher sends its messages one a Send, beside its
// pass, each while holding a share of its destination's and of its user's:
// a service that stalls, or a user's devices on services they control,
// hold only their own.
type Spread interface {
	Channel
	// Destination names where m goes (an origin); "" when m's address
	// names none (its Send says why).
	Destination(m Message) string
}

// Registrar is what a channel says about the devices it reaches, checked
// when an app registers one (PUT /v1/devices) and before each send.
type Registrar interface {
	// Platforms are the device platforms the provider reaches ("ios",
	// "android").
	Platforms() []string
	// ValidToken reports whether token has the shape of the provider's
	// device tokens; tokens are opaque, so this refuses only what cannot
	// be one.
	ValidToken(token string) bool
	// Canonical is a valid token as devices are stored under it, for a
	// provider whose tokens have more than one spelling (APNs: hex, in
	// either case): the same phone registered twice, or removed, in
	// another spelling is the same device.
	Canonical(token string) string
}

type retryBudgetKey struct{}

// WithRetryBudget tells a channel that its own retries of what the
// provider did not take may go on for d from now (the pass's lease, less
// what recording takes), rather than its usual few tries. A retry starts
// only if it can end within d; a request in flight is never cut off by it.
func WithRetryBudget(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, retryBudgetKey{}, d)
}

// RetryBudget is WithRetryBudget's d, if ctx carries one.
func RetryBudget(ctx context.Context) (time.Duration, bool) {
	d, ok := ctx.Value(retryBudgetKey{}).(time.Duration)
	return d, ok
}

// All answers the same outcome for each of n messages: a request that
// carried them all failed as one.
func All(n int, o Outcome) []Outcome {
	out := make([]Outcome, n)
	for i := range out {
		out[i] = o
	}
	return out
}
