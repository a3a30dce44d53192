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
	Outcome CancelOutcome
	// Stopped counts the recipients' scheduled notifications stopped.
	Stopped int
	// Reached counts the topic members who got the event before its
	// fan-outs were stopped (the same for a repeat).
	Reached int64
	// PushesStopped counts the pushes of notifications already written
	// (to members reached) that were still waiting in the queue, stopped
	// by this request (0 for a repeat).
	PushesStopped int
	Cancelled     time.Time // when the event was first cancelled
}

// EventLockClass is the first key of the per-event advisory lock that a
// cancellation and the firer take, hashtext of the event's key the second:
// one lock decides for the whole event, so it is fired whole or cancelled
// whole, never split between the two. The two-key space does not overlap
// the one-key space of maintenance's lock; two events whose keys hash alike
// merely wait for (or are skipped by) each other.
const EventLockClass = 0x65766e74 // "evnt"

// EventLockKey is the second key of an event's lock, as SQL computes it
// from a scheduled row's producer and key.
const EventLockKey = `hashtext('event:' || octet_length(producer) || ':' || producer || ':' || idempotency_key)`

// Cancel stops the scheduled notifications of the producer's event key
// before their send_at, all of them or none, and its topic fan-outs' members
// not yet written (topics.Fanout writes a batch holding the event's lock
// shared, so the count of those reached is exact): in one transaction it takes the
// event's lock (waiting for a firer that holds it), then its fan-outs' rows
// (waiting for a worker starting one), then, in a statement of its own,
// marks every row cancelled and gives each a cancelled row in the delivery
// log. The firer
// fires only the rows of events whose lock it took, all in one statement, so
// a cancellation that waited finds the event sent, and a firer that comes
// after it finds every row cancelled. Cancelled rows stay as long as the
// event's keys, so a repeat answers the first cancellation's time. db must
// begin transactions (a pool or a connection).
func Cancel(ctx context.Context, db DB, producer, key string, at time.Time) (CancelResult, error) {
	txdb, ok := db.(interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	})
	if !ok {
		return CancelResult{}, fmt.Errorf("cancel %q: the database given cannot begin a transaction", key)
	}
	at = at.Truncate(time.Microsecond) // as Postgres keeps it, so a repeat answers the same time
	var stopped, earlier, rows, pushes int
	var reached int64
	var first *time.Time
	var claimed bool
	run := func() error {
		return pgx.BeginFunc(ctx, txdb, func(tx pgx.Tx) error {
			// After the lock, the next statement's snapshot sees whatever a
			// firer or another cancellation holding it committed.
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, EventLockClass, eventKey(producer, key)); err != nil {
				return fmt.Errorf("lock the event: %w", err)
			}
			// The event's fan-outs are locked first, on their own: a worker
			// starting one holds its row while it splits the members into
			// ranges. The statement below, which judges whether members are
			// left, then takes a snapshot after that start committed; one
			// that had waited on the row itself would judge the ranges by
			// the snapshot it took before (none yet: "already sent").
			if _, err := tx.Exec(ctx, `SELECT 1 FROM topic_fanouts WHERE producer = $1 AND idempotency_key = $2 FOR UPDATE`, producer, key); err != nil {
				return fmt.Errorf("lock the event's fan-outs: %w", err)
			}
			return tx.QueryRow(ctx, `WITH c AS (
				UPDATE scheduled_notifications SET cancelled_at = $3
				WHERE producer = $1 AND idempotency_key = $2 AND cancelled_at IS NULL
				RETURNING id, send_at, user_id
			),
			logged AS (
				INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, state, error)
				SELECT id, send_at, user_id, 'cancelled', 'cancelled before its send_at' FROM c
			),
			-- The event's topic fan-outs not ended: the members not yet
			-- written are stopped. Batches that held the event's lock have
			-- committed, and this statement's snapshot sees them. One whose
			-- every range is written reached every member: it is complete
			-- (its worker records so), and too late to cancel.
			fc AS (
				UPDATE topic_fanouts fo SET state = 'cancelled', ended_at = $3
				WHERE fo.producer = $1 AND fo.idempotency_key = $2
				  AND (fo.state = 'pending' OR (fo.state = 'running'
				       AND EXISTS (SELECT 1 FROM topic_fanout_ranges r WHERE r.fanout_id = fo.id AND NOT r.done)))
				RETURNING fo.id
			),
			-- The pushes of the event's notifications still waiting in the
			-- queue (a broadcast's paced pushes, quiet hours, a retry) that
			-- no dispatcher holds are stopped with its fan-outs, each with a
			-- cancelled row in the delivery log: a member reached before the
			-- cancel keeps the notification, not a banner after it. One
			-- probe of the primary key per queue row (LIMIT keeps the
			-- planner from reading notifications by the event's key, which
			-- no index serves); the lease is judged on the row deleted, so
			-- a claim that committed meanwhile keeps its row.
			pq AS (
				DELETE FROM push_queue q
				WHERE EXISTS (SELECT 1 FROM fc)
				  AND (q.claimed_until IS NULL OR q.claimed_until < now())
				  AND EXISTS (SELECT 1 FROM (SELECT n.producer, n.idempotency_key FROM notifications n
				                             WHERE n.id = q.notification_id AND n.created_at = q.notification_created_at LIMIT 1) e
				              WHERE e.producer = $1 AND e.idempotency_key = $2)
				RETURNING q.notification_id, q.notification_created_at, q.user_id
			),
			pq_logged AS (
				INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, state, error)
				SELECT notification_id, notification_created_at, user_id, 'cancelled', 'its event was cancelled before its push was sent' FROM pq
			),
			fanouts AS (SELECT id, state, ended_at FROM topic_fanouts WHERE producer = $1 AND idempotency_key = $2)
			SELECT (SELECT count(*) FROM c) + (SELECT count(*) FROM fc),
			       (SELECT count(*) FROM scheduled_notifications WHERE producer = $1 AND idempotency_key = $2 AND cancelled_at IS NOT NULL)
			         + (SELECT count(*) FROM fanouts WHERE state = 'cancelled'),
			       (SELECT min(t) FROM (SELECT min(cancelled_at) AS t FROM scheduled_notifications WHERE producer = $1 AND idempotency_key = $2
			                            UNION ALL SELECT min(ended_at) FROM fanouts WHERE state = 'cancelled') m),
			       EXISTS (SELECT 1 FROM idempotency_keys WHERE key = $4) OR EXISTS (SELECT 1 FROM fanouts),
			       (SELECT count(*) FROM c),
			       (SELECT coalesce(sum(written), 0)::int8 FROM topic_fanout_ranges WHERE fanout_id IN (SELECT id FROM fanouts)),
			       (SELECT count(*) FROM pq)`,
				pgx.QueryExecModeCacheDescribe, producer, key, at, eventKey(producer, key)).Scan(&stopped, &earlier, &first, &claimed, &rows, &reached, &pushes)
		})
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
		return CancelResult{Outcome: Cancelled, Stopped: rows, Reached: reached, PushesStopped: pushes, Cancelled: at}, nil
	case earlier > 0:
		r := CancelResult{Outcome: Cancelled, Reached: reached}
		if first != nil {
			r.Cancelled = *first
		}
		return r, nil
	case claimed:
		// A claimed key without rows left to stop: the event was sent (it
		// had no send_at, or it fired).
		return CancelResult{Outcome: CancelTooLate}, nil
	default:
		return CancelResult{Outcome: CancelUnknown}, nil
	}
}
