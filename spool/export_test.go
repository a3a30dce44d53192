package spool

import (
	"context"
	"database/sql"
	"fmt"
	"syscall"
)

// StatsQueryPlan returns SQLite's plan for the stats query, one step a line.
func StatsQueryPlan(ctx context.Context, path string) ([]string, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, "EXPLAIN QUERY PLAN "+statsQuery)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			return nil, err
		}
		plan = append(plan, detail)
	}
	return plan, rows.Err()
}

// HoldWriter hands the writer a write that blocks it until release is
// called, and returns once the writer is inside it: writes queued meanwhile
// share the writer's next batch, in the order they were queued.
func (s *Spool) HoldWriter(ctx context.Context) (release func(), err error) {
	inside, hold := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.write(ctx, func(context.Context, execer) error {
			close(inside)
			<-hold
			return nil
		})
	}()
	select {
	case <-inside:
	case err := <-done:
		return nil, err
	}
	return func() {
		close(hold)
		<-done
	}, nil
}

// QueuedWrites is how many writes wait for the writer.
func (s *Spool) QueuedWrites() int { return len(s.ops) }

// MergeThenFail queues a write that merges the committed recent keys into
// the key index, as the merger may while a batch is open, and then fails as
// a full disk does, so that its whole batch rolls back.
func (s *Spool) MergeThenFail(ctx context.Context) error {
	return s.write(ctx, func(ctx context.Context, _ execer) error {
		if err := s.mergeRecent(ctx); err != nil {
			return err
		}
		return fmt.Errorf("injected: %w", syscall.ENOSPC)
	})
}
