package spool

import (
	"context"
	"fmt"
	"time"

	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// runCheckpointer copies the WAL into the database file from a connection of
// its own, so that commits do not wait for it. A passive checkpoint runs
// beside the writer, but it cannot rewind the WAL while the writer keeps
// appending (measured: the WAL grew past 400 MB), and a RESTART checkpoint
// from here waits for a gap between the writer's transactions, sleeping in
// SQLite's busy handler while the WAL grows. So once the WAL holds
// CheckpointPages, all copied, the writer itself runs the RESTART between two
// batches: it copies only what was written since the passive pass and
// syncs the file. The checkpointer runs every CheckpointInterval, and sooner
// when the writer has written a quarter of CheckpointPages since it last
// woke it.
func (s *Spool) runCheckpointer(ctx context.Context) {
	failed := lograte.New(time.Minute)
	startstop.Every(ctx, startstop.Schedule{Interval: s.cfg.CheckpointInterval, Wake: s.checkpointWake, Clock: s.cfg.Clock, Delay: true}, func(ctx context.Context) bool {
		var busy, walPages, copied int
		err := s.cpdb.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &walPages, &copied)
		switch {
		case err != nil && ctx.Err() == nil:
			failed.Do(func(suppressed int64) {
				s.log.Warn("spool checkpoint", "err", err, "suppressed", suppressed)
			})
		case err == nil && walPages >= s.cfg.CheckpointPages:
			s.restartWAL.Store(true)
		}
		return false
	})
}

// restartCheckpoint is the writer's part: run between batches when the
// checkpointer asked for it.
func (s *Spool) restartCheckpoint(ctx context.Context) {
	if !s.restartWAL.Swap(false) {
		return
	}
	var busy, walPages, copied int
	if err := s.wconn.QueryRowContext(ctx, "PRAGMA wal_checkpoint(RESTART)").Scan(&busy, &walPages, &copied); err != nil {
		s.log.Warn("spool checkpoint", "err", fmt.Errorf("restart the WAL: %w", err))
	}
}

// wroteForCheckpoint is called by the writer with the bytes it wrote.
func (s *Spool) wroteForCheckpoint(n int64) {
	const pageSize = 4096
	if s.sinceCheckpoint += n; s.sinceCheckpoint < int64(s.cfg.CheckpointPages)*pageSize/4 {
		return
	}
	s.sinceCheckpoint = 0
	select {
	case s.checkpointWake <- struct{}{}:
	default:
	}
}
