// Package push delivers notifications to users' phones and browsers through
// each provider's channel (Expo, APNs, FCM, Web Push): the dispatcher
// drains the push queue that ingest fills, checks preferences and the
// delivery policies (decided in package policy, read and written here),
// sends one message per enabled device and records each step; the receipt
// reconciler turns tickets into outcomes.
//
// It owns the push queue, the dispatches and the clears. Users' devices are
// package devices', their choices package preferences', the decisions of
// the delivery policies package policy's and each provider's protocol its
// package under channel/: push imports them all and none of them imports
// push.
//
// The rules it keeps (DESIGN.md 3–7): the feed row exists before any push is
// tried, and push is best effort; a preference source that fails means send
// anyway; a ticket is not an outcome (queued → sent → delivered |
// receipt_error, or queued → failed, and a missing receipt leaves the row
// sent for the next pass); a dead device is disabled, never deleted, and
// registering it again turns it back on (and outranks any answer about a send
// made before). Each provider is followed (DESIGN.md 10): what it says it did
// not take (a 429, a 5xx, a request that never reached it whole) is sent
// again with backoff within the dispatch's lease; a send it may have taken (a
// request written whole whose answer was lost) is never sent again, and a
// dispatcher that stops gives back to the queue only what surely did not
// reach its provider. No one holds the shared slots (DESIGN.md 11): Web Push
// sends are bounded per push service origin and per user, and one pass at a
// time keeps trying a failing Expo. A notification read or archived is
// cleared, once, from the devices that got its push (dispatch_clear.go):
// a silent message, at most one a second per device, never sent twice.
package push
