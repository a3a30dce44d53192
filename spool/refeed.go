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

// keptPayloads selects the kept rows still holding a payload, oldest first
// in seq order. CROSS JOIN keeps SQLite scanning payloads (a few rows) and
// looking each up in events, never the other way round (every kept key).
const keptPayloads = `SELECT p.seq, e.size FROM payloads p CROSS JOIN events e ON e.seq = p.seq
	WHERE e.forwarded_at IS NOT NULL AND e.dead_reason IS NULL`

// dropKept drops the payloads of the kept rows with these seqs, which hold
// bytes of them.
func dropKept(ctx context.Context, tx execer, seqs []int64, bytes int64) error {
	if err := execForSeqs(ctx, tx, "DELETE FROM payloads WHERE seq IN (%s)", nil, seqs); err != nil {
		return fmt.Errorf("drop refeed payloads: %w", err)
	}
	return totalsDelta{keptBytes: -bytes}.apply(ctx, tx)
}

// oldestKept returns the seqs of the oldest kept payloads, taken in order
// while enough says so, and their bytes.
func oldestKept(ctx context.Context, tx execer, cond string, args []any, enough func(size int64) bool) (seqs []int64, bytes int64, err error) {
	rows, err := tx.QueryContext(ctx, keptPayloads+cond+` ORDER BY p.seq`, args...)
	if err != nil {
		return nil, 0, fmt.Errorf("find refeed payloads: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var seq, size int64
		if err := rows.Scan(&seq, &size); err != nil {
			return nil, 0, err
		}
		seqs = append(seqs, seq)
		bytes += size
		if enough(size) {
			break
		}
	}
	return seqs, bytes, rows.Err()
}

// trimRefeed drops the oldest kept payloads until they are within
// RefeedMaxBytes, in the writer's open transaction: it reads as many rows
// as it drops.
func (s *Spool) trimRefeed(ctx context.Context, tx execer) error {
	var kept int64
	if err := tx.QueryRowContext(ctx, `SELECT kept_bytes FROM totals WHERE id = 1`).Scan(&kept); err != nil {
		return fmt.Errorf("read refeed bytes: %w", err)
	}
	over := kept - s.cfg.RefeedMaxBytes
	if over <= 0 {
		return nil
	}
	seqs, bytes, err := oldestKept(ctx, tx, "", nil, func(size int64) bool { over -= size; return over <= 0 })
	if err != nil || len(seqs) == 0 {
		return err
	}
	return dropKept(ctx, tx, seqs, bytes)
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
			taken := 0
			seqs, bytes, err := oldestKept(ctx, tx, ` AND e.forwarded_at < ?`, []any{cutoff}, func(int64) bool { taken++; return taken == 2000 })
			if err == nil && len(seqs) > 0 {
				err = dropKept(ctx, tx, seqs, bytes)
			}
			n = int64(len(seqs))
			if err != nil {
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
		var bytes int64
		var err error
		n, bytes, err = sumRows(tx.QueryContext(ctx, `UPDATE events SET forwarded_at = NULL WHERE seq IN (SELECT seq FROM (`+keptPayloads+` AND e.forwarded_at >= ?)) RETURNING size`, since.UnixNano()))
		if err != nil {
			return fmt.Errorf("refeed: %w", err)
		}
		return totalsDelta{keptRows: -n, keptBytes: -bytes, pendingRows: n, pendingBytes: bytes}.apply(ctx, tx)
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
