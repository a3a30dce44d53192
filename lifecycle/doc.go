// Package lifecycle keeps what central stores within its lifetime: it creates
// the weekly partitions of notifications ahead of time, drops those past
// retention whole, and expires claimed keys past the key window in small
// batches. One pass at a time across all replicas (a transaction-scoped
// advisory lock, which works through PgBouncer in transaction mode); the
// others skip.
//
// The rule it keeps: nothing is deleted row by row where a partition can be
// dropped, and nothing holds a long transaction or a lock on the claim path.
package lifecycle
