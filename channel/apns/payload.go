package apns

import (
	"encoding/json"
	"fmt"

	"github.com/sideshow/apns2"
	"github.com/sideshow/apns2/payload"

	"github.com/spoolcast/spoolcast/channel"
)

// APNs' limits.
const (
	maxPayload    = 4096 // bytes of JSON, for an alert
	maxCollapseID = 64   // bytes
)

// notification is m as APNs takes it, or the outcome of a message that
// cannot be sent as it is.
func (c *Channel) notification(m channel.Message) (*apns2.Notification, *channel.Outcome) {
	body, err := encodePayload(m)
	if err != nil {
		o := channel.Outcome{Kind: channel.Failed, Reason: "APNs payload: " + err.Error()}
		if err == errTooLarge {
			o.Code = apns2.ReasonPayloadTooLarge
		}
		return nil, &o
	}
	n := &apns2.Notification{
		DeviceToken: m.Token,
		Topic:       c.topic,
		CollapseID:  collapseID(m),
		PushType:    apns2.PushTypeAlert,
		Priority:    apns2.PriorityLow,
		Expiration:  m.Expires,
		Payload:     body,
	}
	switch {
	case m.Silent:
		// A background push: APNs requires priority 5 and no alert.
		n.PushType, n.CollapseID = apns2.PushTypeBackground, ""
	case m.Urgent:
		n.Priority = apns2.PriorityHigh
	}
	if n.Expiration.IsZero() {
		n.Expiration = c.clock.Now().Add(c.expiration)
	}
	return n, nil
}

// collapseID is m's collapse id within APNs' 64 bytes: a longer one is
// sent as its SHA-256 in hex, 64 bytes, the same on every resend.
func collapseID(m channel.Message) string { return channel.ShortID(m.Collapse(), maxCollapseID) }

var errTooLarge = fmt.Errorf("over %d bytes even with the title and body cut: the data is too large", maxPayload)

// encodePayload is m's payload:
//
//	{"aps": {"alert": {"title", "body"}, "sound": "default"},
//	 "id": m.ID, "category": m.Category, m.Data's keys...}
//
// with the body, then the title, cut to fit APNs' 4096 bytes. Data cannot
// replace aps or id, nor category when there is one.
func encodePayload(m channel.Message) ([]byte, error) {
	if m.Silent {
		// {"aps": {"content-available": 1}, m.Data's keys...}
		p := payload.NewPayload().ContentAvailable()
		for k, v := range m.Data {
			if k != "aps" {
				p.Custom(k, v)
			}
		}
		b, err := json.Marshal(p)
		if err == nil && len(b) > maxPayload {
			return nil, errTooLarge
		}
		return b, err
	}
	encode := func(title, body string) ([]byte, error) {
		p := payload.NewPayload()
		for k, v := range m.Data {
			if k != "aps" { // the builder keeps its own aps there
				p.Custom(k, v)
			}
		}
		p.Custom("id", m.ID)
		if m.Category != "" {
			p.Custom("category", m.Category)
		}
		return json.Marshal(p.AlertTitle(title).AlertBody(body).Sound("default"))
	}
	whole, err := encode(m.Title, m.Body)
	if err != nil || len(whole) <= maxPayload {
		return whole, err
	}
	// The title says what it is about: cut the body first.
	b, err := fit(m.Body, func(body string) ([]byte, error) { return encode(m.Title, body) })
	if b != nil || err != nil {
		return b, err
	}
	b, err = fit(m.Title, func(title string) ([]byte, error) { return encode(title, "") })
	if b != nil || err != nil {
		return b, err
	}
	return nil, errTooLarge
}

// fit is the payload of the longest cut of s (a prefix on a rune boundary,
// ended with "…") whose payload fits, nil if none does. JSON escapes
// make the size no simple function of the cut, but it grows with it: a
// binary search.
func fit(s string, encode func(string) ([]byte, error)) ([]byte, error) {
	runes := []rune(s)
	var best []byte
	lo, hi := 0, len(runes)-1 // runes kept; all of them is the uncut s
	for lo <= hi {
		mid := (lo + hi) / 2
		b, err := encode(string(runes[:mid]) + "…")
		switch {
		case err != nil:
			return nil, err
		case len(b) <= maxPayload:
			best, lo = b, mid+1
		default:
			hi = mid - 1
		}
	}
	return best, nil
}
