// Package lifecycle keeps what central stores within its lifetime: it creates
// the weekly partitions of notifications ahead of time, drops those past
// retention whole, and expires claimed keys past the key window in small
// batches. One pass at a time across all replicas (a transaction-scoped
// advisory lock, which works through PgBouncer in transaction mode); the
// others skip.
//
// The rule it keeps: nothing is deleted row by row where a partition can be
// dropped, and nothing holds a long transaction or a lock on the claim path.
// Its DDL never takes a lock that queues readers or writers of a partitioned
// table (partitions are attached, and detached CONCURRENTLY, before a drop
// that locks the detached table alone), and gives up any lock wait after
// Config.LockTimeout, for the next pass to retry.
package lifecycle
