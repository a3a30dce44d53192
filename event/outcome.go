package event

import "strconv"

// Outcome is what an ingress point did with an event: the three answers a
// producer can get for a valid request, the same at the relay's spool, in
// Postgres and on the wire.
type Outcome int

// The outcomes of ingesting an event.
const (
	// Accepted: the key was new and the event is now durable (202).
	Accepted Outcome = iota + 1
	// Duplicate: the key was claimed before with the same request (200,
	// Idempotent-Replayed); nothing new was written.
	Duplicate
	// Conflict: the key was claimed before for a different request (422);
	// nothing was written.
	Conflict
)

// String is the outcome's name in answers ("status") and metric labels.
func (o Outcome) String() string {
	switch o {
	case Accepted:
		return "accepted"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}
