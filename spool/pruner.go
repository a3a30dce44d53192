package spool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spoolcast/spoolcast/internal/startstop"
)

// runPruner deletes rows past their retention every PruneInterval.
func (s *Spool) runPruner(ctx context.Context) {
	startstop.Every(ctx, startstop.Schedule{Interval: s.cfg.PruneInterval, Clock: s.cfg.Clock, Delay: true}, func(ctx context.Context) bool {
		if n, err := s.Prune(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, ErrClosed) {
			s.log.Warn("prune spool", "err", err)
		} else if n > 0 {
			s.log.Debug("pruned spool", "rows", n)
		}
		return false
	})
}

// Prune deletes kept keys forwarded longer ago than KeyTTL and dead rows set
// aside longer ago than DeadTTL, and drops the payloads kept past the refeed
// window, in small transactions so claims keep flowing. Pending rows are
// never deleted.
func (s *Spool) Prune(ctx context.Context) (int64, error) {
	if _, err := s.pruneRefeed(ctx); err != nil {
		return 0, err
	}
	now := s.cfg.Clock.Now()
	kept, err := s.pruneWhere(ctx, "dead_reason IS NULL", now.Add(-s.cfg.KeyTTL))
	if err != nil {
		return kept, err
	}
	dead, err := s.pruneWhere(ctx, "dead_reason IS NOT NULL", now.Add(-s.cfg.DeadTTL))
	if dead > 0 {
		s.log.Warn("dead rows past their retention were deleted", "rows", dead, "dead_ttl", s.cfg.DeadTTL)
	}
	return kept + dead, err
}

func (s *Spool) pruneWhere(ctx context.Context, cond string, cutoff time.Time) (int64, error) {
	const chunk = 2000
	var total int64
	for {
		var n int64
		err := s.write(ctx, func(ctx context.Context, tx execer) error {
			res, err := tx.ExecContext(ctx, `DELETE FROM events WHERE seq IN (
				SELECT seq FROM events WHERE forwarded_at IS NOT NULL AND forwarded_at < ? AND `+cond+` LIMIT ?)`, cutoff.UnixNano(), chunk)
			if err != nil {
				return fmt.Errorf("prune: %w", err)
			}
			n, err = res.RowsAffected()
			return err
		})
		if err != nil {
			return total, err
		}
		total += n
		if n < chunk {
			return total, nil
		}
	}
}
