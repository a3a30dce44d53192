package spool

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
)

// Reader reads a spool file. A Spool has one for its own reads; OpenReadOnly
// gives one to tools that inspect a spool while its relay runs.
type Reader struct {
	path  string
	db    *sql.DB
	clock clock.Clock
	bySeq *sql.Stmt // an events row's key, hash and receipt time
}

// OpenReadOnly opens an existing spool without write access. It works while a
// relay is writing the same file.
func OpenReadOnly(path string) (*Reader, error) {
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no spool at %s", path)
		}
		return nil, fmt.Errorf("open spool: %w", err)
	}
	return openReader(path, Config{}.withDefaults(), modeReadOnly)
}

func openReader(path string, cfg Config, mode connMode) (*Reader, error) {
	db, err := sql.Open("sqlite", dsn(path, cfg, mode))
	if err != nil {
		return nil, fmt.Errorf("open spool %s: %w", path, err)
	}
	db.SetMaxOpenConns(4)
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open spool %s: %w", path, err)
	}
	r := &Reader{path: path, db: db, clock: cfg.Clock}
	if mode != modeReader {
		return r, nil
	}
	if r.bySeq, err = db.Prepare(`SELECT producer, key, request_hash, received_at FROM events WHERE seq = ?`); err != nil {
		db.Close()
		return nil, fmt.Errorf("open spool %s: %w", path, err)
	}
	return r, nil
}

// Close closes the reader's connections.
func (r *Reader) Close() error {
	if r.bySeq != nil {
		r.bySeq.Close()
	}
	return r.db.Close()
}

// Stats describes a spool at one moment. Reading it costs the same whatever
// the spool holds: the counts are running totals, the oldest pending row is
// one index lookup.
type Stats struct {
	// Pending is the number of events not yet forwarded.
	Pending int64 `json:"pending"`
	// PendingBytes is their payload bytes, the measure --spool-max-bytes limits.
	PendingBytes int64 `json:"pending_bytes"`
	// OldestPending is when the oldest pending row was received; zero when none is pending.
	OldestPending time.Time `json:"oldest_pending,omitzero"`
	// OldestPendingAge is how long the oldest pending row has waited; zero when none is pending.
	OldestPendingAge time.Duration `json:"-"`
	// KeptKeys counts forwarded keys kept to answer retries until the key TTL.
	KeptKeys int64 `json:"kept_keys"`
	// RefeedBytes is the payload bytes of forwarded events kept for the
	// refeed window.
	RefeedBytes int64 `json:"refeed_bytes"`
	// Dead counts rows set aside (refused by Postgres, or a conflict found
	// there); see `spoolcast spool ls --dead`.
	Dead int64 `json:"dead"`
	// DeadBytes is the payload bytes of dead rows.
	DeadBytes int64 `json:"dead_bytes"`
	// FileBytes is the size of the database file, the key index file and their WALs on disk.
	FileBytes int64 `json:"file_bytes"`
	// UnmergedKeys is how many claimed keys the writer holds in memory, not
	// yet in the key index file; KeyFilterBytes is the memory of the
	// filters before that file. Both only from the spool's own process.
	UnmergedKeys   int64 `json:"-"`
	KeyFilterBytes int64 `json:"-"`
}

// Stats reads the spool's depth, lag and size.
func (s *Spool) Stats(ctx context.Context) (Stats, error) {
	st, err := s.reader.Stats(ctx)
	st.UnmergedKeys, st.KeyFilterBytes = int64(s.recent.len()), s.filter.bytes()
	return st, err
}

// List returns rows in seq order, see Reader.List.
func (s *Spool) List(ctx context.Context, filter Filter, limit int) ([]Record, error) {
	return s.reader.List(ctx, filter, limit)
}

// statsQuery reads the running totals and the oldest pending row (through
// the pending index): no scan, whatever the spool holds.
const statsQuery = `SELECT pending_rows, pending_bytes, kept_rows, dead_rows, dead_bytes, kept_bytes,
	(SELECT received_at FROM events WHERE forwarded_at IS NULL ORDER BY seq LIMIT 1)
	FROM totals WHERE id = 1`

// Stats reads the spool's depth, lag and size.
func (r *Reader) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	var oldest sql.NullInt64
	err := r.db.QueryRowContext(ctx, statsQuery).Scan(&st.Pending, &st.PendingBytes, &st.KeptKeys, &st.Dead, &st.DeadBytes, &st.RefeedBytes, &oldest)
	if err != nil {
		return Stats{}, fmt.Errorf("spool stats: %w", err)
	}
	if oldest.Valid {
		st.OldestPending = time.Unix(0, oldest.Int64)
		st.OldestPendingAge = max(0, r.clock.Now().Sub(st.OldestPending))
	}
	for _, p := range []string{r.path, r.path + "-wal", keysPath(r.path), keysPath(r.path) + "-wal"} {
		if fi, err := os.Stat(p); err == nil {
			st.FileBytes += fi.Size()
		}
	}
	return st, nil
}

// Filter selects the rows List returns.
type Filter int

// The filters of List.
const (
	AllRows Filter = iota
	PendingRows
	DeadRows
)

// List returns up to limit rows in seq order (0 means all) that pass filter,
// with their payloads (empty for kept keys).
func (r *Reader) List(ctx context.Context, filter Filter, limit int) ([]Record, error) {
	var b strings.Builder
	b.WriteString(`SELECT e.seq, e.producer, e.key, e.received_at, e.forwarded_at, e.attempts, coalesce(e.dead_reason, ''), e.request_hash, coalesce(p.payload, x''), e.fanout
		FROM events e LEFT JOIN payloads p ON p.seq = e.seq`)
	switch filter {
	case PendingRows:
		b.WriteString(" WHERE e.forwarded_at IS NULL")
	case DeadRows:
		b.WriteString(" WHERE e.dead_reason IS NOT NULL")
	}
	b.WriteString(" ORDER BY e.seq")
	if limit > 0 {
		fmt.Fprintf(&b, " LIMIT %d", limit)
	}
	rows, err := r.db.QueryContext(ctx, b.String())
	if err != nil {
		return nil, fmt.Errorf("list spool: %w", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var rec Record
		var received int64
		var forwarded sql.NullInt64
		if err := rows.Scan(&rec.Seq, &rec.Producer, &rec.Key, &received, &forwarded, &rec.Attempts, &rec.DeadReason, &rec.Hash, &rec.Payload, &rec.Fanout); err != nil {
			return nil, fmt.Errorf("list spool: %w", err)
		}
		rec.ReceivedAt = time.Unix(0, received)
		if forwarded.Valid {
			rec.ForwardedAt = time.Unix(0, forwarded.Int64)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list spool: %w", err)
	}
	return out, nil
}

// RequeueDead puts the dead rows of the spool at path back in the forwarding
// queue, once what made Postgres refuse them is fixed. It is safe while a relay
// runs on the file: that relay's forwarder picks them up when it is idle. The
// spool's totals follow (they are kept by triggers in the file itself).
func RequeueDead(ctx context.Context, path string) (int64, error) {
	if _, err := os.Stat(path); err != nil {
		return 0, fmt.Errorf("no spool at %s: %w", path, err)
	}
	cfg := Config{}.withDefaults()
	db, err := sql.Open("sqlite", dsn(path, cfg, modeWriter))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("requeue dead rows: %w", err)
	}
	defer tx.Rollback()
	n, bytes, err := sumRows(tx.QueryContext(ctx, `UPDATE events SET forwarded_at = NULL, dead_reason = NULL WHERE dead_reason IS NOT NULL RETURNING size`))
	if err != nil {
		return 0, fmt.Errorf("requeue dead rows: %w", err)
	}
	if err := (totalsDelta{deadRows: -n, deadBytes: -bytes, pendingRows: n, pendingBytes: bytes}).apply(ctx, tx); err != nil {
		return 0, fmt.Errorf("requeue dead rows: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("requeue dead rows: %w", err)
	}
	return n, nil
}
