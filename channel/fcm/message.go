package fcm

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/internal/jsonenc"

	"github.com/spoolcast/spoolcast/channel"
)

const (
	// maxPayload is FCM's limit on a message's notification and data
	// (https://firebase.google.com/docs/reference/fcm/rest/v1/ErrorCode,
	// "Message too big").
	maxPayload = 4096
	// payloadBudget is what a message's notification and data may take,
	// as JSON: maxPayload less what FCM adds on its way through APNs (the
	// aps wrapper, gcm.message_id, the google.c.* keys: about 200 bytes),
	// so that the iPhone's payload is under APNs' 4096 bytes too.
	payloadBudget = maxPayload - 256
	// maxTTL is the longest TTL FCM keeps a message: four weeks.
	maxTTL = 28 * 24 * time.Hour
	// maxAPNsCollapseID is APNs' limit on apns-collapse-id, in bytes.
	maxAPNsCollapseID = 64
)

// The body of a send, v1's Message as much of it as spoolcast sends
// (https://firebase.google.com/docs/reference/fcm/rest/v1/projects.messages).
type (
	sendRequest struct {
		Message message `json:"message"`
	}
	message struct {
		Token        string            `json:"token"`
		Notification *notification     `json:"notification,omitempty"`
		Data         map[string]string `json:"data"`
		Android      androidConfig     `json:"android"`
		APNs         apnsConfig        `json:"apns"`
	}
	notification struct {
		Title string `json:"title,omitempty"`
		Body  string `json:"body,omitempty"`
	}
	androidConfig struct {
		CollapseKey  string               `json:"collapse_key,omitempty"`
		Priority     string               `json:"priority"`
		TTL          string               `json:"ttl"`
		Notification *androidNotification `json:"notification,omitempty"`
	}
	androidNotification struct {
		// Tag replaces a banner of the same tag still in the drawer:
		// collapse_key only collapses messages FCM still holds.
		Tag string `json:"tag,omitempty"`
	}
	apnsConfig struct {
		Headers map[string]string `json:"headers"`
		// Payload is sent for a silent message only: an iPhone wakes its
		// app for a data-only message only with content-available.
		Payload *apnsPayload `json:"payload,omitempty"`
	}
	apnsPayload struct {
		APS struct {
			ContentAvailable int `json:"content-available"`
		} `json:"aps"`
	}
)

// body is m's send request. It errs only on data that does not encode as
// JSON: a message that can never be sent.
func (c *Channel) body(m channel.Message) ([]byte, error) {
	now := c.cfg.Clock.Now()
	expires := m.Expires
	if expires.IsZero() {
		expires = now.Add(c.cfg.DefaultTTL)
	}
	// Whole seconds, rounded down: FCM never keeps it past Expires.
	ttl := min(max(0, expires.Sub(now)), maxTTL).Truncate(time.Second)

	data := make(map[string]string, len(m.Data)+2)
	for k, v := range m.Data {
		if reservedKey(k) {
			continue // FCM refuses the whole message for one such key
		}
		s, ok := v.(string)
		if !ok { // FCM's data values are strings only
			b, err := marshal(v)
			if err != nil {
				return nil, fmt.Errorf("data %q: %w", k, err)
			}
			s = string(b)
		}
		data[k] = s
	}
	if m.ID != "" {
		data["id"] = m.ID
	}
	if m.Category != "" {
		data["category"] = m.Category
	}

	collapse := m.Collapse()
	if m.Silent {
		collapse = "" // a background message replaces nothing
	}
	msg := message{
		Token: m.Token,
		Data:  data,
		Android: androidConfig{
			CollapseKey: collapse,
			Priority:    "NORMAL",
			TTL:         strconv.FormatInt(int64(ttl/time.Second), 10) + "s",
		},
		APNs: apnsConfig{Headers: map[string]string{"apns-priority": "5", "apns-expiration": "0"}},
	}
	switch {
	case m.Silent:
		// Data only, normal priority; APNs takes it as a background push.
		msg.APNs.Headers["apns-push-type"] = "background"
		msg.APNs.Payload = &apnsPayload{}
		msg.APNs.Payload.APS.ContentAvailable = 1
	case m.Urgent:
		msg.Android.Priority, msg.APNs.Headers["apns-priority"] = "HIGH", "10"
	}
	// The android TTL's counterpart, which APNs reads from its own header.
	if ttl > 0 {
		msg.APNs.Headers["apns-expiration"] = strconv.FormatInt(now.Add(ttl).Unix(), 10)
	}
	if collapse != "" {
		msg.APNs.Headers["apns-collapse-id"] = apnsCollapseID(collapse)
	}
	if !m.Silent && (m.Title != "" || m.Body != "") {
		msg.Notification = &notification{Title: m.Title, Body: m.Body}
		fit(msg.Notification, data)
		if collapse != "" {
			msg.Android.Notification = &androidNotification{Tag: collapse}
		}
	}
	return marshal(sendRequest{Message: msg})
}

// fit shortens n's body, then its title, until n and data are within
// payloadBudget. Data alone over it is sent as it is, for FCM to judge.
func fit(n *notification, data map[string]string) {
	if jsonBound(n, data) <= payloadBudget {
		return // the common case, measured without encoding
	}
	dataLen := len(mustMarshal(data))
	for range 4 {
		over := len(mustMarshal(n)) + dataLen - payloadBudget
		switch {
		case over <= 0:
			return
		case n.Body != "":
			n.Body = channel.Shorten(n.Body, len(n.Body)-over)
		case n.Title != "":
			n.Title = channel.Shorten(n.Title, len(n.Title)-over)
		default:
			return
		}
	}
}

// jsonBound is at least the JSON length of n and data: a byte of a string
// takes at most 6 once escaped (\u00XX), and each string its quotes, its
// separator and, for a key, its colon.
func jsonBound(n *notification, data map[string]string) int {
	total := 6*(len(n.Title)+len(n.Body)) + 40
	for k, v := range data {
		total += 6*(len(k)+len(v)) + 6
	}
	return total + 2
}

// reservedKey reports whether FCM keeps a data key for itself ("from",
// "message_type", any beginning "google" or "gcm") and refuses a message
// that has it.
func reservedKey(k string) bool {
	k = strings.ToLower(k)
	return k == "from" || k == "message_type" || strings.HasPrefix(k, "google") || strings.HasPrefix(k, "gcm")
}

// apnsCollapseID is collapse within APNs' 64 bytes.
func apnsCollapseID(collapse string) string { return channel.ShortID(collapse, maxAPNsCollapseID) }

// marshal is JSON without HTML escaping: the body is smaller, and the
// size fit measures is the size sent.
func marshal(v any) ([]byte, error) { return jsonenc.Marshal(v) }

func mustMarshal(v any) []byte {
	b, err := marshal(v)
	if err != nil {
		panic(err) // strings and maps of strings always encode
	}
	return b
}
