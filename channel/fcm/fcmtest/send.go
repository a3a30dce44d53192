package fcmtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Message is a message the fake FCM took.
type Message struct {
	// Name is FCM's name for it, its answer: projects/P/messages/ID.
	Name string
	// Bearer is the access token it came with.
	Bearer       string
	Token        string
	Notification *Notification
	Data         map[string]string
	Android      Android
	APNs         APNs
	// Body is the request's body as it came.
	Body []byte

	validateOnly bool // FCM checks it, answers, and sends nothing
}

// Notification is the message's notification, what the banner shows.
type Notification struct {
	Title string `json:"title"`
	Body  string `json:"body"`
}

// Android is the message's android config.
type Android struct {
	CollapseKey  string               `json:"collapse_key"`
	Priority     string               `json:"priority"`
	TTL          string               `json:"ttl"`
	Notification *AndroidNotification `json:"notification"`
}

// AndroidNotification is the android config's notification.
type AndroidNotification struct {
	Tag string `json:"tag"`
}

// APNs is the message's apns config.
type APNs struct {
	Headers map[string]string `json:"headers"`
	// Payload is the APNs payload FCM merges into what it sends an
	// iPhone (aps.content-available for a background message).
	Payload map[string]any `json:"payload"`
}

// MaxPayload is FCM's limit on a message's payload: its notification's
// and data's keys and values, in bytes.
const MaxPayload = 4096

var ttlPattern = regexp.MustCompile(`^[0-9]+(\.[0-9]{1,9})?s$`)

// serveSend is POST /v1/projects/{project}/messages:send.
func (s *Server) serveSend(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests++
	s.inFlight++
	s.maxInFlight = max(s.maxInFlight, s.inFlight)
	s.mu.Unlock()
	defer func() { s.mu.Lock(); s.inFlight--; s.mu.Unlock() }()

	project, ok := strings.CutPrefix(r.URL.Path, "/v1/projects/")
	if project, ok = strings.CutSuffix(project, "/messages:send"); !ok || r.Method != http.MethodPost || strings.Contains(project, "/") {
		Error{Code: 404, Status: "NOT_FOUND", Message: "The requested URL " + r.URL.Path + " was not found."}.write(w)
		return
	}
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	s.mu.Lock()
	expires, known := s.issued[bearer]
	if !known || !time.Now().Before(expires) {
		s.badBearers++
		s.mu.Unlock()
		Unauthenticated.write(w)
		return
	}
	s.mu.Unlock()
	if project != s.project {
		PermissionDenied.write(w)
		return
	}
	// The whole body is read before any answer, so that a dropped
	// connection always drops a request written whole.
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err != nil {
		return
	}
	m, refusal := parse(body)
	if refusal != nil {
		refusal.write(w)
		return
	}
	m.Bearer = bearer
	if m.validateOnly {
		writeJSON(w, http.StatusOK, map[string]string{"name": "projects/" + s.project + "/messages/fake_message_id"})
		return
	}

	s.mu.Lock()
	var answer *Error
	drop := false
	switch {
	case s.answerAfter > 0:
		s.answerAfter--
	case s.drop > 0:
		s.drop--
		s.dropped++
		drop = true
	}
	if e, ok := s.tokenErrors[m.Token]; ok && !drop {
		answer = &e
	}
	if len(s.next) > 0 && !drop {
		answer = &s.next[0]
		s.next = s.next[1:]
	}
	if answer == nil {
		s.seq++
		m.Name = fmt.Sprintf("projects/%s/messages/0:%d", s.project, s.seq)
		s.messages = append(s.messages, m)
	}
	onMessage, delay, cutting := s.onMessage, s.delay, s.cut
	s.mu.Unlock()

	if answer != nil {
		answer.write(w)
		return
	}
	if onMessage != nil {
		onMessage(m)
	}
	if cut := s.wait(r.Context(), delay, cutting); cut || drop {
		if cut && !drop {
			s.mu.Lock()
			s.dropped++
			s.mu.Unlock()
		}
		panic(http.ErrAbortHandler) // closes the connection, no answer written
	}
	writeJSON(w, http.StatusOK, map[string]string{"name": m.Name})
}

// parse reads a send request, refusing what FCM refuses: unknown fields,
// no token, data values that are not strings, data keys FCM keeps for
// itself, a bad TTL or priority, a payload over MaxPayload. It also
// refuses a message without android.collapse_key, which FCM takes but
// spoolcast never sends.
func parse(body []byte) (Message, *Error) {
	var req struct {
		Message *struct {
			Token        string         `json:"token"`
			Notification *Notification  `json:"notification"`
			Data         map[string]any `json:"data"`
			Android      *Android       `json:"android"`
			APNs         *APNs          `json:"apns"`
		} `json:"message"`
		ValidateOnly bool `json:"validate_only"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Message{}, &Error{Code: 400, Status: "INVALID_ARGUMENT", Message: "Invalid JSON payload received. " + err.Error()}
	}
	wire := req.Message
	if wire == nil {
		return Message{}, invalid("message", "Request contains an invalid argument.")
	}
	if wire.Token == "" {
		e := InvalidToken
		return Message{}, &e
	}
	m := Message{Token: wire.Token, Notification: wire.Notification, Data: map[string]string{}, Body: body, validateOnly: req.ValidateOnly}
	size := 0
	if n := wire.Notification; n != nil {
		size += len(n.Title) + len(n.Body)
	}
	keys := make([]string, 0, len(wire.Data))
	for k := range wire.Data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		v, ok := wire.Data[k].(string)
		if !ok {
			field := fmt.Sprintf("message.data[%d].value", i)
			raw, _ := json.Marshal(wire.Data[k])
			return Message{}, invalid(field, fmt.Sprintf("Invalid value at '%s' (TYPE_STRING), %s", field, raw))
		}
		if lk := strings.ToLower(k); lk == "from" || lk == "message_type" || strings.HasPrefix(lk, "google") || strings.HasPrefix(lk, "gcm") {
			return Message{}, &Error{Code: 400, Status: "INVALID_ARGUMENT", ErrorCode: "INVALID_ARGUMENT", Message: "Invalid data payload key: " + k}
		}
		m.Data[k] = v
		size += len(k) + len(v)
	}
	if size > MaxPayload {
		return Message{}, &Error{Code: 400, Status: "INVALID_ARGUMENT", ErrorCode: "INVALID_ARGUMENT",
			Message: fmt.Sprintf("Message is too big: a payload of %d bytes, over %d", size, MaxPayload)}
	}
	// spoolcast's rule, not FCM's: every push that shows a banner names
	// its collapse key (a background message replaces nothing).
	if wire.Android == nil || wire.Android.CollapseKey == "" && wire.Notification != nil {
		return Message{}, invalid("message.android.collapse_key", "fcmtest: android.collapse_key is not set")
	}
	m.Android = *wire.Android
	if p := m.Android.Priority; p != "" && p != "NORMAL" && p != "HIGH" {
		return Message{}, invalid("message.android.priority", fmt.Sprintf("Invalid value at 'message.android.priority' (type.googleapis.com/google.firebase.fcm.v1.AndroidMessagePriority), %q", p))
	}
	if t := m.Android.TTL; t != "" && !ttlPattern.MatchString(t) {
		return Message{}, invalid("message.android.ttl", fmt.Sprintf("Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration), %q", t))
	}
	if wire.APNs != nil {
		m.APNs = *wire.APNs
		if p, ok := m.APNs.Headers["apns-priority"]; ok && p != "5" && p != "10" {
			return Message{}, invalid("message.apns.headers", "apns-priority "+p+" is neither 5 nor 10")
		}
		if id := m.APNs.Headers["apns-collapse-id"]; len(id) > 64 {
			return Message{}, invalid("message.apns.headers", "apns-collapse-id is over 64 bytes")
		}
	}
	return m, nil
}

func invalid(field, message string) *Error {
	return &Error{Code: 400, Status: "INVALID_ARGUMENT", Message: message, Field: field}
}
