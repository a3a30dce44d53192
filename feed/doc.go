// Package feed is the in-app notification feed in Postgres: keyset pages,
// read state and the capped unread count.
//
// The rule it keeps: keyset, never OFFSET. Feed order is (created_at DESC,
// id DESC) with the id as the mandatory tie-breaker; a page asks for limit+1
// rows to learn whether more follow; a cursor is opaque and a malformed one is
// an error, never a guess. Every query is scoped to one user.
package feed
