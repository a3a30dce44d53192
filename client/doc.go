// Package client is what a producer imports to emit events to the spoolcast
// relay running beside it (POST http://127.0.0.1:7070/v1/events).
//
// The rule it keeps: every attempt of one Emit sends the same idempotency key
// and the same bytes, so a retry is never a second event.
//
//	c, err := client.New(client.Config{}) // the local relay, default retries
//	...
//	res, err := c.Emit(ctx, client.Event{
//		IdempotencyKey: "meeting_assignment:u_123:m_456",
//		Type:           "meeting.assigned",
//		Category:       "meetings",
//		Recipients:     []string{"u_123"},
//		Title:          "You were added to Weekly sync",
//		Data:           map[string]any{"meeting_id": "m_456"},
//	})
//
// # What success means
//
// A nil error means the event is durable on the relay's local disk (committed
// to its SQLite spool); the relay forwards it to Postgres on its own, and
// nothing downstream can make Emit wait or fail. Result.Status is Accepted
// when the relay did not hold the key and Duplicate when it already held the
// key with this same event: an earlier Emit, or an earlier attempt of this
// one whose answer was lost. Treat both as success. Emit the event after
// your own transaction commits, not inside it.
//
// # Choosing keys
//
// A key names one business fact, and is derived from it, never random:
// "meeting_assignment:u_123:m_456", "invoice_paid:inv_789". Then emitting
// again — a retry, a redelivered job, a restarted process — is always safe:
// the same key with the same event is answered Duplicate. A fact that can
// really happen twice needs something that tells the two apart in its key
// (a version, the row's update time). Keys are 1–256 bytes and scoped to the
// relay's producer name. Never reuse a key for a different event: the relay
// answers ErrConflict while it remembers the key (its --key-ttl, 24h by
// default), and after that Postgres, which remembers longer, sets the new
// event aside as dead.
//
// "The same event" is compared in canonical form: field order, repeated
// recipients and the order of Data's keys do not matter; any other
// difference, even in Title, makes a conflict. Keep what you put in an event
// stable for a key (no "sent at" timestamps in Data).
//
// # Errors
//
// One question decides what to do with a failed event: Rejected(err). When
// it is true the event itself is at fault and will never be taken as it is;
// for every other error it is not, and it must be kept and emitted again
// later with the same key (an outbox row, a job retry), which is safe:
//
//	switch _, err := c.Emit(ctx, ev); {
//	case err == nil:
//		// stored: Accepted or Duplicate alike
//	case client.Rejected(err):
//		// a bug in the producer: set the event aside, log it, alert
//	default:
//		return err // keep it: retry later, same key
//	}
//
// Branch with errors.Is on the sentinels, or errors.As for the details:
//
//   - ErrInvalidEvent (*InvalidEventError): the event breaks a rule; Field
//     names the field. Some rules are checked here before sending (StatusCode
//     0), the relay checks all of them (400, 413, 415, 422). Rejected.
//   - ErrConflict (*ConflictError): the key was used for a different event:
//     a bug in how keys are made. Rejected.
//   - ErrUnauthorized (*UnauthorizedError): the relay requires a service
//     token (Config.Token or Config.TokenSource) and the one sent is missing
//     or expired (401) or lacks the push:emit scope (403). Fix the
//     deployment; keep the event.
//   - ErrGaveUp (*GaveUpError): the relay was unreachable, slow, full
//     (503 overloaded or disk-full) or failing (5xx) for every attempt, the
//     TokenSource failed, or ctx ended. The event may or may not be stored;
//     keep it. errors.Is(err, context.Canceled) tells your own cancellation
//     apart; Last holds the last failure (an *AttemptTimeoutError for an
//     attempt without an answer in time).
//   - *StatusError on its own: an answer that is not the relay's (a 404 from
//     a wrong RelayURL, a 200 for another key, 501). A certificate the client
//     cannot verify comes back as the TLS error. Fix the configuration; keep
//     the event.
//
// # Retries
//
// Network errors, TokenSource errors, attempts without an answer within
// Config.AttemptTimeout (12s), and answers 408, 429 and 5xx (but 501 and
// 505) are retried, up to Config.MaxAttempts attempts (5) within
// Config.MaxElapsed (30s), whichever ends first, and never past ctx. The wait
// before retry n is drawn uniformly from zero to BaseBackoff·2ⁿ⁻¹ (100ms,
// doubling, capped at MaxBackoff, 5s); after a Retry-After it is never
// shorter than that and up to a fifth longer, drawn at random. When the
// wait, plus a moment for the attempt, would end past the budget or ctx's
// deadline, Emit gives up at once instead of waiting for nothing. Other
// answers are never retried.
//
// # Data
//
// Data must encode to a JSON object, or be nil. The relay keeps numbers
// exactly as written, so pass json.Number or json.RawMessage where a float64
// would round (large ids). Go strings that are not valid UTF-8 are replaced
// with U+FFFD by encoding/json inside Data; in every other field they are
// refused before sending.
package client
