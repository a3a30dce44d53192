// Package ratelimit is the rate limiting central puts on its public API: a
// token bucket per key (an authenticated user, or the address of a request
// that failed authentication), held in memory on each replica, and the
// answer's RateLimit header fields.
//
// The rule it keeps: memory is bounded by the configuration, never by the
// traffic. However many users or addresses an attacker sends from, a
// Limiter holds at most Config.MaxKeys buckets (default 100,000), each a
// fixed-size struct, a map slot and its key, and a stored key is at most 65
// bytes (a longer one is stored as a marker byte and its SHA-512). Measured
// (BenchmarkMemoryPerKey, amd64, go1.26): 99 bytes a bucket keyed by IPv4
// addresses, 163 with 65-byte keys, so 10 to 16 MB at the default cap. Go
// maps do not shrink, so after a flood the table keeps about that much until
// the process ends; it never takes more.
//
// # Buckets
//
// A Rate is N events per second, minute or hour ("20/s", "100/m", "5/h").
// Each key's bucket holds 2×N: an idle client may spend two windows' worth
// at once, then N a window. For 20/s that is a burst of 40 (the issue's
// rule); for 100/m a burst of 200 rather than 2 × 100/60 ≈ 3, which would
// refuse a client that sends its minute's worth in one go. A bucket refills
// continuously, one unit every Per/N (rounded up to the nanosecond, so never
// faster than the rate), and is full again 2×Per after it was emptied.
// Refused requests take nothing, so a client that keeps asking is served at
// exactly the rate.
//
// A bucket is one int64, its theoretical arrival time (GCRA): the instant it
// will be full again. Time comes from an injected clock.Clock, read once a
// call; nothing runs in the background.
//
// # Bound and eviction
//
// Buckets live in up to 64 shards (a mutex and a map each), each capped at
// MaxKeys/shards, so the total never exceeds MaxKeys. Each shard keeps its
// buckets in least-recently-used order. Every call first drops up to two
// buckets from the old end that are full again, which loses nothing: a new
// bucket starts full. So the table shrinks back toward the keys in use, with
// no background sweep and O(1) work a call.
//
// A new key that finds its shard at its cap evicts the least recently used
// bucket even if it is still refilling. Only then is anything lost: that key
// starts over with a full bucket, one burst more than it was owed. It happens
// only when every key of the shard was used within the last 2×Per (the
// time a bucket takes to refill; otherwise the old end would have been full
// and dropped), that is when about MaxKeys keys are busy at once; if that is
// real traffic, raise MaxKeys. A new key is never refused for lack of room,
// so a flood of addresses cannot lock users out; and each request moves its
// key to the new end, so to reset a key a flood must bring MaxKeys/shards new
// keys to its shard between two of its requests.
//
// # Header fields
//
// Decision.SetHeaders writes the fields of draft-ietf-httpapi-ratelimit-headers-11
// (23 May 2026), the structured-field form with a quoted policy name, on
// every answer:
//
//	RateLimit-Policy: "user";q=40;w=2
//	RateLimit: "user";r=12;t=1
//
// q is the bucket's size and w (whole seconds) the time to refill it from
// empty, 2×Per; r is the whole units left after this request; t is the
// seconds until the next unit arrives, rounded up (draft -11 calls it the
// effective window: how long r is all the client may spend). A refused answer
// adds Retry-After in delay-seconds, the same instant as t, which the draft
// asks for (Retry-After not earlier than the end of the effective window).
// Revision -12 (20 November 2026) was not reviewed; the quoted name is
// valid under -11, and the editors' text after it allows a Token or a String.
//
// # Client addresses
//
// ClientIP keys by r.RemoteAddr alone. X-Forwarded-For and Forwarded are
// written by the client unless a proxy you trust overwrites them, and
// trusting them would let a client pick a fresh key for every request (no
// limit at all) or name someone else's address to have them limited. Behind
// a load balancer or ingress that does not preserve the client's address,
// RemoteAddr is the proxy's, and every request through it shares one bucket.
// Proxies.ClientIP believes X-Forwarded-For from the proxies named, and only
// what they appended: it reads the header from the right while the address
// at hand is a trusted proxy's, so a client's own entries are never used.
// IPv6 addresses are keyed by their /64, one subscriber's usual allocation,
// from which a single host can otherwise draw 2^64 keys.
package ratelimit
