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
	Payload     []byte // empty once forwarded
	Fanout      int
	ReceivedAt  time.Time
	ForwardedAt time.Time // zero while pending
	Attempts    int
	// DeadReason is why the row was set aside; empty for a normal row.
	DeadReason string
}

// Pending reports whether the row still waits for the forwarder.
func (r Record) Pending() bool { return r.ForwardedAt.IsZero() }

// BatchLimit bounds what NextBatch returns. A row over a limit on its own
// still makes a batch of one, so no row is ever stuck behind a limit.
type BatchLimit struct {
	// Rows caps the rows. Required.
	Rows int
	// Fanout caps the sum of the rows' Fanout; 0 means no cap.
	Fanout int
	// Bytes caps the sum of the rows' payload bytes; 0 means no cap.
	Bytes int64
}

// NextBatch returns pending rows with a seq above afterSeq, in the order they
// were accepted, as many as lim allows. Rows stay pending until MarkForwarded,
// so a crash between the two re-sends them. Seqs are never reused, so a reader
// that remembers the last seq it took never misses a later row.
func (s *Spool) NextBatch(ctx context.Context, afterSeq int64, lim BatchLimit) ([]Record, error) {
	if lim.Rows < 1 {
		return nil, fmt.Errorf("next batch: row limit %d: want at least 1", lim.Rows)
	}
	rows, err := s.reader.db.QueryContext(ctx, `SELECT e.seq, e.producer, e.key, e.received_at, e.attempts, e.request_hash, coalesce(p.payload, x''), e.fanout
		FROM events e LEFT JOIN payloads p ON p.seq = e.seq
		WHERE e.seq > ? AND e.forwarded_at IS NULL ORDER BY e.seq LIMIT ?`, afterSeq, lim.Rows)
	if err != nil {
		return nil, fmt.Errorf("next batch: %w", err)
	}
	defer rows.Close()
	var out []Record
	var fanout int
	var size int64
	for rows.Next() {
		var rec Record
		var received int64
		if err := rows.Scan(&rec.Seq, &rec.Producer, &rec.Key, &received, &rec.Attempts, &rec.Hash, &rec.Payload, &rec.Fanout); err != nil {
			return nil, fmt.Errorf("next batch: %w", err)
		}
		fanout += rec.Fanout
		size += int64(len(rec.Payload))
		if len(out) > 0 && ((lim.Fanout > 0 && fanout > lim.Fanout) || (lim.Bytes > 0 && size > lim.Bytes)) {
			break
		}
		rec.ReceivedAt = time.Unix(0, received)
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("next batch: %w", err)
	}
	return out, nil
}

// MarkForwarded records that the rows with these seqs are safely in Postgres.
// Each keeps its key, request hash and receipt time to answer retries until
// the key TTL; its payload is dropped, or kept for the refeed window (the
// oldest kept ones going first past RefeedMaxBytes).
func (s *Spool) MarkForwarded(ctx context.Context, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	now := s.cfg.Clock.Now().UnixNano()
	return s.write(ctx, func(ctx context.Context, tx execer) error {
		n, size, err := sumForSeqs(ctx, tx, "UPDATE events SET forwarded_at = ? WHERE forwarded_at IS NULL AND seq IN (%s) RETURNING size", []any{now}, seqs)
		if err != nil {
			return err
		}
		d := totalsDelta{pendingRows: -n, pendingBytes: -size, keptRows: n}
		if s.cfg.RefeedWindow > 0 {
			d.keptBytes = size // the payloads stay for the window
		}
		if err := d.apply(ctx, tx); err != nil {
			return err
		}
		if s.cfg.RefeedWindow > 0 {
			return s.trimRefeed(ctx, tx)
		}
		return execForSeqs(ctx, tx, "DELETE FROM payloads WHERE seq IN (%s)", nil, seqs)
	})
}

// MarkDead takes a row out of the forwarding queue with the reason: Postgres
// refuses it for good, or found its key claimed by another request. The row
// keeps its payload for Config.DeadTTL, for an operator to inspect with
// `spoolcast spool ls --dead` or put back with `spoolcast spool requeue --dead`.
func (s *Spool) MarkDead(ctx context.Context, seq int64, reason string) error {
	now := s.cfg.Clock.Now().UnixNano()
	return s.write(ctx, func(ctx context.Context, tx execer) error {
		n, size, err := sumForSeqs(ctx, tx, `UPDATE events SET forwarded_at = ?, dead_reason = ?, attempts = attempts + 1 WHERE forwarded_at IS NULL AND seq IN (%s) RETURNING size`, []any{now, reason}, []int64{seq})
		if err != nil {
			return err
		}
		return totalsDelta{pendingRows: -n, pendingBytes: -size, deadRows: n, deadBytes: size}.apply(ctx, tx)
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
	return forSeqChunks(query, fixed, seqs, func(q string, args []any) error {
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("update spool rows: %w", err)
		}
		return nil
	})
}

// forSeqChunks calls run with query, its %s an IN list of up to 500
// placeholders, and its arguments (fixed, then the chunk's seqs), for each
// chunk of seqs.
func forSeqChunks(query string, fixed []any, seqs []int64, run func(q string, args []any) error) error {
	const chunk = 500
	for len(seqs) > 0 {
		n := min(chunk, len(seqs))
		args := append(make([]any, 0, len(fixed)+n), fixed...)
		for _, seq := range seqs[:n] {
			args = append(args, seq)
		}
		seqs = seqs[n:]
		if err := run(fmt.Sprintf(query, strings.TrimSuffix(strings.Repeat("?,", n), ",")), args); err != nil {
			return err
		}
	}
	return nil
}
