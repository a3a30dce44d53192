package expo

// This file puts Expo behind the channel shape: a batch of at most 100
// messages is one request, and each ticket, or the request's failure, is
// one outcome per message from the channels' vocabulary.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/internal/clock"
)

// Provider is Expo's name among the channels.
const Provider = "expo"

// Results of a message sent, for ChannelConfig.OnResult.
const (
	ResultOK     = "ok"     // a ticket: Expo took it (its receipt says the rest)
	ResultError  = "error"  // a ticket with an error
	ResultFailed = "failed" // the request failed, or the message was refused before sending
)

// Sender sends one request of messages: a *Client.
type Sender interface {
	Send(ctx context.Context, msgs []Message) ([]Ticket, error)
}

// ChannelConfig configures a Channel.
type ChannelConfig struct {
	// Sender sends the requests. Required.
	Sender Sender
	// OnResult, when set, hears of each message's result (ResultOK, …).
	OnResult func(result string)
	// TTL is how long a message whose Expires is zero is kept for a
	// device that is offline (Expo's ttl). Default DefaultTTL, 24h: the
	// life APNs and FCM direct give a push.
	TTL time.Duration
	// Clock reads the time a message's Expires is measured from; nil: the
	// wall clock.
	Clock clock.Clock
	// Experience is this app's Expo project, "@owner/slug"
	// (--expo-experience). When a request mixes tokens of several projects
	// (PUSH_TOO_MANY_EXPERIENCE_IDS), its messages are sent again on
	// their own and the others' tokens are TokenForeign. "": the project
	// holding most of the request's tokens is taken for this app's.
	Experience string
}

// DefaultTTL is ChannelConfig.TTL's default.
const DefaultTTL = 24 * time.Hour

// Channel is Expo behind the channel shape. Expo answers a message it
// took with a ticket (Accepted: its receipt, fetched later, says whether
// it was delivered). Expo's documentation asks for a network error, a 429
// and a 5xx to be retried with backoff: RetryAfter, as is a ticket
// MessageRateExceeded (too many to the device), after a minute. A ticket
// DeviceNotRegistered is TokenGone, MismatchSenderId TokenForeign (the
// device's FCM sender is another app's), InvalidCredentials Failed with
// Credentials (the project's credentials Expo holds); a request written whole without a
// usable answer is Unknown (Expo has no idempotency key); a request that
// never reached Expo whole because ctx ended is NotSent.
type Channel struct {
	cfg ChannelConfig
}

// NewChannel returns Expo's channel.
func NewChannel(cfg ChannelConfig) (*Channel, error) {
	if cfg.Sender == nil {
		return nil, errors.New("expo: a channel needs a sender")
	}
	if cfg.TTL < 0 {
		return nil, errors.New("expo: the TTL must not be negative")
	}
	cfg.TTL = cmp.Or(cfg.TTL, DefaultTTL)
	cfg.Clock = clock.Or(cfg.Clock)
	return &Channel{cfg: cfg}, nil
}

// RateExceededWait is how long a message whose ticket said
// MessageRateExceeded waits: Expo asks for such messages to be retried
// slowly.
const RateExceededWait = time.Minute

var tokenShape = regexp.MustCompile(`^(?:ExponentPushToken|ExpoPushToken)\[[A-Za-z0-9_-]{1,256}\]$`)

// ValidToken reports whether token has the shape of an Expo push token:
// ExponentPushToken[…] or ExpoPushToken[…].
func ValidToken(token string) bool { return tokenShape.MatchString(token) }

// Provider is "expo".
func (*Channel) Provider() string { return Provider }

// MaxBatch is MaxMessagesPerSend: one request.
func (*Channel) MaxBatch() int { return MaxMessagesPerSend }

// Platforms: Expo reaches iOS and Android apps built with it.
func (*Channel) Platforms() []string { return []string{"ios", "android"} }

// ValidToken reports whether token is an Expo push token.
func (*Channel) ValidToken(token string) bool { return ValidToken(token) }

// Canonical is token as it is: Expo's tokens have one spelling.
func (*Channel) Canonical(token string) string { return token }

var _ channel.Registrar = (*Channel)(nil)

// Send sends msgs (at most MaxMessagesPerSend) in one request.
func (c *Channel) Send(ctx context.Context, msgs []channel.Message) []channel.Outcome {
	out := make([]channel.Outcome, len(msgs))
	if len(msgs) == 0 {
		return out
	}
	req := make([]Message, len(msgs))
	now := c.cfg.Clock.Now()
	for i, m := range msgs {
		msg := fromChannel(m)
		msg.TTL = c.ttl(m, now) // before Fit: it counts toward the size
		req[i] = Fit(msg)
	}
	if d, ok := channel.RetryBudget(ctx); ok {
		ctx = RetryFor(ctx, d) // the client's own retries, bounded by the pass's lease
	}
	tickets, err := c.cfg.Sender.Send(ctx, req)
	var re *RequestError
	if errors.As(err, &re) && re.Code == TooManyExperiences && len(re.Experiences) > 1 {
		return c.sendOwnProject(ctx, msgs, re)
	}
	var whole channel.Outcome
	switch {
	case err == nil && len(tickets) != len(msgs):
		whole = channel.Outcome{Kind: channel.Unknown, Reason: fmt.Sprintf("expo: %d tickets for %d messages", len(tickets), len(msgs))}
	case err == nil:
	case errors.Is(err, ErrNotSent):
		whole = channel.Outcome{Kind: channel.NotSent, Reason: err.Error()}
	case errors.As(err, &re) && re.Unknown:
		whole = channel.Outcome{Kind: channel.Unknown, Status: re.Status, Code: re.Code, Reason: err.Error()}
	case errors.As(err, &re) && re.Retryable():
		whole = channel.Outcome{Kind: channel.RetryAfter, Wait: re.RetryAfter, Status: re.Status, Code: re.Code, Reason: err.Error()}
	case errors.As(err, &re):
		whole = channel.Outcome{Kind: channel.Failed, Status: re.Status, Code: re.Code, Reason: err.Error(),
			Credentials: re.Code == "InvalidCredentials" || re.Status == 401 || re.Status == 403}
	default:
		whole = channel.Outcome{Kind: channel.Failed, Reason: err.Error()}
	}
	if err != nil || len(tickets) != len(msgs) {
		for i := range out {
			out[i] = whole
		}
		if whole.Kind != channel.NotSent && whole.Kind != channel.RetryAfter {
			c.count(ResultFailed, len(msgs))
		}
		return out
	}
	for i, t := range tickets {
		if t.Status == "ok" {
			out[i] = channel.Outcome{Kind: channel.Accepted, ID: t.ID, Status: 200}
			c.count(ResultOK, 1)
			continue
		}
		c.count(ResultError, 1)
		o := channel.Outcome{Kind: channel.Failed, Status: 200, Code: t.Code(), Reason: strings.TrimSpace(t.Code() + ": " + t.Message)}
		switch t.Code() {
		case DeviceNotRegistered:
			o.Kind = channel.TokenGone
		case MessageRateExceeded:
			o.Kind, o.Wait = channel.RetryAfter, RateExceededWait
		case MismatchSenderID:
			// One device's: disabled. Every Android device's at once is the
			// project's FCM credentials, which the dispatcher's guard tells.
			o.Kind = channel.TokenForeign
		case InvalidCredentials:
			o.Credentials = true
		}
		out[i] = o
	}
	return out
}

// sendOwnProject answers a request Expo refused for mixing the tokens of
// several projects, which it took none of: the messages to tokens of this
// app's project are sent again in a request of their own, and the others
// are TokenForeign, so that one stray token never fails everyone's batch.
// A token the details do not name is sent with this app's.
func (c *Channel) sendOwnProject(ctx context.Context, msgs []channel.Message, re *RequestError) []channel.Outcome {
	project := map[string]string{} // token → its project, as the details say
	for name, tokens := range re.Experiences {
		for _, t := range tokens {
			project[t] = name
		}
	}
	own := c.ownProject(msgs, project)
	out := make([]channel.Outcome, len(msgs))
	var again []channel.Message
	var at []int
	for i, m := range msgs {
		if p, named := project[m.Token]; named && p != own {
			out[i] = channel.Outcome{Kind: channel.TokenForeign, Status: re.Status, Code: TooManyExperiences,
				Reason: fmt.Sprintf("expo: the token belongs to Expo project %s, not this app's (%s)", p, own)}
			c.count(ResultFailed, 1)
			continue
		}
		again, at = append(again, m), append(at, i)
	}
	if len(again) == len(msgs) {
		// Nothing to take out: the same request would be refused again.
		for i := range out {
			out[i] = channel.Outcome{Kind: channel.Failed, Status: re.Status, Code: re.Code, Reason: re.Error()}
		}
		c.count(ResultFailed, len(msgs))
		return out
	}
	for j, o := range c.Send(ctx, again) {
		out[at[j]] = o
	}
	return out
}

// ownProject is this app's project: the configured one, else the one
// holding most of msgs' tokens (of a tie, the one that got there first).
func (c *Channel) ownProject(msgs []channel.Message, project map[string]string) string {
	if c.cfg.Experience != "" {
		return c.cfg.Experience
	}
	count := map[string]int{}
	best := ""
	for _, m := range msgs {
		p, named := project[m.Token]
		if !named {
			continue
		}
		count[p]++
		if best == "" || count[p] > count[best] {
			best = p
		}
	}
	return best
}

// ttl is m's life in seconds: until its Expires, to the nearest second (a
// clear made an hour from now is 3,600 however long the pass took to send
// it; 0 when it has passed), else the channel's TTL.
func (c *Channel) ttl(m channel.Message, now time.Time) *int {
	life := c.cfg.TTL
	if !m.Expires.IsZero() {
		life = max(0, m.Expires.Sub(now))
	}
	seconds := int(life.Round(time.Second) / time.Second)
	return &seconds
}

func (c *Channel) count(result string, n int) {
	if c.cfg.OnResult != nil {
		for range n {
			c.cfg.OnResult(result)
		}
	}
}

// fromChannel is Expo's message for m: the notification's id and category
// as data (notification_id, as apps built with Expo read it), and high
// priority for an urgent one.
func fromChannel(m channel.Message) Message {
	if m.Silent {
		// Data only, to wake the app: no title, body or sound.
		return Message{To: m.Token, Priority: "normal", ContentAvailable: true, Data: m.Data}
	}
	msg := Message{To: m.Token, Title: m.Title, Body: m.Body, Sound: "default",
		Data: map[string]any{"notification_id": m.ID, "category": m.Category}}
	for k, v := range m.Data {
		msg.Data[k] = v
	}
	if m.Urgent {
		msg.Priority = "high"
	}
	return msg
}

// Fit shortens m's body, then its title, to fit MaxMessageBytes (the feed
// keeps the whole text), cutting at a rune boundary and marking the cut;
// a message with nothing left to shorten is returned as it is, for the
// client to refuse as too big.
func Fit(m Message) Message {
	for size, _ := Size(m); size > MaxMessageBytes; size, _ = Size(m) {
		over := size - MaxMessageBytes
		switch {
		case len(m.Body) > 0:
			m.Body = channel.Shorten(m.Body, len(m.Body)-over)
		case len(m.Title) > 0:
			m.Title = channel.Shorten(m.Title, len(m.Title)-over)
		default:
			return m
		}
	}
	return m
}
