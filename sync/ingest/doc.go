// Package ingest is the Postgres ingest both ingress points share: the relay's
// forwarder and central's internal endpoint. One set-based statement claims
// each event's key with its request hash, then every recipient's notification
// key (INSERT ... ON CONFLICT DO NOTHING RETURNING), inserts notifications for
// the keys that came back and queues their push work. The Waker tells live
// listeners that rows committed.
//
// The rule it keeps: claim first. A duplicate claims nothing and so writes
// nothing, which makes sending a batch twice harmless.
package ingest
