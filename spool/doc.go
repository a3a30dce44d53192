// Package spool is the relay's durable local queue: a SQLite file in WAL mode
// that holds every accepted event until the forwarder has written it to
// Postgres.
//
// The rule it keeps: a claim returns only after its row is durable. Concurrent
// claims share one transaction and one fsync (group commit), so durability costs
// one disk flush per batch, not per request. The first claim of a key wins; later
// claims read the winner's request hash and are answered duplicate or conflict.
// Which row claimed a key is kept beside the file, in a key index merged in
// sorted batches (keys.go), so that random keys cost no index write per claim.
//
// Forwarded rows stay for the key TTL, so retries within it are still answered
// duplicate, then are pruned to keep the file small. Pending rows are never pruned.
//
// The package knows nothing of HTTP or Postgres.
package spool
