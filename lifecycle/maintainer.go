package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/weekly"
)

// DB is what maintenance needs of Postgres: a pgxpool.Pool with at least two
// connections (one holds the pass's lock while the other works).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Partitioned are the tables kept in weekly partitions on their creation
// time, each dropped whole past retention.
var Partitioned = []string{"notifications", "push_dispatches"}

// lockKey is the advisory lock that makes one pass at a time, cluster-wide.
const lockKey = 0x73706f6f6c636173 // "spoolcas"

// keyBatch is how many expired keys one statement deletes: small enough to
// hold its row locks for milliseconds.
const keyBatch = 5000

// Config configures maintenance.
type Config struct {
	// DB is Postgres. Required.
	DB DB
	// KeyWindow is how long claimed keys are kept: every re-send inside it is
	// recognised. Default 7 days; it must exceed every relay's --key-ttl.
	KeyWindow time.Duration
	// Retention is how long notifications are kept; partitions wholly older
	// are dropped. Zero keeps everything.
	Retention time.Duration
	// WeeksAhead is how many weekly partitions past the current one are
	// created ahead of time. Default 4.
	WeeksAhead int
	// Clock is the clock a pass runs by (clock.Frozen runs it as of a given
	// time). Default the wall clock.
	Clock clock.Clock
	// Metrics receives the outcome of passes. Default: not exported.
	Metrics *Metrics
	// Logger receives maintenance's logs. Default slog.Default().
	Logger *slog.Logger
}

// Validate reports the first lifetime setting a user must fix.
func (c Config) Validate() error {
	switch {
	case c.KeyWindow < 0 || c.Retention < 0 || c.WeeksAhead < 0:
		return errors.New("maintenance: key window, retention and weeks ahead must not be negative")
	case c.KeyWindow > 0 && c.KeyWindow <= 24*time.Hour:
		return fmt.Errorf("key window %s: it must exceed the relays' key TTL (24h by default)", c.KeyWindow)
	case c.Retention > 0 && c.Retention < 7*24*time.Hour:
		return fmt.Errorf("notification retention %s: keep at least a week (partitions are weekly), or 0 to keep everything", c.Retention)
	}
	return nil
}

func (c Config) withDefaults() Config {
	c.KeyWindow = cmp.Or(c.KeyWindow, 7*24*time.Hour)
	c.WeeksAhead = cmp.Or(c.WeeksAhead, 4)
	c.Clock = clock.Or(c.Clock)
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Report is what a pass did.
type Report struct {
	// Ran is false when another replica's pass held the lock: this one did nothing.
	Ran bool `json:"ran"`
	// At is the time the pass ran as.
	At time.Time `json:"at"`
	// Created and Dropped name the partitions created ahead and dropped past retention.
	Created []string `json:"partitions_created"`
	Dropped []string `json:"partitions_dropped"`
	// RowsDropped is Postgres's estimate of the rows the dropped partitions held.
	RowsDropped int64 `json:"rows_dropped_estimate"`
	// KeysExpired counts the claimed keys deleted past the key window.
	KeysExpired int64 `json:"keys_expired"`
	// ReadEventsExpired counts the read-state changes deleted past ReadEventsKept.
	ReadEventsExpired int64 `json:"read_events_expired"`
	// Partitions describes the partitions present after the pass.
	Partitions []Partition `json:"partitions"`
	// Took is how long the pass took.
	Took time.Duration `json:"took_ns"`
}

// Partition is one weekly partition.
type Partition struct {
	Table string    `json:"table"`
	Name  string    `json:"name"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// Run makes one maintenance pass as of cfg.Clock's now: partitions ahead, drops
// past retention, expired keys. A pass already running in another replica
// makes it return at once with Ran false.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	if cfg.DB == nil {
		return Report{}, errors.New("maintenance: a database is required")
	}
	cfg = cfg.withDefaults()
	start := cfg.Clock.Now()
	rep, err := run(ctx, cfg)
	rep.Took = clock.Since(cfg.Clock, start)
	cfg.Metrics.observe(rep, err, cfg.Clock)
	return rep, err
}

func run(ctx context.Context, cfg Config) (Report, error) {
	now := cfg.Clock.Now().UTC()
	rep := Report{At: now}
	lock, err := cfg.DB.Begin(ctx)
	if err != nil {
		return rep, fmt.Errorf("maintenance: %w", err)
	}
	// Held until the pass ends: rolling back releases it.
	defer lock.Rollback(context.WithoutCancel(ctx))
	var got bool
	if err := lock.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(lockKey)).Scan(&got); err != nil {
		return rep, fmt.Errorf("maintenance: take the lock: %w", err)
	}
	if !got {
		_ = lock.Rollback(ctx) // give the connection back before taking another
		rep.Partitions, err = Partitions(ctx, cfg.DB)
		return rep, err
	}
	rep.Ran = true
	for _, table := range Partitioned {
		for w := range cfg.WeeksAhead + 1 {
			at := now.AddDate(0, 0, 7*w)
			created, err := weekly.Ensure(ctx, cfg.DB, table, at)
			if err != nil {
				return rep, fmt.Errorf("maintenance: %w", err)
			}
			if created {
				rep.Created = append(rep.Created, weekly.Partition(table, at))
			}
		}
	}
	parts, err := Partitions(ctx, cfg.DB)
	if err != nil {
		return rep, err
	}
	if cfg.Retention > 0 {
		cutoff := now.Add(-cfg.Retention)
		for _, p := range parts {
			if p.End.After(cutoff) {
				continue
			}
			var estimate float64
			_ = cfg.DB.QueryRow(ctx, `SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = $1::regclass`, p.Name).Scan(&estimate)
			if _, err := cfg.DB.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{p.Name}.Sanitize()); err != nil {
				return rep, fmt.Errorf("maintenance: drop %s: %w", p.Name, err)
			}
			rep.Dropped = append(rep.Dropped, p.Name)
			rep.RowsDropped += int64(estimate)
		}
	}
	if rep.KeysExpired, err = expireKeys(ctx, cfg.DB, now.Add(-cfg.KeyWindow)); err != nil {
		return rep, err
	}
	if rep.ReadEventsExpired, err = expireReadEvents(ctx, cfg.DB, now.Add(-ReadEventsKept)); err != nil {
		return rep, err
	}
	if _, err := cfg.DB.Exec(ctx, `INSERT INTO spoolcast_settings (name, value) VALUES ('key_window', $1)
		ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value`, cfg.KeyWindow.String()); err != nil {
		return rep, fmt.Errorf("maintenance: record the key window: %w", err)
	}
	rep.Partitions, err = Partitions(ctx, cfg.DB)
	if err == nil && (len(rep.Created) > 0 || len(rep.Dropped) > 0 || rep.KeysExpired > 0) {
		cfg.Logger.Info("maintenance pass", "component", "maintenance", "created", rep.Created, "dropped", rep.Dropped,
			"rows_dropped_estimate", rep.RowsDropped, "keys_expired", rep.KeysExpired)
	}
	return rep, err
}

// expireKeys deletes keys claimed before cutoff, keyBatch at a time, each
// batch its own short transaction. Rows a claim holds locked are skipped and
// left for the next pass.
func expireKeys(ctx context.Context, db DB, cutoff time.Time) (int64, error) {
	var total int64
	for {
		tag, err := db.Exec(ctx, `DELETE FROM idempotency_keys WHERE key IN (
				SELECT key FROM idempotency_keys WHERE claimed_at < $1
				ORDER BY claimed_at LIMIT $2 FOR UPDATE SKIP LOCKED)`, cutoff, keyBatch)
		if err != nil {
			return total, fmt.Errorf("maintenance: expire keys: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < keyBatch {
			return total, nil
		}
	}
}

// ReadEventsKept is how long the read-state changes the live stream sends to
// a user's other devices are kept: replicas read them within moments, so a
// day covers any replica's catch-up after an outage.
const ReadEventsKept = 24 * time.Hour

// expireReadEvents deletes read-state changes made before cutoff, keyBatch at
// a time.
func expireReadEvents(ctx context.Context, db DB, cutoff time.Time) (int64, error) {
	var total int64
	for {
		tag, err := db.Exec(ctx, `DELETE FROM read_events WHERE id IN (
				SELECT id FROM read_events WHERE created_at < $1 ORDER BY created_at LIMIT $2)`, cutoff, keyBatch)
		if err != nil {
			return total, fmt.Errorf("maintenance: expire read events: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < keyBatch {
			return total, nil
		}
	}
}

// Partitions lists the weekly partitions of the partitioned tables, oldest
// first. It reads the catalog only.
func Partitions(ctx context.Context, db DB) ([]Partition, error) {
	rows, err := db.Query(ctx, `SELECT p.relname::text, c.relname::text
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
		WHERE p.relname = ANY($1) ORDER BY c.relname`, Partitioned)
	if err != nil {
		return nil, fmt.Errorf("list partitions: %w", err)
	}
	defer rows.Close()
	var out []Partition
	for rows.Next() {
		var table, name string
		if err := rows.Scan(&table, &name); err != nil {
			return nil, err
		}
		start, ok := weekly.ParsePartition(table, name)
		if !ok {
			continue // not one of ours
		}
		out = append(out, Partition{Table: table, Name: name, Start: start, End: start.AddDate(0, 0, 7)})
	}
	return out, rows.Err()
}
