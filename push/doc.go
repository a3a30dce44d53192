// Package push delivers notifications to users' phones through Expo: the
// dispatcher drains the push queue that ingest fills, checks preferences,
// sends one message per enabled device and records each step; the receipt
// reconciler turns tickets into outcomes. Devices and built-in preferences
// live here too.
//
// The rules it keeps (DESIGN.md 3–7): the feed row exists before any push is
// tried, and push is best effort; a preference source that fails means send
// anyway; a ticket is not an outcome (queued → sent → delivered |
// receipt_error, or queued → failed, and a missing receipt leaves the row
// sent for the next pass); a dead device is disabled, never deleted, and
// registering it again turns it back on (and outranks any answer about a send
// made before). Push is at most once per device: a send Expo may have taken is
// never sent again, and a dispatcher that stops gives back to the queue only
// what surely did not reach Expo.
package push
