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
)

// Reader reads a spool file. A Spool has one for its own reads; OpenReadOnly
// gives one to tools that inspect a spool while its relay runs.
type Reader struct {
	path string
	db   *sql.DB
	now  func() time.Time
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
	return &Reader{path: path, db: db, now: cfg.Now}, nil
}

// Close closes the reader's connections.
func (r *Reader) Close() error { return r.db.Close() }

// Stats describes a spool at one moment.
type Stats struct {
	// Pending is the number of rows not yet forwarded.
	Pending int64 `json:"pending"`
	// OldestPending is when the oldest pending row was received; zero when none is pending.
	OldestPending time.Time `json:"oldest_pending,omitzero"`
	// OldestPendingAge is how long the oldest pending row has waited; zero when none is pending.
	OldestPendingAge time.Duration `json:"-"`
	// Rows counts all rows, pending and forwarded-but-not-yet-pruned.
	Rows int64 `json:"rows"`
	// Dead counts rows Postgres refused for good; see `spoolcast spool ls --dead`.
	Dead int64 `json:"dead"`
	// FileBytes is the size of the database file and its WAL on disk.
	FileBytes int64 `json:"file_bytes"`
	// UsedBytes is the bytes of live data, the measure the byte limit applies to.
	UsedBytes int64 `json:"used_bytes"`
}

// Stats reads the spool's depth, lag and size.
func (s *Spool) Stats(ctx context.Context) (Stats, error) { return s.reader.Stats(ctx) }

// List returns rows in seq order, see Reader.List.
func (s *Spool) List(ctx context.Context, filter Filter, limit int) ([]Record, error) {
	return s.reader.List(ctx, filter, limit)
}

// Stats reads the spool's depth, lag and size.
func (r *Reader) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	var oldest sql.NullInt64
	var pages, free, size int64
	err := r.db.QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM events WHERE forwarded_at IS NULL),
		(SELECT received_at FROM events WHERE forwarded_at IS NULL ORDER BY seq LIMIT 1),
		(SELECT count(*) FROM events),
		(SELECT count(*) FROM events WHERE dead_reason IS NOT NULL),
		(SELECT page_count FROM pragma_page_count),
		(SELECT freelist_count FROM pragma_freelist_count),
		(SELECT page_size FROM pragma_page_size)`).Scan(&st.Pending, &oldest, &st.Rows, &st.Dead, &pages, &free, &size)
	if err != nil {
		return Stats{}, fmt.Errorf("spool stats: %w", err)
	}
	if oldest.Valid {
		st.OldestPending = time.Unix(0, oldest.Int64)
		st.OldestPendingAge = max(0, r.now().Sub(st.OldestPending))
	}
	st.UsedBytes = (pages - free) * size
	for _, p := range []string{r.path, r.path + "-wal"} {
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

// List returns up to limit rows in seq order (0 means all) that pass filter.
// Payloads are left out.
func (r *Reader) List(ctx context.Context, filter Filter, limit int) ([]Record, error) {
	return r.list(ctx, listQuery{pendingOnly: filter == PendingRows, deadOnly: filter == DeadRows, limit: limit})
}

type listQuery struct {
	pendingOnly bool
	deadOnly    bool
	afterSeq    int64
	withPayload bool
	limit       int
}

func (r *Reader) list(ctx context.Context, q listQuery) ([]Record, error) {
	var b strings.Builder
	b.WriteString("SELECT seq, producer, key, received_at, forwarded_at, attempts, coalesce(dead_reason, '')")
	if q.withPayload {
		b.WriteString(", request_hash, payload")
	}
	b.WriteString(" FROM events WHERE seq > ?")
	if q.pendingOnly {
		b.WriteString(" AND forwarded_at IS NULL")
	}
	if q.deadOnly {
		b.WriteString(" AND dead_reason IS NOT NULL")
	}
	b.WriteString(" ORDER BY seq")
	if q.limit > 0 {
		fmt.Fprintf(&b, " LIMIT %d", q.limit)
	}
	rows, err := r.db.QueryContext(ctx, b.String(), q.afterSeq)
	if err != nil {
		return nil, fmt.Errorf("list spool: %w", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var rec Record
		var received int64
		var forwarded sql.NullInt64
		dest := []any{&rec.Seq, &rec.Producer, &rec.Key, &received, &forwarded, &rec.Attempts, &rec.DeadReason}
		if q.withPayload {
			dest = append(dest, &rec.Hash, &rec.Payload)
		}
		if err := rows.Scan(dest...); err != nil {
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
// runs on the file: that relay's forwarder picks them up when it is idle.
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
	res, err := db.ExecContext(ctx, `UPDATE events SET forwarded_at = NULL, dead_reason = NULL WHERE dead_reason IS NOT NULL`)
	if err != nil {
		return 0, fmt.Errorf("requeue dead rows: %w", err)
	}
	return res.RowsAffected()
}
