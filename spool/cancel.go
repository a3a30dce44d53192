package spool

import "strings"

// A cancellation of an event is spooled as an entry of its own: the event's
// key under CancelProducer(producer). It takes its place in seq order among
// the events, and is forwarded, kept and pruned like them, while its key can
// never collide with an event's: an event's producer comes from a
// command-line flag, which cannot hold a NUL byte, so no event is spooled
// under the prefix.
const cancelPrefix = "cancel\x00"

// CancelProducer is the producer a cancellation of producer's event is
// spooled under, with the event's key.
func CancelProducer(producer string) string { return cancelPrefix + producer }

// CancelOf reports whether the row is a cancellation and, if so, the
// producer whose event (of key r.Key) it cancels.
func (r Record) CancelOf() (producer string, ok bool) {
	return strings.CutPrefix(r.Producer, cancelPrefix)
}
