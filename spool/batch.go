package spool

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Record is one spooled row.
type Record struct {
	Seq         int64
	Producer    string
	Key         string
	Hash        []byte // the request hash claimed with the key; read with the payload
	Payload     []byte
	ReceivedAt  time.Time
	ForwardedAt time.Time // zero while pending
	Attempts    int
	// DeadReason is why Postgres refused the row for good; empty for a normal row.
	DeadReason string
}

// Pending reports whether the row still waits for the forwarder.
func (r Record) Pending() bool { return r.ForwardedAt.IsZero() }

// NextBatch returns up to limit pending rows with a seq above afterSeq, in the
// order they were accepted. Rows stay pending until MarkForwarded, so a crash
// between the two re-sends them. Seqs are never reused, so a reader that
// remembers the last seq it took never misses a later row.
func (s *Spool) NextBatch(ctx context.Context, afterSeq int64, limit int) ([]Record, error) {
	return s.reader.list(ctx, listQuery{pendingOnly: true, afterSeq: afterSeq, limit: limit, withPayload: true})
}

// MarkForwarded records that the rows with these seqs are safely in Postgres.
func (s *Spool) MarkForwarded(ctx context.Context, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	now := s.cfg.Now().UnixNano()
	return s.write(ctx, func(ctx context.Context, tx execer) error {
		return execForSeqs(ctx, tx, "UPDATE events SET forwarded_at = ? WHERE forwarded_at IS NULL AND seq IN (%s)", []any{now}, seqs)
	})
}

// MarkDead takes a row that Postgres refuses for good out of the forwarding
// queue, with the reason. The row is kept (never pruned) for an operator to
// inspect with `spoolcast spool ls --dead`.
func (s *Spool) MarkDead(ctx context.Context, seq int64, reason string) error {
	now := s.cfg.Now().UnixNano()
	return s.write(ctx, func(ctx context.Context, tx execer) error {
		_, err := tx.ExecContext(ctx, `UPDATE events SET forwarded_at = ?, dead_reason = ?, attempts = attempts + 1 WHERE seq = ?`, now, reason, seq)
		return err
	})
}

// MarkFailed counts one failed forwarding attempt on each row.
func (s *Spool) MarkFailed(ctx context.Context, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	return s.write(ctx, func(ctx context.Context, tx execer) error {
		return execForSeqs(ctx, tx, "UPDATE events SET attempts = attempts + 1 WHERE seq IN (%s)", nil, seqs)
	})
}

// execForSeqs runs query, whose IN list is %s, for the seqs in chunks that stay
// under SQLite's parameter limit; fixed is bound before each chunk's seqs.
func execForSeqs(ctx context.Context, tx execer, query string, fixed []any, seqs []int64) error {
	const chunk = 500
	for len(seqs) > 0 {
		n := min(chunk, len(seqs))
		args := append(make([]any, 0, len(fixed)+n), fixed...)
		for _, seq := range seqs[:n] {
			args = append(args, seq)
		}
		q := fmt.Sprintf(query, strings.TrimSuffix(strings.Repeat("?,", n), ","))
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("update spool rows: %w", err)
		}
		seqs = seqs[n:]
	}
	return nil
}

// runPruner deletes forwarded rows older than the key TTL, every PruneInterval.
func (s *Spool) runPruner(ctx context.Context) {
	defer s.bg.Done()
	t := time.NewTicker(s.cfg.PruneInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n, err := s.Prune(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("prune spool", "err", err)
			} else if n > 0 {
				s.log.Debug("pruned spool", "rows", n)
			}
		}
	}
}

// Prune deletes forwarded rows whose forwarding is older than the key TTL, in
// small transactions so claims keep flowing. Pending and dead rows are never deleted.
func (s *Spool) Prune(ctx context.Context) (int64, error) {
	cutoff := s.cfg.Now().Add(-s.cfg.KeyTTL).UnixNano()
	var total int64
	for {
		var n int64
		err := s.write(ctx, func(ctx context.Context, tx execer) error {
			res, err := tx.ExecContext(ctx, `DELETE FROM events WHERE seq IN (
				SELECT seq FROM events WHERE forwarded_at IS NOT NULL AND forwarded_at < ? AND dead_reason IS NULL LIMIT 2000)`, cutoff)
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
		if n < 2000 {
			return total, nil
		}
	}
}
