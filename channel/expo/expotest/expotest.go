// Package expotest is an HTTP server that speaks Expo's push API — /send and
// /getReceipts, gzip request bodies, tickets and receipts — for tests and the
// local dev stack. It records what it got and can be told to fail the way the
// real service does: 429 with Retry-After, 500, slow answers (before it reads
// the request, or after it has accepted the messages), answers lost after it
// accepted the messages, tokens that are no longer registered (in tickets or
// in receipts), devices sent too much (in tickets), receipts not ready yet.
package expotest

import (
	"cmp"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/channel/expo"
)

// Server is a fake Expo push service.
type Server struct {
	// OnPush, when set, is called with every message accepted (the dev stack logs them).
	OnPush func(m expo.Message)

	mu           sync.Mutex
	messages     []expo.Message
	tickets      map[string]string // ticket id → token
	ticketMsg    map[string]int    // ticket id → its message's index in messages
	requests     map[string]int
	gone         map[string]bool   // tokens whose tickets say DeviceNotRegistered
	atReceipt    map[string]string // tokens whose receipts say this error (DeviceNotRegistered, …)
	atTicket     map[string]string // tokens whose tickets say this error
	rateExceeded map[string]int    // tokens whose next tickets say MessageRateExceeded
	// tokens whose next receipts say MessageRateExceeded: Expo accepted the
	// message, then did not deliver it
	rateExceededAtReceipt map[string]int
	exceededTickets       map[string]bool   // tickets whose receipt says MessageRateExceeded
	experiences           map[string]string // tokens of another Expo project than DefaultExperience
	holdReceipts          int
	failures              []failure
	failing               *failure      // every request's answer while set
	delay                 time.Duration // before reading a request
	answerDelay           time.Duration // after processing it, before answering
	onAnswer              func(endpoint string)
	dropAnswers           int // requests to process and then drop the connection of, unanswered
	nextID                int
}

type failure struct {
	status     int
	retryAfter string
}

// New returns a fake with no faults.
func New() *Server {
	return &Server{tickets: map[string]string{}, ticketMsg: map[string]int{}, requests: map[string]int{}, gone: map[string]bool{}, atReceipt: map[string]string{}, atTicket: map[string]string{}, rateExceeded: map[string]int{},
		rateExceededAtReceipt: map[string]int{}, exceededTickets: map[string]bool{}, experiences: map[string]string{}}
}

// Unregister makes the tickets of token say DeviceNotRegistered.
func (s *Server) Unregister(token string) { s.mu.Lock(); s.gone[token] = true; s.mu.Unlock() }

// ExceedRate makes the next n tickets of token say MessageRateExceeded: too
// many messages to that device; nothing is accepted.
func (s *Server) ExceedRate(token string, n int) {
	s.mu.Lock()
	s.rateExceeded[token] = n
	s.mu.Unlock()
}

// UnregisterAtReceipt makes token's tickets ok but its receipts say DeviceNotRegistered.
func (s *Server) UnregisterAtReceipt(token string) { s.FailAtReceipt(token, expo.DeviceNotRegistered) }

// receiptWords are Expo's messages for the errors its receipts carry.
var receiptWords = map[string]string{
	expo.DeviceNotRegistered: "the device is no longer registered",
	expo.MismatchSenderID:    "The FCM sender id of the app does not match the one of the project's FCM server key",
	expo.InvalidCredentials:  "The push notification credentials for your standalone app are invalid",
	expo.MessageTooBig:       "the message is too big",
}

// FailAtTicket makes token's tickets say the error code
// (MismatchSenderId, InvalidCredentials, MessageTooBig), with Expo's
// words: nothing is taken; "" restores ok tickets.
func (s *Server) FailAtTicket(token, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if code == "" {
		delete(s.atTicket, token)
		return
	}
	s.atTicket[token] = code
}

// FailAtReceipt makes token's tickets ok but its receipts say the error
// code (DeviceNotRegistered, MismatchSenderId, InvalidCredentials,
// MessageTooBig), with Expo's words; "" restores ok receipts.
func (s *Server) FailAtReceipt(token, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if code == "" {
		delete(s.atReceipt, token)
		return
	}
	s.atReceipt[token] = code
}

// DefaultExperience is the Expo project ("@owner/slug") of every token the
// fake was not told otherwise of.
const DefaultExperience = "@spoolcast/app"

// SetExperience makes token one of project's, another Expo project than
// DefaultExperience: a request holding tokens of two projects is refused
// whole, 400 PUSH_TOO_MANY_EXPERIENCE_IDS, with the tokens of each project
// in its details, as Expo does.
func (s *Server) SetExperience(token, project string) {
	s.mu.Lock()
	s.experiences[token] = project
	s.mu.Unlock()
}

// ExceedRateAtReceipt makes the receipts of token's next n tickets say
// MessageRateExceeded: Expo took the messages, and its provider refused
// them for too many to the device.
func (s *Server) ExceedRateAtReceipt(token string, n int) {
	s.mu.Lock()
	s.rateExceededAtReceipt[token] = n
	s.mu.Unlock()
}

// Undelivered are the messages Expo took whose receipt said
// MessageRateExceeded: not delivered, so sending one again delivers it
// once.
func (s *Server) Undelivered() []expo.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []expo.Message
	for id := range s.exceededTickets {
		out = append(out, s.messages[s.ticketMsg[id]])
	}
	return out
}

// HoldReceipts makes the next n receipt requests answer without any receipt: not ready yet.
func (s *Server) HoldReceipts(n int) { s.mu.Lock(); s.holdReceipts = n; s.mu.Unlock() }

// Fail makes the next n requests answer status, with Retry-After when retryAfter is set.
func (s *Server) Fail(n, status int, retryAfter string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.failures = append(s.failures, failure{status, retryAfter})
	}
}

// SetFailing makes every request answer status, with Retry-After when
// retryAfter is set, until it is called with status 0: an outage.
func (s *Server) SetFailing(status int, retryAfter string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing = nil
	if status != 0 {
		s.failing = &failure{status, retryAfter}
	}
}

// SetDelay makes every answer wait d before the request is read: a slow
// Expo that has not taken the messages yet (a client that gives up first
// leaves nothing accepted).
func (s *Server) SetDelay(d time.Duration) { s.mu.Lock(); s.delay = d; s.mu.Unlock() }

// SetAnswerDelay makes every answer wait d after the request was processed:
// the messages are accepted, and the tickets come late (or never, to a client
// that gives up first).
func (s *Server) SetAnswerDelay(d time.Duration) { s.mu.Lock(); s.answerDelay = d; s.mu.Unlock() }

// SetOnAnswer makes the fake call f with the endpoint ("send" or
// "getReceipts") once a request has been processed — its messages accepted —
// and before its answer is written: what happens while an answer is on its way.
func (s *Server) SetOnAnswer(f func(endpoint string)) { s.mu.Lock(); s.onAnswer = f; s.mu.Unlock() }

// DropAnswers makes the next n requests that get as far as being processed
// — a send's messages accepted — end without an answer: the connection is
// dropped where the answer would be written. The client cannot tell them
// from requests that were lost.
func (s *Server) DropAnswers(n int) { s.mu.Lock(); s.dropAnswers = n; s.mu.Unlock() }

// Messages returns the messages accepted so far, in order.
func (s *Server) Messages() []expo.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]expo.Message(nil), s.messages...)
}

// Accepted returns how many messages were accepted so far.
func (s *Server) Accepted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.messages)
}

// Requests returns how many requests endpoint ("send" or "getReceipts") got, failed ones included.
func (s *Server) Requests(endpoint string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[endpoint]
}

// ServeHTTP answers POST /send and POST /getReceipts under any prefix.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	endpoint := ""
	switch {
	case r.Method == http.MethodPost && hasSuffix(r.URL.Path, "/send"):
		endpoint = "send"
	case r.Method == http.MethodPost && hasSuffix(r.URL.Path, "/getReceipts"):
		endpoint = "getReceipts"
	default:
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	s.requests[endpoint]++
	delay := s.delay
	var fail *failure
	if len(s.failures) > 0 {
		fail = &s.failures[0]
		s.failures = s.failures[1:]
	} else if s.failing != nil {
		fail = s.failing
	}
	s.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	if fail != nil {
		if fail.retryAfter != "" {
			w.Header().Set("Retry-After", fail.retryAfter)
		}
		writeJSON(w, fail.status, map[string]any{"errors": []map[string]string{{"code": errorCode(fail.status), "message": http.StatusText(fail.status)}}})
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, validationError(err.Error()))
			return
		}
		body = zr
	}
	raw, _ := io.ReadAll(body)
	var status int
	var answer any
	if endpoint == "send" {
		status, answer = s.send(raw)
	} else {
		status, answer = s.receipts(raw)
	}
	s.mu.Lock()
	onAnswer, answerDelay, drop := s.onAnswer, s.answerDelay, s.dropAnswers > 0
	if drop {
		s.dropAnswers--
	}
	s.mu.Unlock()
	if onAnswer != nil {
		onAnswer(endpoint)
	}
	if drop {
		panic(http.ErrAbortHandler) // the server closes the connection, unanswered
	}
	if answerDelay > 0 {
		select {
		case <-time.After(answerDelay):
		case <-r.Context().Done():
			return
		}
	}
	writeJSON(w, status, answer)
}

// errorCode is the code of a request error Expo answers with status.
func errorCode(status int) string {
	if status == http.StatusTooManyRequests {
		return "TOO_MANY_REQUESTS"
	}
	return "INTERNAL_SERVER_ERROR"
}

func validationError(msg string) any {
	return map[string]any{"errors": []map[string]string{{"code": "VALIDATION_ERROR", "message": msg}}}
}

func (s *Server) send(raw []byte) (int, any) {
	var msgs []expo.Message
	if err := json.Unmarshal(raw, &msgs); err != nil || len(msgs) > expo.MaxMessagesPerSend {
		return http.StatusBadRequest, validationError("want an array of at most 100 messages")
	}
	tickets := make([]expo.Ticket, len(msgs))
	s.mu.Lock()
	projects := map[string][]string{}
	for _, m := range msgs {
		p := cmp.Or(s.experiences[m.To], DefaultExperience)
		if !slices.Contains(projects[p], m.To) {
			projects[p] = append(projects[p], m.To)
		}
	}
	if len(projects) > 1 {
		s.mu.Unlock()
		return http.StatusBadRequest, map[string]any{"errors": []map[string]any{{
			"code":        expo.TooManyExperiences,
			"message":     "All push notification messages in the same request must be for the same project; check the details field to investigate conflicting tokens.",
			"details":     projects,
			"isTransient": false,
		}}}
	}
	for i, m := range msgs {
		if s.gone[m.To] {
			tickets[i] = expo.Ticket{Status: "error", Message: fmt.Sprintf("%q is not a registered push notification recipient", m.To), Details: &expo.ErrorDetail{Error: expo.DeviceNotRegistered}}
			continue
		}
		if code := s.atTicket[m.To]; code != "" {
			tickets[i] = expo.Ticket{Status: "error", Message: receiptWords[code], Details: &expo.ErrorDetail{Error: code}}
			continue
		}
		if s.rateExceeded[m.To] > 0 {
			s.rateExceeded[m.To]--
			tickets[i] = expo.Ticket{Status: "error", Message: "too many messages to this device", Details: &expo.ErrorDetail{Error: expo.MessageRateExceeded}}
			continue
		}
		s.nextID++
		id := fmt.Sprintf("ticket-%08d", s.nextID)
		s.tickets[id] = m.To
		s.ticketMsg[id] = len(s.messages)
		s.messages = append(s.messages, m)
		tickets[i] = expo.Ticket{Status: "ok", ID: id}
	}
	onPush := s.OnPush
	s.mu.Unlock()
	if onPush != nil {
		for i, m := range msgs {
			if tickets[i].Status == "ok" {
				onPush(m)
			}
		}
	}
	return http.StatusOK, map[string]any{"data": tickets}
}

func (s *Server) receipts(raw []byte) (int, any) {
	var req struct {
		IDs []string `json:"ids"`
	}
	if err := json.Unmarshal(raw, &req); err != nil || len(req.IDs) > expo.MaxIDsPerReceipts {
		return http.StatusBadRequest, validationError("want at most 1000 ids")
	}
	out := map[string]expo.Receipt{}
	s.mu.Lock()
	if s.holdReceipts > 0 {
		s.holdReceipts--
	} else {
		for _, id := range req.IDs {
			token, ok := s.tickets[id]
			switch {
			case !ok:
			case s.atReceipt[token] != "":
				code := s.atReceipt[token]
				out[id] = expo.Receipt{Status: "error", Message: receiptWords[code], Details: &expo.ErrorDetail{Error: code}}
			case s.rateExceededAtReceipt[token] > 0:
				// Once per ticket: the same receipt asked for again says the same.
				s.rateExceededAtReceipt[token]--
				s.exceededTickets[id] = true
				fallthrough
			case s.exceededTickets[id]:
				out[id] = expo.Receipt{Status: "error", Message: "the device received too many messages", Details: &expo.ErrorDetail{Error: expo.MessageRateExceeded}}
			default:
				out[id] = expo.Receipt{Status: "ok"}
			}
		}
	}
	s.mu.Unlock()
	return http.StatusOK, map[string]any{"data": out}
}

func hasSuffix(path, suffix string) bool {
	return len(path) >= len(suffix) && path[len(path)-len(suffix):] == suffix
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// RetryAfter formats seconds for Fail.
func RetryAfter(d time.Duration) string { return strconv.Itoa(int(d.Seconds())) }
