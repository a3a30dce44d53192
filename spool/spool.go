package spool

import (
	"cmp"
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

//go:embed schema.sql
var schemaSQL string

// Sentinel errors callers branch on.
var (
	// ErrFull: the spool holds more than Config.MaxBytes; new keys are refused
	// until the forwarder drains it. Keys already spooled are still answered.
	ErrFull = errors.New("spool is full")
	// ErrClosed: the spool is shutting down or shut.
	ErrClosed = errors.New("spool is closed")
)

// SyncMode is SQLite's synchronous setting for the spool.
type SyncMode string

// The synchronous settings a spool may run with.
const (
	// SyncFull fsyncs the WAL on every commit: an accepted event survives power loss.
	SyncFull SyncMode = "full"
	// SyncNormal fsyncs only at checkpoints: an accepted event survives a crash of
	// the relay but the last commits may be lost on power loss.
	SyncNormal SyncMode = "normal"
)

// Config configures a spool.
type Config struct {
	// Path of the SQLite file. Required. Its directory is created if missing.
	Path string
	// Sync is SQLite's synchronous mode. Default SyncFull.
	Sync SyncMode
	// MaxBytes caps the bytes of live data in the spool; past it, claims of new
	// keys fail with ErrFull. Default 1 GiB.
	MaxBytes int64
	// KeyTTL is how long a forwarded row is kept to answer retries as duplicates
	// before it is pruned. Default 24h.
	KeyTTL time.Duration
	// MaxCommitBatch caps the writes that share one transaction. Default 1024.
	MaxCommitBatch int
	// BusyTimeout is how long a connection waits for a lock held by another
	// process (a `spoolcast spool` reader). Default 5s.
	BusyTimeout time.Duration
	// PruneInterval is how often forwarded rows past the TTL are deleted. Default 1m.
	PruneInterval time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives the spool's logs. Default slog.Default().
	Logger *slog.Logger
	// OnCommit, when set, is called after every commit with the number of writes
	// it carried and how long the transaction took. It runs on the writer; keep it cheap.
	OnCommit func(writes int, took time.Duration)
}

func (c Config) withDefaults() Config {
	c.Sync = cmp.Or(c.Sync, SyncFull)
	c.MaxBytes = cmp.Or(c.MaxBytes, 1<<30)
	c.KeyTTL = cmp.Or(c.KeyTTL, 24*time.Hour)
	c.MaxCommitBatch = cmp.Or(c.MaxCommitBatch, 1024)
	c.BusyTimeout = cmp.Or(c.BusyTimeout, 5*time.Second)
	c.PruneInterval = cmp.Or(c.PruneInterval, time.Minute)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first setting a user must fix.
func (c Config) Validate() error {
	switch {
	case c.Path == "":
		return errors.New("spool path is required")
	case c.Sync != "" && c.Sync != SyncFull && c.Sync != SyncNormal:
		return fmt.Errorf("sync mode %q: want %q or %q", c.Sync, SyncFull, SyncNormal)
	case c.MaxBytes < 0:
		return fmt.Errorf("max bytes %d: must not be negative", c.MaxBytes)
	case c.KeyTTL < 0:
		return fmt.Errorf("key TTL %s: must not be negative", c.KeyTTL)
	}
	return nil
}

// Spool is an open spool file. All writes go through one writer goroutine that
// batches them into shared transactions; reads use their own connections.
type Spool struct {
	cfg    Config
	log    *slog.Logger
	reader *Reader
	wdb    *sql.DB
	wconn  *sql.Conn
	stmts  *writerStmts

	mu     sync.RWMutex // guards closed and sends on ops
	closed bool
	ops    chan *op

	wake      chan struct{}
	syncNow   SyncMode // the writer connection's synchronous setting; writer only
	full      atomic.Bool
	usedBytes atomic.Int64

	cancelBG context.CancelFunc
	bg       sync.WaitGroup
	writerWG sync.WaitGroup
	closeErr error
	once     sync.Once
}

// Open opens or creates the spool at cfg.Path and starts its writer and pruner.
func Open(ctx context.Context, cfg Config) (*Spool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if dir := filepath.Dir(cfg.Path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create spool directory: %w", err)
		}
	}
	wdb, err := sql.Open("sqlite", dsn(cfg.Path, cfg, modeWriter))
	if err != nil {
		return nil, fmt.Errorf("open spool %s: %w", cfg.Path, err)
	}
	wdb.SetMaxOpenConns(1)
	wconn, err := wdb.Conn(ctx)
	if err != nil {
		wdb.Close()
		return nil, fmt.Errorf("open spool %s: %w", cfg.Path, err)
	}
	if err := createSchema(ctx, wconn); err != nil {
		wconn.Close()
		wdb.Close()
		return nil, fmt.Errorf("create spool schema in %s: %w", cfg.Path, err)
	}
	stmts, err := prepareWriter(ctx, wconn)
	if err != nil {
		wconn.Close()
		wdb.Close()
		return nil, err
	}
	reader, err := openReader(cfg.Path, cfg, modeReader)
	if err != nil {
		stmts.close()
		wconn.Close()
		wdb.Close()
		return nil, err
	}
	s := &Spool{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "spool"),
		reader:  reader,
		wdb:     wdb,
		wconn:   wconn,
		stmts:   stmts,
		syncNow: cfg.Sync,
		ops:     make(chan *op, cfg.MaxCommitBatch),
		wake:    make(chan struct{}, 1),
	}
	if err := s.refreshUsage(ctx); err != nil {
		s.closeDBs()
		return nil, err
	}
	s.writerWG.Add(1)
	go s.runWriter()
	bgCtx, cancel := context.WithCancel(context.Background())
	s.cancelBG = cancel
	s.bg.Add(1)
	go s.runPruner(bgCtx)
	return s, nil
}

type connMode int

const (
	modeWriter   connMode = iota // the one connection that writes
	modeReader                   // the spool's own read connections
	modeReadOnly                 // another process inspecting the file
)

// createSchema creates the spool's table, or brings an older one up to date.
func createSchema(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, schemaSQL); err != nil {
		return err
	}
	var hasDead int
	if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info('events') WHERE name = 'dead_reason'`).Scan(&hasDead); err != nil {
		return err
	}
	if hasDead == 0 {
		_, err := conn.ExecContext(ctx, `ALTER TABLE events ADD COLUMN dead_reason TEXT`)
		return err
	}
	return nil
}

// dsn builds the modernc.org/sqlite connection string. The writer opens its
// transactions with BEGIN IMMEDIATE: a deferred transaction that upgrades to a
// write fails with SQLITE_BUSY at once instead of waiting.
func dsn(path string, cfg Config, mode connMode) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", cfg.BusyTimeout.Milliseconds()))
	switch mode {
	case modeReadOnly:
		q.Set("mode", "ro")
	case modeReader:
		q.Add("_pragma", "query_only(1)")
	case modeWriter:
		q.Add("_pragma", "journal_mode(WAL)")
		// Keep the key index in memory: random keys touch a different page each.
		q.Add("_pragma", "cache_size(-65536)")
		q.Add("_pragma", fmt.Sprintf("synchronous(%s)", cfg.Sync))
	}
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// Wake returns a channel that receives after commits that add new rows. A
// forwarder waits on it between batches; one signal may cover many commits.
func (s *Spool) Wake() <-chan struct{} { return s.wake }

// Full reports whether the spool is over its byte limit.
func (s *Spool) Full() bool { return s.full.Load() }

// Ping checks that the spool still takes writes: it runs an empty write
// transaction through the writer.
func (s *Spool) Ping(ctx context.Context) error {
	return s.write(ctx, func(ctx context.Context, tx execer) error {
		_, err := tx.ExecContext(ctx, "SELECT 1")
		return err
	})
}

// Close stops taking writes, commits those already queued, stops the pruner,
// checkpoints the WAL and closes the file. Safe to call more than once.
func (s *Spool) Close(ctx context.Context) error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.ops)
		s.mu.Unlock()
		s.cancelBG()
		s.bg.Wait()
		done := make(chan struct{})
		go func() { s.writerWG.Wait(); close(done) }()
		select {
		case <-done:
		default:
			select {
			case <-done:
			case <-ctx.Done():
				// The writer is stuck on the disk; the WAL keeps what committed.
				s.closeErr = fmt.Errorf("close spool: writer did not finish: %w", ctx.Err())
				return
			}
		}
		if _, err := s.wconn.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
			s.log.Warn("checkpoint on close failed", "err", err)
		}
		s.closeErr = s.closeDBs()
	})
	return s.closeErr
}

func (s *Spool) closeDBs() error {
	s.stmts.close()
	return errors.Join(s.reader.Close(), s.wconn.Close(), s.wdb.Close())
}

// refreshUsage recomputes the bytes of live data and the full flag. Pages freed
// by pruning are reused, so they do not count against the limit.
func (s *Spool) refreshUsage(ctx context.Context) error {
	var pages, free, size int64
	if err := s.stmts.usage.QueryRowContext(ctx).Scan(&pages, &free, &size); err != nil {
		return fmt.Errorf("measure spool: %w", err)
	}
	used := (pages - free) * size
	s.usedBytes.Store(used)
	wasFull := s.full.Swap(used >= s.cfg.MaxBytes)
	if isFull := used >= s.cfg.MaxBytes; isFull != wasFull {
		s.log.Warn("spool byte limit", "full", isFull, "used_bytes", used, "max_bytes", s.cfg.MaxBytes)
	}
	return nil
}

func (s *Spool) signalWake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
