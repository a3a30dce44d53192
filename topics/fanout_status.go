package topics

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A fan-out's states.
const (
	StatePending   = "pending"   // not yet due (send_at), or not yet started
	StateRunning   = "running"   // split into ranges; batches being written
	StateCompleted = "completed" // every member written (or skipped)
	StateCancelled = "cancelled" // stopped by a cancellation; those written keep theirs
)

// FanoutStatus is one fan-out's progress: an event's delivery to one topic.
type FanoutStatus struct {
	ID             int64  `json:"id"`
	Topic          string `json:"topic"`
	Producer       string `json:"producer"`
	IdempotencyKey string `json:"idempotency_key"`
	State          string `json:"state"`
	// Members is how many members it counted when it started (subscribed
	// by AcceptedAt); 0 while pending.
	Members int64 `json:"members"`
	// Written got a new notification; Skipped had the event already.
	// Members who left before their batch are in neither.
	Written      int64      `json:"written"`
	Skipped      int64      `json:"skipped"`
	Ranges       int        `json:"ranges"`
	RangesDone   int        `json:"ranges_done"`
	AcceptedAt   time.Time  `json:"accepted_at"`
	DueAt        time.Time  `json:"due_at"`
	StartedAt    *time.Time `json:"started_at"`
	LastProgress *time.Time `json:"last_progress_at"`
	EndedAt      *time.Time `json:"ended_at"`
}

// FanoutFilter selects fan-outs; zero fields select all.
type FanoutFilter struct {
	State          string
	Topic          string
	Producer       string
	IdempotencyKey string
	// Before lists fan-outs with smaller ids: the next page after the
	// last one's id.
	Before int64
	Limit  int
}

// MaxFanoutPage is the longest page of fan-outs.
const MaxFanoutPage = 500

// CheckFanoutFilter reports a filter the API refuses.
func CheckFanoutFilter(f FanoutFilter) error {
	switch f.State {
	case "", StatePending, StateRunning, StateCompleted, StateCancelled:
	default:
		return invalid("state %q: one of pending, running, completed, cancelled", f.State)
	}
	if f.Topic != "" {
		if err := CheckName(f.Topic); err != nil {
			return err
		}
	}
	if f.Limit < 0 || f.Limit > MaxFanoutPage {
		return invalid("limit %d: 1 to %d", f.Limit, MaxFanoutPage)
	}
	if f.Before < 0 {
		return invalid("before %d: a fan-out's id", f.Before)
	}
	return nil
}

// Fanouts lists fan-outs newest first, with their progress summed over
// their ranges; more reports a further page.
func (s *Store) Fanouts(ctx context.Context, f FanoutFilter) (out []FanoutStatus, more bool, err error) {
	if err := CheckFanoutFilter(f); err != nil {
		return nil, false, err
	}
	if f.Limit == 0 {
		f.Limit = 100
	}
	rows, err := s.db.Query(ctx, `SELECT fo.id, fo.topic, fo.producer, fo.idempotency_key, fo.state,
			coalesce(r.members, 0), coalesce(r.written, 0), coalesce(r.skipped, 0), coalesce(r.ranges, 0), coalesce(r.done, 0),
			fo.accepted_at, fo.due_at, fo.started_at, r.last, fo.ended_at
		FROM topic_fanouts fo
		LEFT JOIN LATERAL (SELECT sum(members)::int8 AS members, sum(written)::int8 AS written, sum(skipped)::int8 AS skipped,
		                          count(*)::int AS ranges, count(*) FILTER (WHERE done)::int AS done, max(updated_at) AS last
		                   FROM topic_fanout_ranges WHERE fanout_id = fo.id) r ON true
		WHERE ($1 = '' OR fo.state = $1) AND ($2 = '' OR fo.topic = $2) AND ($3 = '' OR fo.producer = $3)
		  AND ($4 = '' OR fo.idempotency_key = $4) AND ($5 = 0 OR fo.id < $5)
		ORDER BY fo.id DESC LIMIT $6`, f.State, f.Topic, f.Producer, f.IdempotencyKey, f.Before, f.Limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list topic fan-outs: %w", err)
	}
	out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (FanoutStatus, error) {
		var st FanoutStatus
		err := r.Scan(&st.ID, &st.Topic, &st.Producer, &st.IdempotencyKey, &st.State, &st.Members, &st.Written, &st.Skipped,
			&st.Ranges, &st.RangesDone, &st.AcceptedAt, &st.DueAt, &st.StartedAt, &st.LastProgress, &st.EndedAt)
		return st, err
	})
	if err != nil {
		return nil, false, fmt.Errorf("list topic fan-outs: %w", err)
	}
	if len(out) > f.Limit {
		return out[:f.Limit], true, nil
	}
	return out, false, nil
}
