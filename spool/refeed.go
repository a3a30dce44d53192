package spool

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// The refeed window: a forwarded event keeps its payload for
// Config.RefeedWindow, so that when Postgres fails over to a standby that had
// not received the last commits (asynchronous replication), the forwarder can
// send again everything forwarded within the window; the idempotent sink
// drops what survived. Kept payloads are found through the payloads table,
// which holds only pending, dead and kept-for-refeed rows, in seq order (the
// order they were forwarded in, near enough): no index of their own to write.

// keptPayloads selects the kept rows still holding a payload, oldest first.
const keptPayloads = `SELECT p.seq FROM payloads p JOIN events e ON e.seq = p.seq
	WHERE e.forwarded_at IS NOT NULL AND e.dead_reason IS NULL`

// dropKept drops the payloads of the kept rows seqs selects (a query of seq).
func dropKept(ctx context.Context, tx execer, seqs string, args ...any) (int64, error) {
	res, err := tx.ExecContext(ctx, `UPDATE events SET size = 0 WHERE seq IN (`+seqs+`)`, args...)
	if err != nil {
		return 0, fmt.Errorf("drop refeed payloads: %w", err)
	}
	n, _ := res.RowsAffected()
	if _, err := tx.ExecContext(ctx, `DELETE FROM payloads WHERE seq IN (SELECT p.seq FROM payloads p JOIN events e ON e.seq = p.seq
		WHERE e.forwarded_at IS NOT NULL AND e.dead_reason IS NULL AND e.size = 0)`); err != nil {
		return 0, fmt.Errorf("drop refeed payloads: %w", err)
	}
	return n, nil
}

// trimRefeed drops the oldest kept payloads while they are over
// RefeedMaxBytes, in the writer's open transaction.
func (s *Spool) trimRefeed(ctx context.Context, tx execer) error {
	for range 64 { // bounded work per acknowledgement; the pruner does the rest
		var kept int64
		if err := tx.QueryRowContext(ctx, `SELECT kept_bytes FROM totals WHERE id = 1`).Scan(&kept); err != nil {
			return fmt.Errorf("read refeed bytes: %w", err)
		}
		if kept <= s.cfg.RefeedMaxBytes {
			return nil
		}
		if n, err := dropKept(ctx, tx, keptPayloads+` ORDER BY p.seq LIMIT 16`); err != nil || n == 0 {
			return err
		}
	}
	return nil
}

// pruneRefeed drops the payloads of rows forwarded before the refeed window,
// and any over RefeedMaxBytes.
func (s *Spool) pruneRefeed(ctx context.Context) (int64, error) {
	if s.cfg.RefeedWindow <= 0 {
		return 0, nil
	}
	cutoff := s.cfg.Clock.Now().Add(-s.cfg.RefeedWindow).UnixNano()
	var total int64
	for {
		var n int64
		err := s.write(ctx, func(ctx context.Context, tx execer) error {
			var err error
			if n, err = dropKept(ctx, tx, keptPayloads+` AND e.forwarded_at < ? ORDER BY p.seq LIMIT 2000`, cutoff); err != nil {
				return err
			}
			return s.trimRefeed(ctx, tx)
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

// Refeed puts back in the forwarding queue every event forwarded at or after
// since whose payload is still kept, and returns how many: after Postgres
// failed over to a standby that may lack the last commits. Sending them again
// is harmless: Postgres's claim drops what it has.
func (s *Spool) Refeed(ctx context.Context, since time.Time) (int64, error) {
	var n int64
	err := s.write(ctx, func(ctx context.Context, tx execer) error {
		res, err := tx.ExecContext(ctx, `UPDATE events SET forwarded_at = NULL WHERE seq IN (`+keptPayloads+` AND e.forwarded_at >= ?)`, since.UnixNano())
		if err != nil {
			return fmt.Errorf("refeed: %w", err)
		}
		n, _ = res.RowsAffected()
		return nil
	})
	if err == nil && n > 0 {
		s.signalWake()
	}
	return n, err
}

// History returns what SetHistory last recorded: the history of the Postgres
// the spool was last forwarded to; "" before the first.
func (s *Spool) History(ctx context.Context) (string, error) {
	var h string
	err := s.reader.db.QueryRowContext(ctx, `SELECT value FROM meta WHERE name = 'postgres_history'`).Scan(&h)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the spool's Postgres history: %w", err)
	}
	return h, nil
}

// SetHistory records the history of the Postgres the spool is forwarded to.
func (s *Spool) SetHistory(ctx context.Context, h string) error {
	return s.write(ctx, func(ctx context.Context, tx execer) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO meta (name, value) VALUES ('postgres_history', ?)
			ON CONFLICT (name) DO UPDATE SET value = excluded.value`, h)
		return err
	})
}
