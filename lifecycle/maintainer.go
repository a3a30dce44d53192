package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/weekly"
)

// DB is what maintenance needs of Postgres: a pgxpool.Pool with at least two
// connections (one holds the pass's lock while the other works). Postgres is
// asked to cancel a statement whose context ends, as pgx does: that is how a
// detach, which no SET LOCAL can reach, stops waiting.
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

// DefaultLockTimeout is Config.LockTimeout's default: long enough for the
// short transactions of ingest and reads to end, short enough that a pass
// behind a long one gives up and retries at its next run.
const DefaultLockTimeout = 5 * time.Second

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
	// LockTimeout is the longest each DDL statement of a pass (creating a
	// partition ahead, detaching or dropping one past retention) waits for a
	// lock. Past it the statement gives up, the pass goes on with the rest,
	// and the next pass retries it (Report.LockTimeouts). Default 5s.
	LockTimeout time.Duration
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
	case c.KeyWindow < 0 || c.Retention < 0 || c.WeeksAhead < 0 || c.LockTimeout < 0:
		return errors.New("maintenance: key window, retention, weeks ahead and lock timeout must not be negative")
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
	c.LockTimeout = cmp.Or(c.LockTimeout, DefaultLockTimeout)
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
	// Analyzed names the tables whose planner statistics the pass renewed
	// (see analyze).
	Analyzed []string `json:"analyzed"`
	// RowsDropped is Postgres's estimate of the rows the dropped partitions held.
	RowsDropped int64 `json:"rows_dropped_estimate"`
	// LockTimeouts are the DDL statements that gave up waiting for a lock
	// another session held (a report, pg_dump, a session idle in
	// transaction). The pass did the rest; the next one retries them.
	LockTimeouts []DDLLockTimeout `json:"lock_timeouts"`
	// KeysExpired counts the claimed keys deleted past the key window.
	KeysExpired int64 `json:"keys_expired"`
	// CancelledExpired counts the rows of cancelled scheduled events deleted
	// (see expireCancelled).
	CancelledExpired int64 `json:"cancelled_expired"`
	// FanoutsExpired counts the topic fan-outs deleted, ended before both
	// the key window and retention.
	FanoutsExpired int64 `json:"fanouts_expired"`
	// ReadEventsExpired counts the read-state changes deleted past ReadEventsKept.
	ReadEventsExpired int64 `json:"read_events_expired"`
	// StreamTicketsExpired counts the stream tickets deleted that expired unused.
	StreamTicketsExpired int64 `json:"stream_tickets_expired"`
	// Partitions describes the partitions present after the pass.
	Partitions []Partition `json:"partitions"`
	// Took is how long the pass took.
	Took time.Duration `json:"took_ns"`
}

// DDLLockTimeout is one DDL statement a pass gave up on after
// Config.LockTimeout.
type DDLLockTimeout struct {
	// Op is what it would have done: create (a partition ahead), detach (one
	// past retention), finalize (finish a detach an earlier pass left
	// pending, and drop) or drop (a detached partition).
	Op string `json:"op"`
	// Partition names the partition.
	Partition string `json:"partition"`
}

// The ops of DDLLockTimeout, and the op label of its metric.
const (
	OpCreate   = "create"
	OpDetach   = "detach"
	OpFinalize = "finalize"
	OpDrop     = "drop"
	OpAnalyze  = "analyze"
)

// Partition is one weekly partition.
type Partition struct {
	Table string    `json:"table"`
	Name  string    `json:"name"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// DetachPending is true for a partition whose detach began and did not
	// finish: it holds no rows any query sees, and the next pass finishes it.
	DetachPending bool `json:"detach_pending,omitempty"`
}

// Run makes one maintenance pass as of cfg.Clock's now: partitions ahead, drops
// past retention, expired keys. A pass already running in another replica
// makes it return at once with Ran false. DDL that waits for a lock longer
// than cfg.LockTimeout is given up, listed in Report.LockTimeouts and counted,
// and the pass goes on: it is not an error, and the next pass retries it.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	if cfg.DB == nil {
		return Report{}, errors.New("maintenance: a database is required")
	}
	cfg = cfg.withDefaults()
	// A pass's length is real time, whatever time the pass runs as.
	start := clock.Real{}.Now()
	rep, err := run(ctx, cfg)
	rep.Took = clock.Since(clock.Real{}, start)
	cfg.Metrics.observe(rep, err, cfg.Clock)
	return rep, err
}

func run(ctx context.Context, cfg Config) (Report, error) {
	p := &pass{cfg: cfg, rep: Report{At: cfg.Clock.Now().UTC()}}
	err := p.run(ctx)
	return p.rep, err
}

// pass is one maintenance pass under way.
type pass struct {
	cfg Config
	rep Report
}

func (p *pass) run(ctx context.Context) error {
	cfg, now := p.cfg, p.rep.At
	lock, err := cfg.DB.Begin(ctx)
	if err != nil {
		return fmt.Errorf("maintenance: %w", err)
	}
	// Held until the pass ends: rolling back releases it.
	defer lock.Rollback(context.WithoutCancel(ctx))
	// The simple protocol: an extended-protocol query leaves its portal, and
	// its snapshot, open until the transaction ends, and a FINALIZE of a
	// pending detach waits for every older snapshot, the pass's own too.
	var got bool
	if err := lock.QueryRow(ctx, fmt.Sprintf(`SELECT pg_try_advisory_xact_lock(%d)`, int64(lockKey)), pgx.QueryExecModeSimpleProtocol).Scan(&got); err != nil {
		return fmt.Errorf("maintenance: take the lock: %w", err)
	}
	if !got {
		_ = lock.Rollback(ctx) // give the connection back before taking another
		p.rep.Partitions, err = Partitions(ctx, cfg.DB)
		return err
	}
	p.rep.Ran = true
	for _, table := range Partitioned {
		// In order, and none after one that timed out: the partitions
		// ahead stay contiguous, so that the newest one's end (the
		// partitions-ahead gauge) says how far ahead they reach.
		for w := range cfg.WeeksAhead + 1 {
			at := now.AddDate(0, 0, 7*w)
			created, err := weekly.EnsureWithin(ctx, cfg.DB, table, at, cfg.LockTimeout)
			if weekly.LockTimeout(err) {
				p.timedOut(OpCreate, weekly.Partition(table, at), err)
				break
			}
			if err != nil {
				return fmt.Errorf("maintenance: %w", err)
			}
			if created {
				p.rep.Created = append(p.rep.Created, weekly.Partition(table, at))
			}
		}
	}
	if err := p.analyze(ctx); err != nil {
		return err
	}
	if cfg.Retention > 0 {
		parts, err := Partitions(ctx, cfg.DB)
		if err != nil {
			return err
		}
		for _, table := range Partitioned {
			if err := p.retire(ctx, table, parts, now.Add(-cfg.Retention)); err != nil {
				return err
			}
		}
	}
	if p.rep.KeysExpired, err = expireKeys(ctx, cfg.DB, now.Add(-cfg.KeyWindow)); err != nil {
		return err
	}
	if cfg.Retention > 0 {
		if p.rep.CancelledExpired, err = expireCancelled(ctx, cfg.DB, now.Add(-max(cfg.KeyWindow, cfg.Retention))); err != nil {
			return err
		}
		if p.rep.FanoutsExpired, err = expireFanouts(ctx, cfg.DB, now.Add(-max(cfg.KeyWindow, cfg.Retention))); err != nil {
			return err
		}
	}
	if p.rep.ReadEventsExpired, err = expireReadEvents(ctx, cfg.DB, now.Add(-ReadEventsKept)); err != nil {
		return err
	}
	if p.rep.StreamTicketsExpired, err = expireStreamTickets(ctx, cfg.DB, now); err != nil {
		return err
	}
	if _, err := cfg.DB.Exec(ctx, `INSERT INTO spoolcast_settings (name, value) VALUES ('key_window', $1)
		ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value`, cfg.KeyWindow.String()); err != nil {
		return fmt.Errorf("maintenance: record the key window: %w", err)
	}
	if p.rep.Partitions, err = Partitions(ctx, cfg.DB); err != nil {
		return err
	}
	if rep := p.rep; len(rep.Created) > 0 || len(rep.Dropped) > 0 || rep.KeysExpired > 0 {
		cfg.Logger.Info("maintenance pass", "component", "maintenance", "created", rep.Created, "dropped", rep.Dropped,
			"rows_dropped_estimate", rep.RowsDropped, "keys_expired", rep.KeysExpired)
	}
	return nil
}

// timedOut records a DDL statement that gave up waiting for a lock.
func (p *pass) timedOut(op, partition string, err error) {
	p.rep.LockTimeouts = append(p.rep.LockTimeouts, DDLLockTimeout{Op: op, Partition: partition})
	p.cfg.Logger.Warn("maintenance DDL gave up waiting for a lock; the next pass retries it. "+
		"Look in pg_locks for the session holding a lock on the table (a long report, pg_dump, a session idle in transaction)",
		"component", "maintenance", "op", op, "partition", partition, "lock_timeout", p.cfg.LockTimeout, "err", err)
}

func (p *pass) dropped(name string, estimate int64) {
	p.rep.Dropped = append(p.rep.Dropped, name)
	p.rep.RowsDropped += estimate
}

// detachedComment marks a partition past retention before its detach: if a
// pass stops between the detach and the drop, the next one knows the table
// left over for its own, and drops it.
const detachedComment = "spoolcast: past retention, detached to be dropped"

// retire drops table's partitions wholly before cutoff. First it finishes
// what an earlier pass left: a detach left pending (cut short by the lock
// timeout, or by a crash between its two transactions), a table detached but
// not dropped. Then it detaches each partition past retention, oldest first,
// with DETACH PARTITION ... CONCURRENTLY, which takes SHARE UPDATE EXCLUSIVE
// on table (no reader or writer waits for it) and waits for the queries that
// may still read the partition; and drops it, which locks the detached table
// alone. A lock timeout leaves the rest of table's partitions to the next
// pass: Postgres allows one pending detach per table.
func (p *pass) retire(ctx context.Context, table string, parts []Partition, cutoff time.Time) error {
	past := func(end time.Time) bool { return !end.After(cutoff) }
	blocked := false // a detach left pending: another one of table would fail until it is finished
	for _, part := range parts {
		if part.Table != table || !part.DetachPending {
			continue
		}
		blocked = true
		if !past(part.End) {
			p.cfg.Logger.Warn("a partition within retention is pending detach (not by a maintenance pass): its table's partitions past retention "+
				"are kept until it is finished with ALTER TABLE ... DETACH PARTITION ... FINALIZE", "component", "maintenance", "partition", part.Name)
			continue
		}
		estimate := p.estimate(ctx, part.Name)
		err := p.ddl(ctx,
			`ALTER TABLE `+ident(table)+` DETACH PARTITION `+ident(part.Name)+` FINALIZE`,
			`DROP TABLE IF EXISTS `+ident(part.Name))
		if weekly.LockTimeout(err) {
			p.timedOut(OpFinalize, part.Name, err)
			continue
		}
		if err != nil {
			return fmt.Errorf("maintenance: finish detaching %s: %w", part.Name, err)
		}
		blocked = false
		p.dropped(part.Name, estimate)
	}
	leftovers, err := detachedLeftovers(ctx, p.cfg.DB, table)
	if err != nil {
		return err
	}
	for _, name := range leftovers {
		if start, ok := weekly.ParsePartition(table, name); !ok || !past(start.AddDate(0, 0, 7)) {
			continue
		}
		estimate := p.estimate(ctx, name)
		err := p.ddl(ctx, `DROP TABLE IF EXISTS `+ident(name))
		if weekly.LockTimeout(err) {
			p.timedOut(OpDrop, name, err)
			continue
		}
		if err != nil {
			return fmt.Errorf("maintenance: drop %s: %w", name, err)
		}
		p.dropped(name, estimate)
	}
	if blocked {
		return nil
	}
	for _, part := range parts {
		if part.Table != table || part.DetachPending || !past(part.End) {
			continue
		}
		estimate := p.estimate(ctx, part.Name)
		err := p.ddl(ctx, `COMMENT ON TABLE `+ident(part.Name)+` IS '`+detachedComment+`'`)
		if err == nil {
			err = p.detach(ctx, table, part.Name)
		}
		if errors.Is(err, errDetachTimedOut) || weekly.LockTimeout(err) {
			p.timedOut(OpDetach, part.Name, err)
			return nil // perhaps left pending: the next pass finishes it
		}
		if err != nil {
			return fmt.Errorf("maintenance: detach %s: %w", part.Name, err)
		}
		err = p.ddl(ctx, `DROP TABLE IF EXISTS `+ident(part.Name))
		if weekly.LockTimeout(err) {
			p.timedOut(OpDrop, part.Name, err)
			continue // detached and marked: the next pass drops it
		}
		if err != nil {
			return fmt.Errorf("maintenance: drop %s: %w", part.Name, err)
		}
		p.dropped(part.Name, estimate)
	}
	return nil
}

var errDetachTimedOut = errors.New("the detach waited longer than the lock timeout and was cancelled")

// detach runs DETACH PARTITION ... CONCURRENTLY, which cannot run in a
// transaction block: no SET LOCAL reaches it, and a session SET would stay
// on a PgBouncer server connection for its next client. So the statement's
// context bounds it instead, and the pool asks Postgres to cancel it at the
// lock timeout. Cancelled in its second transaction, the detach stays
// pending; the next pass finishes it (retire).
func (p *pass) detach(ctx context.Context, table, partition string) error {
	dctx, cancel := context.WithTimeout(ctx, p.cfg.LockTimeout)
	defer cancel()
	_, err := p.cfg.DB.Exec(dctx, `ALTER TABLE `+ident(table)+` DETACH PARTITION `+ident(partition)+` CONCURRENTLY`)
	if err != nil && dctx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("%w: %w", errDetachTimedOut, err)
	}
	return err
}

// staleStatistics lists the partitions of $1 whose planner statistics lag
// their rows: never analyzed though they hold rows, or changed by more than
// a tenth (and a thousand rows) since. Autovacuum reaches a new week's
// partition late, its threshold counting from an empty table, and until
// then the planner reads it by sequential scan: 4.8 ms a live read at 25,000
// rows, against 0.04 ms analyzed.
const staleStatistics = `SELECT c.oid::regclass::text FROM pg_inherits i
	JOIN pg_class c ON c.oid = i.inhrelid
	JOIN pg_stat_user_tables s ON s.relid = c.oid
	WHERE i.inhparent = ANY($1::regclass[]) AND s.n_live_tup > 0
	  AND (coalesce(s.last_analyze, s.last_autoanalyze) IS NULL OR s.n_mod_since_analyze > greatest(1000, s.n_live_tup / 10))
	ORDER BY 1`

// parentsAnalyzedEvery is how often the partitioned tables themselves are
// analyzed. Postgres never analyzes a partitioned table on its own, and
// its statistics plan every query that reads it whole (the feed past its
// newest weeks, joins); before Postgres 17 an ANALYZE of it also samples
// every partition again, so once a day.
const parentsAnalyzedEvery = 24 * time.Hour

// analyze renews the statistics of the partitions that lag (staleStatistics)
// and, once a day, of the partitioned tables, each within the lock timeout
// (ANALYZE waits behind DDL and VACUUM of its table).
func (p *pass) analyze(ctx context.Context) error {
	rows, err := p.cfg.DB.Query(ctx, staleStatistics, Partitioned)
	if err != nil {
		return fmt.Errorf("maintenance: find stale statistics: %w", err)
	}
	stale, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("maintenance: find stale statistics: %w", err)
	}
	var due bool
	if err := p.cfg.DB.QueryRow(ctx, `SELECT coalesce((SELECT value::timestamptz FROM spoolcast_settings WHERE name = 'parents_analyzed_at') < now() - $1::interval, true)`,
		parentsAnalyzedEvery).Scan(&due); err != nil {
		return fmt.Errorf("maintenance: read when the partitioned tables were analyzed: %w", err)
	}
	if due {
		stale = append(stale, Partitioned...)
	}

	parents := 0
	for _, name := range stale {
		err := p.ddl(ctx, `ANALYZE `+name)
		if weekly.LockTimeout(err) {
			p.timedOut(OpAnalyze, name, err)
			continue
		}
		if err != nil {
			return fmt.Errorf("maintenance: analyze %s: %w", name, err)
		}
		p.rep.Analyzed = append(p.rep.Analyzed, name)
		if slices.Contains(Partitioned, name) {
			parents++
		}
	}
	if parents == len(Partitioned) { // else the next pass tries again
		if _, err := p.cfg.DB.Exec(ctx, `INSERT INTO spoolcast_settings (name, value) VALUES ('parents_analyzed_at', now()::text)
			ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value`); err != nil {
			return fmt.Errorf("maintenance: record when the partitioned tables were analyzed: %w", err)
		}
	}
	return nil
}

// ddl runs statements in one transaction whose lock waits end after the
// lock timeout. SET LOCAL ends with the transaction, so nothing outlives it
// on the connection: it works through PgBouncer in transaction mode.
func (p *pass) ddl(ctx context.Context, statements ...string) error {
	tx, err := p.cfg.DB.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, weekly.Millis(p.cfg.LockTimeout))); err != nil {
		return err
	}
	for _, sql := range statements {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// estimate is Postgres's estimate of the rows of a table, from the catalog.
func (p *pass) estimate(ctx context.Context, name string) int64 {
	var estimate float64
	_ = p.cfg.DB.QueryRow(ctx, `SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = to_regclass($1)`, ident(name)).Scan(&estimate)
	return int64(estimate)
}

// detachedLeftovers names the tables a pass marked and detached from table
// but did not drop.
func detachedLeftovers(ctx context.Context, db DB, table string) ([]string, error) {
	rows, err := db.Query(ctx, `SELECT c.relname::text FROM pg_class c
		WHERE c.relkind = 'r' AND NOT c.relispartition AND pg_table_is_visible(c.oid)
		  AND starts_with(c.relname, $1) AND obj_description(c.oid, 'pg_class') = $2
		ORDER BY c.relname`, table+"_", detachedComment)
	if err != nil {
		return nil, fmt.Errorf("maintenance: list detached partitions: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// Partitions lists the weekly partitions of the partitioned tables, oldest
// first. It reads the catalog only.
func Partitions(ctx context.Context, db DB) ([]Partition, error) {
	rows, err := db.Query(ctx, `SELECT p.relname::text, c.relname::text, i.inhdetachpending
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
		WHERE p.relname = ANY($1) ORDER BY c.relname`, Partitioned)
	if err != nil {
		return nil, fmt.Errorf("list partitions: %w", err)
	}
	defer rows.Close()
	var out []Partition
	for rows.Next() {
		var table, name string
		var pending bool
		if err := rows.Scan(&table, &name, &pending); err != nil {
			return nil, err
		}
		start, ok := weekly.ParsePartition(table, name)
		if !ok {
			continue // not one of ours
		}
		out = append(out, Partition{Table: table, Name: name, Start: start, End: start.AddDate(0, 0, 7), DetachPending: pending})
	}
	return out, rows.Err()
}
