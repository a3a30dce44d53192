// Package forward moves events from the relay's spool into Postgres, the source
// of truth, through the shared ingest statement, and applies the spooled
// cancellations of scheduled events in spool order (ingest.Cancel).
//
// The rule it keeps: at-least-once forwarding into an idempotent sink. The
// forwarder may send a batch twice (a crash after the commit and before the
// spool's acknowledgement); claiming each recipient's key with
// INSERT ... ON CONFLICT DO NOTHING makes the second send a no-op, so nothing
// else is needed for an exactly-once effect.
package forward
