package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/jsonenc"
)

// Event is one producer event, as the relay reads it from POST /v1/events.
// Each recipient becomes its own notification.
type Event struct {
	// IdempotencyKey names the business fact this event reports. Required,
	// 1–256 bytes. The same key with the same event is answered Duplicate; the
	// same key with a different event is a ConflictError.
	IdempotencyKey string `json:"idempotency_key"`
	// Type is what happened, such as "meeting.assigned". Required, 1–128 bytes.
	Type string `json:"type"`
	// Category groups events for push preferences. Default "general".
	Category string `json:"category,omitempty"`
	// Recipients are user ids, up to 1000, each 1–256 bytes. Duplicates are
	// folded and order does not matter. An event needs recipients, topics
	// or both.
	Recipients []string `json:"recipients"`
	// Topics are up to 10 topic names: every member subscribed when the
	// event is accepted, and still subscribed when central writes theirs,
	// gets it once, however many of its topics and recipients name them.
	Topics []string `json:"topics,omitempty"`
	// Title is up to 1024 bytes; Body up to 4096.
	Title string `json:"title,omitempty"`
	Body  string `json:"body,omitempty"`
	// Data is any value that encodes to a JSON object (a map, a struct, a
	// json.RawMessage), or nil. Use json.Number or json.RawMessage for
	// numbers that must stay exact: the relay keeps them as written.
	Data any `json:"data,omitempty"`
	// RunID optionally names the run (a job, a batch) that produced the event.
	RunID string `json:"run_id,omitempty"`
	// SendAt schedules the notification: it does not exist for its
	// recipients before then. At most 30 days ahead; zero sends at once.
	SendAt time.Time `json:"send_at,omitzero"`
	// Priority is "" or "normal", or "critical": critical passes quiet hours
	// and throttles, never preferences.
	Priority string `json:"priority,omitempty"`
	// Digest gathers the pushes to one recipient with the same key within
	// the window into one push at the window's end.
	Digest *Digest `json:"digest,omitempty"`
}

// Digest is an event's digest: a key and a window of 10s to 24h. In JSON
// the window is a duration string, as the relay reads it: {"key":"chat:room42","window":"5m0s"}.
type Digest struct {
	Key    string
	Window time.Duration
}

type wireDigest struct {
	Key    string `json:"key"`
	Window string `json:"window"`
}

// MarshalJSON implements json.Marshaler.
func (d Digest) MarshalJSON() ([]byte, error) {
	return json.Marshal(wireDigest{Key: d.Key, Window: d.Window.String()})
}

// UnmarshalJSON implements json.Unmarshaler.
func (d *Digest) UnmarshalJSON(b []byte) error {
	var w wireDigest
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	window, err := time.ParseDuration(w.Window)
	if err != nil {
		return fmt.Errorf("digest window: %w", err)
	}
	*d = Digest{Key: w.Key, Window: window}
	return nil
}

// wireEvent is Event with Data already encoded, so that every attempt sends
// the same bytes.
type wireEvent struct {
	IdempotencyKey string          `json:"idempotency_key"`
	Type           string          `json:"type"`
	Category       string          `json:"category,omitempty"`
	Recipients     []string        `json:"recipients"`
	Topics         []string        `json:"topics,omitempty"`
	Title          string          `json:"title,omitempty"`
	Body           string          `json:"body,omitempty"`
	Data           json.RawMessage `json:"data,omitempty"`
	RunID          string          `json:"run_id,omitempty"`
	SendAt         string          `json:"send_at,omitempty"`
	Priority       string          `json:"priority,omitempty"`
	Digest         *Digest         `json:"digest,omitempty"`
}

// encode checks what is cheap to check here and returns the request body.
// The checks are a subset of the relay's: it stays the authority. They also
// refuse invalid UTF-8, which encoding/json would silently replace with
// U+FFFD, so that two distinct keys never become one on the wire.
func (ev Event) encode() ([]byte, error) {
	if err := ev.check(); err != nil {
		return nil, err
	}
	data, err := jsonenc.Marshal(ev.Data)
	if err != nil {
		return nil, localInvalid("data", "cannot be encoded as JSON: "+err.Error())
	}
	switch {
	case bytes.Equal(data, []byte("null")):
		data = nil
	case len(data) == 0 || data[0] != '{':
		return nil, localInvalid("data", "must encode to a JSON object")
	case !utf8.Valid(data):
		return nil, localInvalid("data", "is not valid UTF-8")
	}
	wire := wireEvent{
		IdempotencyKey: ev.IdempotencyKey, Type: ev.Type, Category: ev.Category, Recipients: ev.Recipients, Topics: ev.Topics,
		Title: ev.Title, Body: ev.Body, Data: data, RunID: ev.RunID, Priority: ev.Priority,
	}
	if !ev.SendAt.IsZero() {
		wire.SendAt = ev.SendAt.UTC().Format(time.RFC3339Nano)
	}
	wire.Digest = ev.Digest
	body, err := jsonenc.Marshal(wire)
	if err != nil {
		return nil, localInvalid("", "cannot be encoded as JSON: "+err.Error())
	}
	return body, nil
}

func (ev Event) check() error {
	for _, f := range []struct {
		name, value string
		max         int
		required    bool
	}{
		{"idempotency_key", ev.IdempotencyKey, event.MaxKeyLen, true},
		{"type", ev.Type, event.MaxTypeLen, true},
		{"category", ev.Category, event.MaxCategoryLen, false},
		{"title", ev.Title, event.MaxTitleLen, false},
		{"body", ev.Body, event.MaxBodyLen, false},
		{"run_id", ev.RunID, event.MaxRunIDLen, false},
	} {
		if err := checkText(f.name, f.value, f.max, f.required); err != nil {
			return err
		}
	}
	if strings.TrimSpace(ev.Title) == "" && strings.TrimSpace(ev.Body) == "" {
		return localInvalid("title", "is required when there is no body: a push with neither shows an empty banner")
	}
	if len(ev.Recipients) == 0 && len(ev.Topics) == 0 {
		return localInvalid("recipients", "at least one recipient or topic is required")
	}
	if len(ev.Topics) > event.MaxTopics {
		return localInvalid("topics", fmt.Sprintf("at most %d topics per event", event.MaxTopics))
	}
	for _, t := range ev.Topics {
		if !event.ValidTopic(t) {
			return localInvalid("topics", fmt.Sprintf("%q is not a topic's name: 1 to 128 of a-z, 0-9, '.', '_' and '-', the first a letter or digit", t))
		}
	}
	unique := make(map[string]struct{}, len(ev.Recipients))
	for _, r := range ev.Recipients {
		if err := checkText("recipients", r, event.MaxRecipientLen, true); err != nil {
			return err
		}
		unique[r] = struct{}{}
	}
	if len(unique) > event.MaxRecipients {
		return localInvalid("recipients", fmt.Sprintf("%d distinct recipients; at most %d per event", len(unique), event.MaxRecipients))
	}
	switch ev.Priority {
	case "", event.PriorityNormal, event.PriorityCritical:
	default:
		return localInvalid("priority", `must be "normal" or "critical"`)
	}
	if d := ev.Digest; d != nil {
		if err := checkText("digest.key", d.Key, event.MaxDigestKeyLen, true); err != nil {
			return err
		}
		if d.Window < event.MinDigestWindow || d.Window > event.MaxDigestWindow {
			return localInvalid("digest.window", fmt.Sprintf("is %s; from %s to %s", d.Window, event.MinDigestWindow, event.MaxDigestWindow))
		}
	}
	return nil
}

func checkText(field, v string, max int, required bool) error {
	switch {
	case required && strings.TrimSpace(v) == "":
		return localInvalid(field, "is required")
	case len(v) > max:
		return localInvalid(field, fmt.Sprintf("is %d bytes; at most %d", len(v), max))
	case !utf8.ValidString(v):
		return localInvalid(field, "is not valid UTF-8")
	case strings.ContainsRune(v, 0):
		return localInvalid(field, "contains a NUL character")
	}
	return nil
}

func localInvalid(field, detail string) error {
	return &InvalidEventError{Field: field, Detail: detail}
}
