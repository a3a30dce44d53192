// Package schedule fires due work: scheduled notifications whose send_at
// has come (moved into the feed and the push queue) and digests whose
// window has closed (their one push queued). Due work lives in Postgres; any
// number of firers, in any replicas, take it with SKIP LOCKED, and each
// step is one statement, so a crash repeats nothing and loses nothing.
package schedule
