package ingest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/internal/weekly"
)

// CancelOutcome is what a cancellation of a scheduled event came to.
type CancelOutcome int

// Outcomes of Cancel.
const (
	// CancelUnknown: no event with the key was ingested for the producer
	// (or its key expired).
	CancelUnknown CancelOutcome = iota
	// CancelTooLate: the event was sent (it had no send_at, or it fired).
	CancelTooLate
	// Cancelled: its notifications will not be sent; a second cancellation
	// is answered the same.
	Cancelled
)

func (o CancelOutcome) String() string {
	switch o {
	case Cancelled:
		return "cancelled"
	case CancelTooLate:
		return "already_sent"
	default:
		return "unknown"
	}
}

// CancelResult is a cancellation's outcome and how many notifications it
// stopped (0 for a repeated cancellation).
type CancelResult struct {
	Outcome   CancelOutcome
	Stopped   int
	Cancelled time.Time // when the event was first cancelled
}

// Cancel stops the scheduled notifications of the producer's event key
// before their send_at, in one statement: they are marked cancelled (the
// firer drops them when due) and each gets a cancelled row in the delivery
// log. A firer that holds a row moving it into the feed makes the
// cancellation wait for it, and then find it sent.
func Cancel(ctx context.Context, db DB, producer, key string, at time.Time) (CancelResult, error) {
	at = at.Truncate(time.Microsecond) // as Postgres keeps it, so a repeat answers the same time
	var stopped, earlier, before int
	var first *time.Time
	var claimed bool
	run := func() error {
		return db.QueryRow(ctx, `WITH c AS (
			UPDATE scheduled_notifications SET cancelled_at = $3
			WHERE producer = $1 AND idempotency_key = $2 AND cancelled_at IS NULL
			RETURNING id, send_at, user_id
		),
		logged AS (
			INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, state, error)
			SELECT id, send_at, user_id, 'cancelled', 'cancelled before its send_at' FROM c
		)
		SELECT (SELECT count(*) FROM c),
		       (SELECT count(*) FROM scheduled_notifications WHERE producer = $1 AND idempotency_key = $2 AND cancelled_at IS NOT NULL),
		       (SELECT count(*) FROM scheduled_notifications WHERE producer = $1 AND idempotency_key = $2),
		       (SELECT min(cancelled_at) FROM scheduled_notifications WHERE producer = $1 AND idempotency_key = $2),
		       EXISTS (SELECT 1 FROM idempotency_keys WHERE key = $4)`,
			pgx.QueryExecModeCacheDescribe, producer, key, at, eventKey(producer, key)).Scan(&stopped, &earlier, &before, &first, &claimed)
	}
	err := run()
	if weekly.NoPartition(err) {
		if _, err = weekly.Ensure(ctx, db, "push_dispatches", time.Time{}); err == nil {
			err = run()
		}
	}
	if err != nil {
		return CancelResult{}, fmt.Errorf("cancel %q: %w", key, err)
	}
	switch {
	case stopped > 0:
		return CancelResult{Outcome: Cancelled, Stopped: stopped, Cancelled: at}, nil
	case earlier > 0:
		// The statement's snapshot saw it cancelled before; first is from
		// that snapshot too.
		r := CancelResult{Outcome: Cancelled}
		if first != nil {
			r.Cancelled = *first
		}
		return r, nil
	case before > 0 || claimed:
		// Rows seen but not updated were fired meanwhile; a claimed key
		// without rows was sent already.
		return CancelResult{Outcome: CancelTooLate}, nil
	default:
		return CancelResult{Outcome: CancelUnknown}, nil
	}
}
