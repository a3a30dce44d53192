package lifecycle

import (
	"context"
	"fmt"
	"time"
)

// What a pass expires row by row, beside the partitions it drops: claimed
// keys past the key window, cancelled scheduled rows, the read-state
// changes the stream no longer replays, and used or expired stream tickets.

// keyBatch is how many expired keys one statement deletes: small enough to
// hold its row locks for milliseconds.
const keyBatch = 5000

// expireKeys deletes keys claimed before cutoff, keyBatch at a time, each
// batch its own short transaction. Rows a claim holds locked are skipped and
// left for the next pass.
func expireKeys(ctx context.Context, db DB, cutoff time.Time) (int64, error) {
	return deleteInBatches(ctx, db, "expire keys", `DELETE FROM idempotency_keys WHERE key IN (
				SELECT key FROM idempotency_keys WHERE claimed_at < $1
				ORDER BY claimed_at LIMIT $2 FOR UPDATE SKIP LOCKED)`, cutoff)
}

// expireCancelled deletes the rows of cancelled scheduled events whose send
// time and scheduling both lie before cutoff, keyBatch at a time. They are
// kept while their keys are (a repeated cancellation answers the first's
// time) and while the delivery log keeps their cancelled rows (it shows
// their title and category), so the cutoff is the later of the two; with
// retention off, like the notifications, they are kept.
func expireCancelled(ctx context.Context, db DB, cutoff time.Time) (int64, error) {
	return deleteInBatches(ctx, db, "expire cancelled scheduled events", `DELETE FROM scheduled_notifications WHERE id IN (
				SELECT id FROM scheduled_notifications WHERE cancelled_at IS NOT NULL AND send_at < $1 AND scheduled_at < $1
				ORDER BY send_at LIMIT $2)`, cutoff)
}

// expireFanouts deletes the topic fan-outs (and their ranges) that ended
// before cutoff, keyBatch at a time. They are kept while the event's keys
// are (a repeated cancellation answers from them, and an event sent again
// within the key window finds its fan-outs and adds none) and while its
// notifications are (status and the admin API show them).
func expireFanouts(ctx context.Context, db DB, cutoff time.Time) (int64, error) {
	return deleteInBatches(ctx, db, "expire topic fan-outs", `DELETE FROM topic_fanouts WHERE id IN (
				SELECT id FROM topic_fanouts WHERE ended_at < $1 ORDER BY ended_at LIMIT $2)`, cutoff)
}

// ReadEventsKept is how long the read-state changes the live stream sends to
// a user's other devices are kept: replicas read them within moments, so a
// day covers any replica's catch-up after an outage.
const ReadEventsKept = 24 * time.Hour

// expireReadEvents deletes read-state changes made before cutoff, keyBatch at
// a time.
func expireReadEvents(ctx context.Context, db DB, cutoff time.Time) (int64, error) {
	return deleteInBatches(ctx, db, "expire read events", `DELETE FROM read_events WHERE id IN (
				SELECT id FROM read_events WHERE created_at < $1 ORDER BY created_at LIMIT $2)`, cutoff)
}

// expireStreamTickets deletes the stream tickets (live.Tickets) that expired
// before cutoff unused, keyBatch at a time: a used one was deleted by its
// use.
func expireStreamTickets(ctx context.Context, db DB, cutoff time.Time) (int64, error) {
	return deleteInBatches(ctx, db, "expire stream tickets", `DELETE FROM stream_tickets WHERE hash IN (
				SELECT hash FROM stream_tickets WHERE expires_at < $1 ORDER BY expires_at LIMIT $2)`, cutoff)
}

// deleteInBatches runs sql, a DELETE of at most $2 rows older than $1, until
// a batch deletes fewer than keyBatch: each batch its own short
// transaction. what names the work in the error.
func deleteInBatches(ctx context.Context, db DB, what, sql string, cutoff time.Time) (int64, error) {
	var total int64
	for {
		tag, err := db.Exec(ctx, sql, cutoff, keyBatch)
		if err != nil {
			return total, fmt.Errorf("maintenance: %s: %w", what, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < keyBatch {
			return total, nil
		}
	}
}
