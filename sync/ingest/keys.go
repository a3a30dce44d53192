package ingest

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// eventKey is the key under which an event itself is claimed, with its request
// hash, so that a reused key with another request is a conflict whatever its
// recipients. It cannot collide with a NotificationKey, which starts with a digit.
func eventKey(producer, key string) string {
	return "event:" + strconv.Itoa(len(producer)) + ":" + producer + ":" + key
}

// NotificationKey derives a recipient's notification key from the producer,
// the producer's key and the recipient. Length prefixes keep it unambiguous
// whatever characters the parts hold.
func NotificationKey(producer, key, recipient string) string {
	return strconv.Itoa(len(producer)) + ":" + producer + ":" + strconv.Itoa(len(key)) + ":" + key + ":" + recipient
}

// FirstClaim is when Postgres first claimed the event's key: the time a
// duplicate is answered with.
func FirstClaim(ctx context.Context, db DB, producer, key string) (time.Time, error) {
	var at time.Time
	err := db.QueryRow(ctx, `SELECT least(claimed_at, now()) FROM idempotency_keys WHERE key = $1`, pgx.QueryExecModeCacheDescribe,
		eventKey(producer, key)).Scan(&at)
	if err != nil {
		return time.Time{}, fmt.Errorf("read the first claim: %w", err)
	}
	return at, nil
}
