package webpush

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/egress"
)

// Provider is the devices' provider name of browsers' subscriptions.
const Provider = "webpush"

// unreachableWait is how long a push to a push service that could not be
// reached waits before its one more try.
const unreachableWait = 30 * time.Second

// ChannelConfig configures a Channel.
type ChannelConfig struct {
	Sender *Sender
	// TTL is how long the push service keeps a message for a browser that
	// is offline (the TTL header); 0: DefaultTTL.
	TTL time.Duration
	// Timeout bounds each request; 0: DefaultTimeout.
	Timeout time.Duration
	// OnResult, if set, is told what each request came to and how long
	// it took (for metrics).
	OnResult func(o Outcome, took time.Duration)
	// Clock reads the time a message's Expires is measured from; nil: the
	// system's.
	Clock clock.Clock
}

// Channel is Web Push behind the channel shape: a message's Address is
// the browser's subscription. Each push service is a destination of its
// own (channel.Spread), so the dispatcher bounds the sends to each.
type Channel struct{ cfg ChannelConfig }

// NewChannel returns the channel of cfg.
func NewChannel(cfg ChannelConfig) (*Channel, error) {
	if cfg.Sender == nil {
		return nil, errors.New("web push channel: no sender")
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	cfg.Clock = clock.Or(cfg.Clock)
	return &Channel{cfg: cfg}, nil
}

// Provider is "webpush".
func (*Channel) Provider() string { return Provider }

// MaxBatch is 1: each message is a request to its own push service.
func (*Channel) MaxBatch() int { return 1 }

// Destination is the origin of the subscription's push service.
func (*Channel) Destination(m channel.Message) string {
	var sub struct {
		Endpoint string `json:"endpoint"`
	}
	if json.Unmarshal([]byte(m.Address), &sub) != nil {
		return ""
	}
	return Origin(sub.Endpoint)
}

// Origin is the origin (scheme and host) of a push endpoint; "" for none.
func Origin(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || endpoint == "" {
		return ""
	}
	return u.Scheme + "://" + strings.ToLower(u.Host)
}

// Send sends each message to its subscription's push service, in turn.
func (c *Channel) Send(ctx context.Context, msgs []channel.Message) []channel.Outcome {
	out := make([]channel.Outcome, len(msgs))
	for i, m := range msgs {
		out[i] = c.send(ctx, m)
	}
	return out
}

func (c *Channel) send(ctx context.Context, m channel.Message) channel.Outcome {
	if ctx.Err() != nil {
		return channel.Outcome{Kind: channel.NotSent, Reason: "web push: not sent: " + context.Cause(ctx).Error()}
	}
	sub, err := ParseSubscription(json.RawMessage(m.Address))
	if m.Address == "" || err != nil {
		return channel.Outcome{Kind: channel.Failed, Reason: "the subscription was removed, disabled or signed in as another user since the push was queued"}
	}
	msg := c.message(m)
	sctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	start := time.Now()
	res := c.cfg.Sender.Send(sctx, sub, msg)
	cancel()
	if c.cfg.OnResult != nil {
		c.cfg.OnResult(res.Outcome, time.Since(start))
	}
	return outcomeOf(ctx, res)
}

// outcomeOf reads a Result into the channel's vocabulary (docs/design.md,
// "What each provider's answers mean").
func outcomeOf(ctx context.Context, res Result) channel.Outcome {
	o := channel.Outcome{Status: res.Status, ID: res.MessageID}
	switch res.Outcome {
	case Delivered:
		// The push service took it: for Web Push, that is delivery (there
		// is no receipt to wait for).
		o.Kind = channel.Delivered
	case NotSent:
		switch {
		case errors.Is(res.Err, egress.ErrPrivate):
			// Resolved to a private address since it was registered:
			// refused again at every try.
			o.Kind, o.Reason = channel.Failed, fmt.Sprintf("push service refused: %v", res.Err)
		case ctx.Err() != nil:
			o.Kind, o.Reason = channel.NotSent, fmt.Sprintf("web push: not sent: %v", res.Err)
		default:
			// Unreachable (refused, DNS, TLS): once more after a pause,
			// rather than at every pass until --push-max-age.
			o.Kind, o.Wait, o.Reason = channel.RetryAfter, unreachableWait, fmt.Sprintf("push service unreachable (%v)", res.Err)
		}
	case Gone:
		o.Kind, o.Reason = channel.TokenGone, fmt.Sprintf("subscription gone (%d): the browser unsubscribed or it expired", res.Status)
	case RateLimited:
		o.Kind, o.Wait, o.Reason = channel.RetryAfter, res.RetryAfter, "push service rate limited (429)"
	case Unavailable:
		o.Kind, o.Wait, o.Reason = channel.RetryAfter, res.RetryAfter, fmt.Sprintf("push service failed (%d %s)", res.Status, res.Body)
	case Unknown:
		o.Kind, o.Reason = channel.Unknown, fmt.Sprintf("%v", res.Err)
	default: // TooLarge, Rejected, Invalid
		o.Kind = channel.Failed
		if res.Err != nil {
			o.Reason = res.Err.Error()
		} else {
			o.Reason = fmt.Sprintf("push service refused it (%d %s)", res.Status, res.Body)
		}
		if res.Outcome == Rejected && (res.Status == 401 || res.Status == 403) {
			// The subscription was made with another VAPID key (RFC 8292
			// §4.2: the key must be the one the browser subscribed with):
			// after a key change, this browser's, until it subscribes
			// again. Every browser's at once is a wrong --vapid-key-file,
			// which the dispatcher's refusal guard tells.
			o.Kind = channel.TokenForeign
		}
	}
	return o
}

// payload is what the service worker receives: what it shows, and the
// notification's id to open.
type payload struct {
	Title string         `json:"title"`
	Body  string         `json:"body"`
	Data  map[string]any `json:"data"`
}

// message is the Web Push message for m: the title and body shortened to
// fit the encrypted record (the feed keeps the whole text); urgent
// notifications are high urgency, and messages that share a collapse key
// share a Topic, so that a newer one replaces an older one undelivered.
func (c *Channel) message(m channel.Message) Message {
	ttl := c.cfg.TTL
	if !m.Expires.IsZero() {
		// Kept no longer than Expires; one already past is delivered now
		// or never (a negative TTL sends 0).
		ttl = min(ttl, clock.Until(c.cfg.Clock, m.Expires))
		if ttl < time.Second {
			ttl = -1
		}
	}
	if m.Silent {
		// The service worker gets the data alone, and shows nothing.
		body, _ := json.Marshal(m.Data)
		return Message{TTL: ttl, Urgency: UrgencyNormal, Payload: body}
	}
	p := payload{Title: m.Title, Body: m.Body, Data: map[string]any{"notification_id": m.ID, "category": m.Category}}
	for k, v := range m.Data {
		p.Data[k] = v
	}
	msg := Message{TTL: ttl, Urgency: UrgencyNormal}
	if m.Urgent {
		msg.Urgency = UrgencyHigh
	}
	if m.CollapseKey != "" {
		msg.Topic = TopicFor(m.CollapseKey)
	}
	for {
		msg.Payload, _ = json.Marshal(p)
		over := len(msg.Payload) - MaxPayload
		if over <= 0 {
			return msg
		}
		// A multi-byte rune may cost more once escaped: each cut is
		// checked again by the loop.
		switch {
		case p.Body != "":
			p.Body = channel.Shorten(p.Body, len(p.Body)-over)
		case p.Title != "":
			p.Title = channel.Shorten(p.Title, len(p.Title)-over)
		default:
			return msg // nothing left to shorten: the sender refuses it
		}
	}
}

var _ channel.Spread = (*Channel)(nil)
