// Package event is the producer's event: how it is decoded from JSON, what makes
// it valid, and its canonical form. The canonical form is what the relay hashes
// to tell a retry (same key, same request) from a conflict (same key, other
// request), and what it spools for forwarding, so two encodings of the same
// request always hash alike.
package event

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spoolcast/spoolcast/internal/jsonenc"
)

// Limits on an event's fields. They keep a notification small enough for a push
// payload and a feed row, and reject obvious mistakes (a whole user list).
const (
	MaxKeyLen       = 256
	MaxRecipients   = 1000
	MaxRecipientLen = 256
	MaxTypeLen      = 128
	MaxCategoryLen  = 128
	MaxTitleLen     = 1024
	MaxBodyLen      = 4096
	MaxRunIDLen     = 256
	MaxDigestKeyLen = 256
	// MaxTopics is how many topics one event may address.
	MaxTopics       = 10
	DefaultCategory = "general"
	// MaxScheduleAhead is how far ahead send_at may be.
	MaxScheduleAhead = 30 * 24 * time.Hour
	// MinDigestWindow and MaxDigestWindow bound a digest's window.
	MinDigestWindow  = 10 * time.Second
	MaxDigestWindow  = 24 * time.Hour
	maxDataNestLevel = 32
)

// ErrMalformed is returned for a body that is not one JSON object of the event's shape.
var ErrMalformed = errors.New("malformed event")

// ErrInvalid is returned for a well-formed event that breaks a rule (missing key, no recipients, …).
var ErrInvalid = errors.New("invalid event")

// Error tells which field is wrong and why. It wraps ErrMalformed or ErrInvalid.
type Error struct {
	Field  string
	Reason string
	kind   error
}

func (e *Error) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%v: %s", e.kind, e.Reason)
	}
	return fmt.Sprintf("%v: %s: %s", e.kind, e.Field, e.Reason)
}

func (e *Error) Unwrap() error { return e.kind }

func malformed(reason string) error { return &Error{Reason: reason, kind: ErrMalformed} }

func invalid(field, reason string) error {
	return &Error{Field: field, Reason: reason, kind: ErrInvalid}
}

// Event is one producer event. Each recipient becomes its own notification,
// and so does each member of each topic it addresses (one per user, however
// many of its topics and recipients name them).
type Event struct {
	IdempotencyKey string   `json:"idempotency_key"`
	Type           string   `json:"type"`
	Category       string   `json:"category"`
	Recipients     []string `json:"recipients"`
	// Topics name sets of users (topic names, see ValidTopic), sorted and
	// once each; members are found when central writes the event.
	Topics []string        `json:"topics,omitempty"`
	Title  string          `json:"title,omitempty"`
	Body   string          `json:"body,omitempty"`
	Data   json.RawMessage `json:"data,omitempty"`
	RunID  string          `json:"run_id,omitempty"`
	// SendAt (RFC 3339, canonically UTC) schedules the notification: it does
	// not exist for its recipients before then. Empty sends at once.
	SendAt string `json:"send_at,omitempty"`
	// Priority is "" (normal) or PriorityCritical; "normal" is canonically "".
	Priority string `json:"priority,omitempty"`
	// Digest gathers the pushes of one recipient with the same key within
	// the window into one push at the window's end.
	Digest *Digest `json:"digest,omitempty"`
}

// Priorities.
const (
	PriorityNormal   = "normal"
	PriorityCritical = "critical"
)

// Digest is an event's digest: its key and window (a Go duration, 10s to
// 24h, canonically as time.Duration.String writes it).
type Digest struct {
	Key    string `json:"key"`
	Window string `json:"window"`
}

// SendTime is when the notification is due: the zero time for at once.
func (ev Event) SendTime() time.Time {
	if ev.SendAt == "" {
		return time.Time{}
	}
	t, _ := time.Parse(time.RFC3339Nano, ev.SendAt)
	return t
}

// Critical reports whether the event bypasses quiet hours and throttles.
func (ev Event) Critical() bool { return ev.Priority == PriorityCritical }

// DigestWindow is the digest's window; 0 without a digest.
func (ev Event) DigestWindow() time.Duration {
	if ev.Digest == nil {
		return 0
	}
	d, _ := time.ParseDuration(ev.Digest.Window)
	return d
}

// CheckSchedule refuses a send_at more than MaxScheduleAhead after now. It
// is the ingress's check (with its clock), not Decode's: an event spooled
// or forwarded once accepted is not refused later.
func (ev Event) CheckSchedule(now time.Time) error {
	if t := ev.SendTime(); !t.IsZero() && t.Sub(now) > MaxScheduleAhead {
		return invalid("send_at", fmt.Sprintf("is more than %s ahead", "30 days"))
	}
	return nil
}

// CheckShown refuses an event whose notification would show nothing: no
// title and no body (or only spaces). Every notification is pushed to its
// recipients' devices, and such a push is an empty banner. A body alone is
// pushed as it is (Expo shows it under the app's name). Like CheckSchedule
// it is the ingress's check, not Decode's: an event spooled or forwarded
// once accepted is not refused later.
func (ev Event) CheckShown() error {
	if strings.TrimSpace(ev.Title) == "" && strings.TrimSpace(ev.Body) == "" {
		return invalid("title", "is required when there is no body: every notification is pushed to its recipients' devices, and a push with neither shows an empty banner")
	}
	return nil
}

// Decode reads one event from body. headerKey is the Idempotency-Key header's
// value, already unquoted ("" when absent); it fills a missing key in the body and
// must agree with a present one. The event comes back validated and canonical:
// recipients sorted and unique, data re-encoded with sorted keys, the default
// category filled in.
func Decode(body []byte, headerKey string) (Event, error) {
	// encoding/json turns invalid UTF-8 into U+FFFD, so two distinct keys
	// could become one: refuse it, naming the field, before decoding.
	if !utf8.Valid(body) {
		return Event{}, invalid(fieldAt(body, invalidUTF8At(body)), "is not valid UTF-8")
	}
	ev, ok := decodeFast(body)
	if !ok {
		var err error
		if ev, err = decodeJSON(body); err != nil {
			return Event{}, err
		}
	}
	switch {
	case headerKey != "" && ev.IdempotencyKey == "":
		ev.IdempotencyKey = headerKey
	case headerKey != "" && headerKey != ev.IdempotencyKey:
		return Event{}, invalid("idempotency_key", "the Idempotency-Key header and the body's idempotency_key differ")
	}
	if err := ev.canonicalize(); err != nil {
		return Event{}, err
	}
	return ev, nil
}

// decodeJSON reads an event body with encoding/json: any body decodeFast
// gives up on, with encoding/json's view of what is wrong.
func decodeJSON(body []byte) (Event, error) {
	var ev Event
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		return Event{}, &Error{Field: jsonErrorField(err), Reason: describeJSONError(err), kind: ErrMalformed}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Event{}, malformed("body holds more than one JSON value")
	}
	return ev, nil
}

// invalidUTF8At returns the offset of the first byte of body that is not valid UTF-8.
func invalidUTF8At(body []byte) int {
	for i := 0; i < len(body); {
		r, size := utf8.DecodeRune(body[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return len(body)
}

// fieldAt names the top-level field of the JSON object in body whose name or
// value holds offset; "" when there is none.
func fieldAt(body []byte, offset int) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return ""
		}
		name, _ := t.(string)
		var value json.RawMessage
		err = dec.Decode(&value)
		if int(dec.InputOffset()) > offset || err != nil {
			return name
		}
	}
	return ""
}

// jsonErrorField names the top-level field a decoding error is about: one of
// the wrong type, or one the event does not have; "" for a syntax error.
func jsonErrorField(err error) string {
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) {
		field, _, _ := strings.Cut(typ.Field, ".")
		return field
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if unq, err := strconv.Unquote(name); err == nil {
			return unq
		}
	}
	return ""
}

func describeJSONError(err error) string {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return fmt.Sprintf("invalid JSON at byte %d: %v", syntax.Offset, syntax)
	case errors.As(err, &typ):
		return fmt.Sprintf("field %q must be %s, not JSON %s", typ.Field, typ.Type, typ.Value)
	case errors.Is(err, io.EOF):
		return "empty body"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "truncated JSON"
	default:
		return err.Error()
	}
}

func (ev *Event) canonicalize() error {
	ev.Category = strings.TrimSpace(ev.Category)
	if ev.Category == "" {
		ev.Category = DefaultCategory
	}
	ev.Recipients = slices.Compact(slices.Sorted(slices.Values(ev.Recipients)))
	ev.Topics = sortedTopics(ev.Topics)
	if err := ev.check(); err != nil {
		return err
	}
	if ev.SendAt != "" {
		t, _ := time.Parse(time.RFC3339Nano, ev.SendAt) // check parsed it
		ev.SendAt = t.UTC().Format(time.RFC3339Nano)
	}
	if ev.Priority == PriorityNormal {
		ev.Priority = ""
	}
	if ev.Digest != nil {
		ev.Digest.Window = ev.DigestWindow().String()
	}
	data, err := canonicalData(ev.Data)
	if err != nil {
		return err
	}
	ev.Data = data
	return nil
}

// check applies the rules on every field but data's content.
func (ev *Event) check() error {
	for _, f := range []struct {
		name, value string
		max         int
		required    bool
	}{
		{"idempotency_key", ev.IdempotencyKey, MaxKeyLen, true},
		{"type", ev.Type, MaxTypeLen, true},
		{"category", ev.Category, MaxCategoryLen, true},
		{"title", ev.Title, MaxTitleLen, false},
		{"body", ev.Body, MaxBodyLen, false},
		{"run_id", ev.RunID, MaxRunIDLen, false},
	} {
		if err := checkText(f.name, f.value, f.max, f.required); err != nil {
			return err
		}
	}
	if len(ev.Recipients) == 0 && len(ev.Topics) == 0 {
		return invalid("recipients", "at least one recipient or topic is required")
	}
	if len(ev.Recipients) > MaxRecipients {
		return invalid("recipients", fmt.Sprintf("at most %d recipients per event", MaxRecipients))
	}
	for _, r := range ev.Recipients {
		if err := checkText("recipients", r, MaxRecipientLen, true); err != nil {
			return err
		}
	}
	if len(ev.Topics) > MaxTopics {
		return invalid("topics", fmt.Sprintf("at most %d topics per event", MaxTopics))
	}
	for _, t := range ev.Topics {
		if !ValidTopic(t) {
			return invalid("topics", fmt.Sprintf("%.140q is not a topic's name: 1 to 128 of a-z, 0-9, '.', '_' and '-', the first a letter or digit", t))
		}
	}
	return ev.checkPolicy()
}

// sortedTopics is topics sorted and once each; nil for none, so that an
// empty list and an absent one encode alike (absent).
func sortedTopics(topics []string) []string {
	if len(topics) == 0 {
		return nil
	}
	return slices.Compact(slices.Sorted(slices.Values(topics)))
}

// ValidTopic reports whether name is a topic's name: 1 to 128 of a-z, 0-9,
// '.', '_' and '-', the first a letter or digit (so that no name is a
// path's dot segment, which URLs collapse).
func ValidTopic(name string) bool {
	if len(name) == 0 || len(name) > 128 {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// CheckKey checks an idempotency key given apart from an event (a
// cancellation's path): the rules of the event's idempotency_key.
func CheckKey(key string) error {
	return checkText("idempotency_key", key, MaxKeyLen, true)
}

// checkPolicy checks the delivery policy fields: send_at, priority, digest.
func (ev *Event) checkPolicy() error {
	if ev.SendAt != "" {
		t, err := time.Parse(time.RFC3339Nano, ev.SendAt)
		if err != nil || t.Year() < 2000 || t.Year() > 9999 {
			return invalid("send_at", "must be an RFC 3339 time, such as 2026-12-24T18:00:00Z")
		}
	}
	switch ev.Priority {
	case "", PriorityNormal, PriorityCritical:
	default:
		return invalid("priority", `must be "normal" or "critical"`)
	}
	if ev.Digest != nil {
		if err := checkText("digest.key", ev.Digest.Key, MaxDigestKeyLen, true); err != nil {
			return err
		}
		d, err := time.ParseDuration(ev.Digest.Window)
		if err != nil || d < MinDigestWindow || d > MaxDigestWindow {
			return invalid("digest.window", "must be a duration from 10s to 24h, such as \"5m\"")
		}
	}
	return nil
}

func checkText(field, v string, max int, required bool) error {
	switch {
	case required && strings.TrimSpace(v) == "":
		return invalid(field, "is required")
	case len(v) > max:
		return invalid(field, fmt.Sprintf("is longer than %d bytes", max))
	case !utf8.ValidString(v):
		return invalid(field, "is not valid UTF-8")
	case strings.ContainsRune(v, 0):
		return invalid(field, "contains a NUL character")
	}
	return nil
}

// canonicalData re-encodes data as an object with sorted keys and numbers kept
// exactly as written. null and absent both become absent.
func canonicalData(raw json.RawMessage) (json.RawMessage, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return nil, nil
	}
	if trimmed[0] != '{' {
		return nil, invalid("data", "must be a JSON object")
	}
	if out, ok := canonicalDataFast(trimmed); ok {
		return out, nil
	}
	return canonicalDataJSON(trimmed)
}

// canonicalDataJSON is canonicalData through encoding/json: for data
// canonicalDataFast gives up on, with encoding/json's view of what is wrong.
func canonicalDataJSON(trimmed []byte) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.UseNumber()
	var v map[string]any
	if err := dec.Decode(&v); err != nil {
		return nil, malformed("data: " + err.Error())
	}
	if depth(v, 0) > maxDataNestLevel {
		return nil, invalid("data", fmt.Sprintf("nests deeper than %d levels", maxDataNestLevel))
	}
	if err := storable(v); err != nil {
		return nil, err
	}
	out, err := jsonenc.Marshal(v)
	if err != nil {
		return nil, invalid("data", err.Error())
	}
	return out, nil
}

// maxDataExponent bounds the exponent of numbers in data. Postgres jsonb holds
// numbers as numeric and refuses ones with huge exponents; an event the relay
// accepts must be one Postgres will store.
const maxDataExponent = 1000

// storable rejects what JSON allows but Postgres jsonb refuses: the NUL
// character (\u0000) in a key or string, and numbers beyond numeric's range.
func storable(v any) error {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			if strings.ContainsRune(k, 0) {
				return invalid("data", "a key contains the NUL character")
			}
			if err := storable(x); err != nil {
				return err
			}
		}
	case []any:
		for _, x := range t {
			if err := storable(x); err != nil {
				return err
			}
		}
	case string:
		if strings.ContainsRune(t, 0) {
			return invalid("data", "a string contains the NUL character")
		}
	case json.Number:
		if len(t) > 1000 {
			return invalid("data", "a number is longer than 1000 digits")
		}
		if !storableNumber(string(t)) {
			return invalid("data", fmt.Sprintf("the number %s is out of range", t))
		}
	}
	return nil
}

// storableNumber reports whether Postgres's numeric holds the JSON number s:
// at most 1000 characters, an exponent within ±maxDataExponent.
func storableNumber(s string) bool {
	if len(s) > 1000 {
		return false
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		exp, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
		if err != nil || exp > maxDataExponent || exp < -maxDataExponent {
			return false
		}
	}
	return true
}

func depth(v any, d int) int {
	best := d
	switch t := v.(type) {
	case map[string]any:
		for _, x := range t {
			best = max(best, depth(x, d+1))
		}
	case []any:
		for _, x := range t {
			best = max(best, depth(x, d+1))
		}
	}
	return best
}

// Canonical returns the event's canonical JSON encoding. For a decoded event it
// is stable: the same request always yields the same bytes.
func (ev Event) Canonical() []byte {
	b, err := ev.appendCanonical(make([]byte, 0, 256))
	if err != nil {
		// Every field of a decoded event is plain text or already-valid JSON.
		panic(fmt.Sprintf("event: canonical encoding: %v", err))
	}
	return b
}

// Hash is the SHA-256 of the canonical encoding: equal for retries of the same request.
func (ev Event) Hash() []byte { return HashCanonical(ev.Canonical()) }

// HashCanonical is Hash for an encoding already made by Canonical.
func HashCanonical(canonical []byte) []byte {
	sum := sha256.Sum256(canonical)
	return sum[:]
}

// Parse reads an event back from its canonical encoding, as spooled, and
// checks it again: a payload written by another version of the relay, or
// damaged on disk, that breaks a rule (no recipients, an unknown field, data
// that is not an object) is an error wrapping ErrMalformed or ErrInvalid.
// Data is taken as it is, not re-encoded.
func Parse(canonical []byte) (Event, error) {
	ev, ok := Event{}, false
	if utf8.Valid(canonical) {
		ev, ok = decodeFast(canonical)
	}
	if !ok {
		var err error
		if ev, err = decodeJSON(canonical); err != nil {
			return Event{}, fmt.Errorf("spooled event: %w", err)
		}
	}
	ev.Recipients = slices.Compact(slices.Sorted(slices.Values(ev.Recipients)))
	ev.Topics = sortedTopics(ev.Topics)
	if err := ev.check(); err != nil {
		return Event{}, err
	}
	switch data := bytes.TrimSpace(ev.Data); {
	case len(data) == 0 || bytes.Equal(data, []byte("null")):
		ev.Data = nil
	case data[0] != '{':
		return Event{}, invalid("data", "must be a JSON object")
	}
	return ev, nil
}
