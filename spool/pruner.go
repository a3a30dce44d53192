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
	kept, err := s.pruneWhere(ctx, false, now.Add(-s.cfg.KeyTTL))
	if err != nil {
		return kept, err
	}
	dead, err := s.pruneWhere(ctx, true, now.Add(-s.cfg.DeadTTL))
	if dead > 0 {
		s.log.Warn("dead rows past their retention were deleted", "rows", dead, "dead_ttl", s.cfg.DeadTTL)
	}
	if err == nil && kept+dead > 0 {
		var oldest int64
		if err := s.reader.db.QueryRowContext(ctx, `SELECT coalesce(min(seq), ?) FROM events`, s.committed.Load()+1).Scan(&oldest); err != nil {
			return kept + dead, fmt.Errorf("prune key filter: %w", err)
		}
		s.filter.dropBelow(oldest)
	}
	return kept + dead, err
}

func (s *Spool) pruneWhere(ctx context.Context, dead bool, cutoff time.Time) (int64, error) {
	cond := "dead_reason IS NULL"
	if dead {
		cond = "dead_reason IS NOT NULL"
	}
	// Each chunk is one short write of the writer; the key index entries of
	// the rows go in batches as large as a merge's, off the writer.
	const chunk = 2000
	var total int64
	var doomed []recentKey
	flush := func() error {
		if len(doomed) == 0 {
			return nil
		}
		if err := s.keys.remove(ctx, doomed); err != nil {
			// The entries are checked against their rows: a stale one is
			// never taken for a claim.
			return fmt.Errorf("prune key index: %w", err)
		}
		doomed = doomed[:0]
		return nil
	}
	for {
		var got []recentKey
		err := s.write(ctx, func(ctx context.Context, tx execer) error {
			got = got[:0]
			// A row's payload bytes count only while the payload is held
			// (size stays the event's bytes once its payload is dropped).
			rows, err := tx.QueryContext(ctx, `SELECT seq, producer, key, iif(EXISTS (SELECT 1 FROM payloads p WHERE p.seq = events.seq), size, 0) FROM events
				WHERE forwarded_at IS NOT NULL AND forwarded_at < ? AND `+cond+` LIMIT ?`, cutoff.UnixNano(), chunk)
			if err != nil {
				return fmt.Errorf("prune: %w", err)
			}
			seqs := make([]int64, 0, chunk)
			var bytes int64
			for rows.Next() {
				var k recentKey
				var size int64
				if err := rows.Scan(&k.seq, &k.producer, &k.key, &size); err != nil {
					rows.Close()
					return fmt.Errorf("prune: %w", err)
				}
				got = append(got, k)
				seqs = append(seqs, k.seq)
				bytes += size
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("prune: %w", err)
			}
			if err := execForSeqs(ctx, tx, "DELETE FROM events WHERE seq IN (%s)", nil, seqs); err != nil {
				return err
			}
			n := int64(len(seqs))
			d := totalsDelta{keptRows: -n, keptBytes: -bytes}
			if dead {
				d = totalsDelta{deadRows: -n, deadBytes: -bytes}
			}
			return d.apply(ctx, tx)
		})
		if err != nil {
			return total, errors.Join(err, flush())
		}
		total += int64(len(got))
		if doomed = append(doomed, got...); len(doomed) >= s.cfg.KeyMergeBatch {
			if err := flush(); err != nil {
				return total, err
			}
		}
		if len(got) < chunk {
			return total, flush()
		}
	}
}
