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
	"syscall"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/startstop"
	"modernc.org/sqlite" // registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"
)

// Sentinel errors callers branch on.
var (
	// ErrFull: the events awaiting forwarding hold Config.MaxBytes; new keys
	// are refused until the forwarder drains them. Keys already spooled are
	// still answered.
	ErrFull = errors.New("spool is full")
	// ErrDiskFull: the disk under the spool has no room for the write.
	ErrDiskFull = errors.New("the spool's disk is full")
	// ErrClosed: the spool is shutting down or shut.
	ErrClosed = errors.New("spool is closed")
	// ErrLocked: another process holds the spool file.
	ErrLocked = errors.New("spool is in use by another process")
	// ErrKeysBehind is returned for a new key while the key index holds
	// more unmerged keys than it may keep in memory (its file cannot be
	// written): the event is not stored; retry later.
	ErrKeysBehind = errors.New("the spool's key index is behind")
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
	// MaxBytes caps the payload bytes of events awaiting forwarding; a claim
	// that would pass it fails with ErrFull. Kept keys and dead rows do not
	// count. Default 1 GiB.
	MaxBytes int64
	// KeyTTL is how long a forwarded key is kept to answer retries as
	// duplicates before it is pruned. Default 24h.
	KeyTTL time.Duration
	// DeadTTL is how long a dead row is kept for an operator to inspect or
	// requeue before it is pruned. Default 7 days.
	DeadTTL time.Duration
	// MaxCommitBatch caps the writes that share one transaction. Default 1024.
	MaxCommitBatch int
	// BusyTimeout is how long a connection waits for a lock held by another
	// process (a `spoolcast spool` tool). Default 5s.
	BusyTimeout time.Duration
	// PruneInterval is how often rows past their retention are deleted. Default 1m.
	PruneInterval time.Duration
	// Clock stamps receipts, acknowledgements and deaths, and times the
	// pruner and the retention windows. Default the wall clock.
	Clock clock.Clock
	// Logger receives the spool's logs. Default slog.Default().
	Logger *slog.Logger
	// OnCommit, when set, is called after every commit with the number of writes
	// it carried and how long the transaction took. It runs on the writer; keep it cheap.
	OnCommit func(writes int, took time.Duration)
	// RefeedWindow is how long a forwarded event keeps its payload, so that
	// Refeed can forward it again after Postgres failed over to a standby
	// that had not received it. Zero (the default here; the relay's
	// --refeed-window is 10m) drops the payload once forwarded.
	RefeedWindow time.Duration
	// RefeedMaxBytes bounds the payloads kept for RefeedWindow; past it the
	// oldest are dropped first. Default 64 MiB when RefeedWindow is set.
	RefeedMaxBytes int64
	// KeyMergeBatch is how many new keys the writer holds in memory before
	// the merger adds them to the key index file in one sorted pass. Larger
	// batches write each index page fewer times per key. Default 16384;
	// claims of new keys fail with ErrKeysBehind at 8 times it (at
	// least 4096).
	KeyMergeBatch int
	// CheckpointPages is the WAL length, in pages, at which the background
	// checkpointer resets the WAL. Default 4096 (16 MiB).
	CheckpointPages int
	// CheckpointInterval is how often the background checkpointer copies
	// the WAL into the database file, off the commit path. Default 100ms.
	CheckpointInterval time.Duration
}

func (c Config) withDefaults() Config {
	c.Sync = cmp.Or(c.Sync, SyncFull)
	c.MaxBytes = cmp.Or(c.MaxBytes, 1<<30)
	c.KeyTTL = cmp.Or(c.KeyTTL, 24*time.Hour)
	c.DeadTTL = cmp.Or(c.DeadTTL, 7*24*time.Hour)
	c.MaxCommitBatch = cmp.Or(c.MaxCommitBatch, 1024)
	c.BusyTimeout = cmp.Or(c.BusyTimeout, 5*time.Second)
	c.PruneInterval = cmp.Or(c.PruneInterval, time.Minute)
	c.KeyMergeBatch = cmp.Or(c.KeyMergeBatch, 16384)
	c.CheckpointPages = cmp.Or(c.CheckpointPages, 4096)
	c.CheckpointInterval = cmp.Or(c.CheckpointInterval, 100*time.Millisecond)
	if c.RefeedWindow > 0 {
		c.RefeedMaxBytes = cmp.Or(c.RefeedMaxBytes, 64<<20)
	}
	c.Clock = clock.Or(c.Clock)
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
	case c.DeadTTL < 0:
		return fmt.Errorf("dead TTL %s: must not be negative", c.DeadTTL)
	case c.MaxCommitBatch < 0:
		return fmt.Errorf("max commit batch %d: must not be negative", c.MaxCommitBatch)
	case c.BusyTimeout < 0:
		return fmt.Errorf("busy timeout %s: must not be negative", c.BusyTimeout)
	case c.PruneInterval < 0:
		return fmt.Errorf("prune interval %s: must not be negative", c.PruneInterval)
	case c.KeyMergeBatch < 0 || c.CheckpointPages < 0 || c.CheckpointInterval < 0:
		return fmt.Errorf("key merge batch %d, checkpoint pages %d and interval %s: must not be negative", c.KeyMergeBatch, c.CheckpointPages, c.CheckpointInterval)
	case c.RefeedWindow < 0 || c.RefeedMaxBytes < 0:
		return fmt.Errorf("refeed window %s and its bytes %d: must not be negative", c.RefeedWindow, c.RefeedMaxBytes)
	}
	return nil
}

// Spool is an open spool file. All writes go through one writer goroutine that
// batches them into shared transactions; reads use their own connections.
type Spool struct {
	cfg    Config
	log    *slog.Logger
	lock   *os.File
	reader *Reader
	wdb    *sql.DB
	wconn  *sql.Conn
	stmts  *writerStmts
	keys   *keyIndex
	recent *recentKeys
	filter *keyFilter
	cpdb   *sql.DB // the background checkpointer's connection

	ops        chan *op
	closing    chan struct{} // closed by Close: no new writes are taken
	writerDone chan struct{} // closed when the writer has committed its last batch

	wake         chan struct{}
	syncNow      SyncMode // the writer connection's synchronous setting; writer only
	pending      int64    // pending payload bytes as the writer's open transaction sees them; writer only
	nextSeq      int64    // the seq of the next inserted row; writer only
	pendingBytes atomic.Int64
	diskFull     atomic.Bool
	committed    atomic.Int64 // the highest seq the writer has committed
	mergeWake    chan struct{}
	// checkpointWake wakes the checkpointer; sinceCheckpoint counts the
	// bytes committed since (writer only).
	checkpointWake  chan struct{}
	sinceCheckpoint int64
	restartWAL      atomic.Bool // the checkpointer asks the writer to rewind the WAL
	batchClaims     newClaims   // writer only

	merger       startstop.Service
	checkpointer startstop.Service

	pruner   startstop.Service
	stopOnce sync.Once
	closeSem chan struct{} // one Close at a time; waiting for it honours ctx
	closed   bool
	closeErr error
}

// Open opens or creates the spool at cfg.Path and starts its writer and
// pruner. It takes the file for this process alone: a second Open of the same
// path, in this process or another, fails with ErrLocked.
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
	lock, err := lockFile(cfg.Path + ".lock")
	if err != nil {
		return nil, fmt.Errorf("open spool %s: %w", cfg.Path, err)
	}
	s := &Spool{
		cfg:            cfg,
		log:            cfg.Logger.With("component", "spool"),
		lock:           lock,
		syncNow:        cfg.Sync,
		ops:            make(chan *op, cfg.MaxCommitBatch),
		closing:        make(chan struct{}),
		writerDone:     make(chan struct{}),
		wake:           make(chan struct{}, 1),
		closeSem:       make(chan struct{}, 1),
		mergeWake:      make(chan struct{}, 1),
		checkpointWake: make(chan struct{}, 1),
		recent:         newRecentKeys(),
		batchClaims:    newClaims{byKey: make(map[string]*claimOp)},
		filter:         newKeyFilter(),
	}
	if err := s.openDBs(ctx); err != nil {
		lock.Close()
		return nil, err
	}
	go s.runWriter()
	s.pruner.Start(context.Background(), s.runPruner)
	s.merger.Start(context.Background(), s.runMerger)
	s.checkpointer.Start(context.Background(), s.runCheckpointer)
	return s, nil
}

func (s *Spool) openDBs(ctx context.Context) (err error) {
	path := s.cfg.Path
	if s.wdb, err = sql.Open("sqlite", dsn(path, s.cfg, modeWriter)); err != nil {
		return fmt.Errorf("open spool %s: %w", path, err)
	}
	s.wdb.SetMaxOpenConns(1)
	defer func() {
		if err != nil {
			s.closeDBs()
		}
	}()
	if s.wconn, err = s.wdb.Conn(ctx); err != nil {
		return fmt.Errorf("open spool %s: %w", path, err)
	}
	if err := migrate(ctx, s.wconn); err != nil {
		return fmt.Errorf("create spool schema in %s: %w", path, err)
	}
	if s.stmts, err = prepareWriter(ctx, s.wconn); err != nil {
		return err
	}
	if s.reader, err = openReader(path, s.cfg, modeReader); err != nil {
		return err
	}
	if s.cpdb, err = sql.Open("sqlite", dsn(path, s.cfg, modeCheckpointer)); err != nil {
		return fmt.Errorf("open spool %s: %w", path, err)
	}
	s.cpdb.SetMaxOpenConns(1)
	if err := s.openKeys(ctx); err != nil {
		return err
	}
	return s.loadTotals(ctx)
}

type connMode int

const (
	modeWriter       connMode = iota // the one connection that writes
	modeReader                       // the spool's own read connections
	modeReadOnly                     // another process inspecting the file
	modeCheckpointer                 // the background checkpointer
	modeKeysWriter                   // the key index file's merger
	modeKeysReader                   // the key index file's lookups
)

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
		// A small page cache: when a B-tree page moves, SQLite scans the
		// whole cache at commit (pcache1TruncateUnsafe). The background
		// checkpointer resets the WAL at CheckpointPages, off the commit
		// path; the writer's own checkpoint is the fallback, should it fall
		// behind.
		q.Add("_pragma", "cache_size(-2000)")
		q.Add("_pragma", fmt.Sprintf("wal_autocheckpoint(%d)", 4*cfg.CheckpointPages))
		q.Add("_pragma", fmt.Sprintf("synchronous(%s)", cfg.Sync))
	case modeKeysWriter:
		// The key index is rebuilt from the events table when it is lost
		// or behind, so a merge needs no fsync of its own.
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "synchronous(normal)")
		q.Add("_pragma", "cache_size(-8000)")
	case modeKeysReader:
		q.Add("_pragma", "query_only(1)")
		q.Add("_pragma", "cache_size(-8000)")
	}
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// Wake returns a channel that receives after commits that add new rows. A
// forwarder waits on it between batches; one signal may cover many commits.
func (s *Spool) Wake() <-chan struct{} { return s.wake }

// Room is how many more payload bytes the spool takes before claims of new
// keys fail with ErrFull.
func (s *Spool) Room() int64 { return s.cfg.MaxBytes - s.pendingBytes.Load() }

// Ready reports why a new event of size bytes would be refused now: ErrClosed,
// ErrFull, ErrDiskFull or another write error; nil when it would be taken. It
// runs a small write through the writer, which also notices when a full disk
// has room again.
func (s *Spool) Ready(ctx context.Context, size int64) error {
	select {
	case <-s.closing:
		return ErrClosed
	default:
	}
	if s.Room() < size {
		return ErrFull
	}
	if s.recent.len() >= s.unmergedLimit() {
		return ErrKeysBehind
	}
	return s.write(ctx, func(ctx context.Context, tx execer) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO probe (data) VALUES (zeroblob(4096))`); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM probe`)
		return err
	})
}

// DiskFull reports whether the last write found the disk full.
func (s *Spool) DiskFull() bool { return s.diskFull.Load() }

// Close stops taking writes, commits those already queued, stops the pruner,
// checkpoints the WAL and closes the file, all within ctx: if the disk hangs
// past it, Close returns an error and leaves the writer to finish (the WAL
// keeps what committed); a later Close picks up where it stopped. Safe to call
// more than once.
func (s *Spool) Close(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.closing) })
	select {
	case s.closeSem <- struct{}{}:
		defer func() { <-s.closeSem }()
	case <-ctx.Done():
		return fmt.Errorf("close spool: %w", ctx.Err())
	}
	if s.closed {
		return s.closeErr
	}
	if !waitClosed(ctx, s.writerDone) {
		return fmt.Errorf("close spool: writer did not finish: %w", ctx.Err())
	}
	for _, svc := range []struct {
		name string
		svc  *startstop.Service
	}{{"pruner", &s.pruner}, {"key merger", &s.merger}, {"checkpointer", &s.checkpointer}} {
		if err := svc.svc.Stop(ctx); err != nil {
			return fmt.Errorf("close spool: %s did not finish: %w", svc.name, err)
		}
	}
	// Merged now, the next Open need not read the unmerged keys back.
	if err := s.mergeRecent(ctx); err != nil {
		s.log.Warn("merge keys on close failed", "err", err)
	}
	if _, err := s.wconn.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		s.log.Warn("checkpoint on close failed", "err", err)
	}
	s.closeErr = s.closeDBs()
	s.lock.Close()
	s.closed = true
	return s.closeErr
}

func waitClosed(ctx context.Context, ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
}

func (s *Spool) closeDBs() error {
	var errs []error
	if s.stmts != nil {
		s.stmts.close()
	}
	if s.reader != nil {
		errs = append(errs, s.reader.Close())
	}
	if s.keys != nil {
		errs = append(errs, s.keys.close())
	}
	if s.cpdb != nil {
		errs = append(errs, s.cpdb.Close())
	}
	if s.wconn != nil {
		errs = append(errs, s.wconn.Close())
	}
	if s.wdb != nil {
		errs = append(errs, s.wdb.Close())
	}
	return errors.Join(errs...)
}

// loadTotals reads the pending bytes after a commit or rollback.
func (s *Spool) loadTotals(ctx context.Context) error {
	var pending int64
	if err := s.stmts.totals.QueryRowContext(ctx).Scan(&pending); err != nil {
		return fmt.Errorf("read spool totals: %w", err)
	}
	s.pending = pending
	s.pendingBytes.Store(pending)
	return nil
}

func (s *Spool) signalWake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// isDiskFull reports whether err is SQLite's or the system's "no space".
func isDiskFull(err error) bool {
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_FULL {
		return true
	}
	return errors.Is(err, syscall.ENOSPC)
}
