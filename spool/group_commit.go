package spool

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/spoolcast/spoolcast/internal/clock"
)

// op is one write waiting for the writer. Exactly one of claim and fn is set.
type op struct {
	claim  *claimOp
	fn     func(context.Context, execer) error
	result chan error // buffered: the writer never blocks on an abandoned caller
}

// submit hands op to the writer and waits for the commit that carries it. It
// holds no lock while it waits: Close, a full queue or a stuck disk never
// leave it blocked past ctx.
func (s *Spool) submit(ctx context.Context, o *op) error {
	o.result = make(chan error, 1)
	select {
	case <-s.closing:
		return ErrClosed
	default:
	}
	select {
	case s.ops <- o:
	case <-s.closing:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-o.result:
		return err
	case <-s.writerDone:
		// The writer answers before it stops; an op queued after its last
		// batch was never run.
		select {
		case err := <-o.result:
			return err
		default:
			return ErrClosed
		}
	case <-ctx.Done():
		// The write may still commit; the caller has stopped waiting for it.
		return ctx.Err()
	}
}

// execer is the writer's connection while its transaction is open.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// write runs fn inside the writer's next transaction.
func (s *Spool) write(ctx context.Context, fn func(context.Context, execer) error) error {
	return s.submit(ctx, &op{fn: fn})
}

// runWriter is the group-commit loop: it takes one waiting op, then everything
// else already queued (up to MaxCommitBatch), and runs them all in one
// transaction with one fsync. Once Close is called it commits what was queued
// before, then stops.
func (s *Spool) runWriter() {
	defer close(s.writerDone)
	batch := make([]*op, 0, s.cfg.MaxCommitBatch)
	for {
		select {
		case first := <-s.ops:
			batch = s.drain(append(batch[:0], first))
			s.commit(batch)
		case <-s.closing:
			for {
				if batch = s.drain(batch[:0]); len(batch) == 0 {
					return
				}
				s.commit(batch)
			}
		}
	}
}

// drain adds the ops already queued to batch, up to MaxCommitBatch.
func (s *Spool) drain(batch []*op) []*op {
	for len(batch) < s.cfg.MaxCommitBatch {
		select {
		case o := <-s.ops:
			batch = append(batch, o)
		default:
			return batch
		}
	}
	return batch
}

func (s *Spool) commit(batch []*op) {
	// The batch is committed even if some callers gave up: their rows may be
	// answered as duplicates on retry, which is the contract.
	ctx := context.Background()
	start := s.cfg.Clock.Now()
	errs := make([]error, len(batch))
	added, err := s.runBatch(ctx, batch, errs)
	took := clock.Since(s.cfg.Clock, start)
	if err == nil && s.cfg.OnCommit != nil {
		s.cfg.OnCommit(len(batch), took)
	}
	for i, o := range batch {
		if err != nil {
			errs[i] = err
		}
		o.result <- errs[i]
	}
	if err != nil {
		return // each caller has the error; they log it at their own rate
	}
	s.restartCheckpoint(ctx)
	// A commit also rewrites the last page of each table and index it
	// appends to, and the totals row.
	s.wroteForCheckpoint(4 * 4096)
	if added > 0 {
		s.signalWake()
		s.wakeMerger()
	}
}

// runBatch runs the batch's ops in one transaction. A failing op gets its own
// error and leaves nothing behind: each op runs under a savepoint, rolled back
// when it fails, so a claim whose payload insert fails cannot commit its events
// row (whose seq the writer would hand out again). The others still commit. A
// failing commit, a full disk (after which SQLite may have rolled back) or an
// op that cannot be undone fails them all. The transaction is opened with
// BEGIN IMMEDIATE on the writer's own connection, so the statements prepared
// once at Open run inside it.
func (s *Spool) runBatch(ctx context.Context, batch []*op, errs []error) (added int, err error) {
	nextSeq, pending := s.nextSeq, s.pending
	defer func() {
		if err != nil {
			if _, rbErr := s.wconn.ExecContext(ctx, "ROLLBACK"); rbErr != nil {
				// SQLite may have rolled back already; rows may also have
				// committed (a failed COMMIT): keep the seqs handed out, a gap
				// is harmless, a reused seq is not; and keep their keys, which
				// a claim checks against the rows.
				s.log.Debug("rollback after a failed batch", "err", rbErr)
			} else {
				s.nextSeq, s.pending = nextSeq, pending
				s.recent.dropFrom(nextSeq)
			}
		}
		s.committed.Store(s.nextSeq - 1)
		s.diskFull.Store(err != nil && isDiskFull(err))
		if err != nil && isDiskFull(err) {
			err = fmt.Errorf("%w: %w", ErrDiskFull, err)
		}
		if terr := s.loadTotals(ctx); terr != nil {
			s.log.Warn("read spool totals after commit", "err", terr)
		}
	}()
	if err := s.setSync(ctx, hasClaim(batch)); err != nil {
		return 0, err
	}
	if _, err := s.wconn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return 0, fmt.Errorf("begin spool transaction: %w", err)
	}
	news := &s.batchClaims
	news.reset(s.nextSeq, s.pending)
	flush := func() error {
		n, err := s.flushClaims(ctx, news)
		added += n
		return err
	}
	for i, o := range batch {
		if o.claim != nil {
			errs[i] = s.decideClaim(ctx, o.claim, news)
			continue
		}
		// Ops run in their order: what came before is written first.
		if err := flush(); err != nil {
			return 0, err
		}
		if errs[i], err = s.apply(ctx, o); err != nil {
			return 0, err
		}
	}
	if err := flush(); err != nil {
		return 0, err
	}
	for i, o := range batch {
		if o.claim != nil && o.claim.err != nil {
			errs[i] = o.claim.err
		}
	}
	if _, err := s.wconn.ExecContext(ctx, "COMMIT"); err != nil {
		return 0, fmt.Errorf("commit spool transaction: %w", err)
	}
	return added, nil
}

// apply runs one op of the open transaction under a savepoint and rolls back
// to it if the op fails. opErr is the op's own error; batchErr fails the whole
// batch: a full disk, or a savepoint SQLite no longer has (it rolled the
// transaction back itself), after which nothing more may run on the connection
// outside a transaction.
func (s *Spool) apply(ctx context.Context, o *op) (opErr, batchErr error) {
	st := s.stmts
	if _, err := st.savepoint.ExecContext(ctx); err != nil {
		return nil, fmt.Errorf("spool savepoint: %w", err)
	}
	opErr = o.fn(ctx, s.wconn)
	if opErr != nil {
		if isDiskFull(opErr) {
			return opErr, opErr
		}
		if _, err := st.undo.ExecContext(ctx); err != nil {
			return opErr, fmt.Errorf("undo a failed spool write (%w): %w", opErr, err)
		}
	}
	if _, err := st.release.ExecContext(ctx); err != nil {
		return opErr, fmt.Errorf("release spool savepoint: %w", err)
	}
	return opErr, nil
}

func hasClaim(batch []*op) bool {
	for _, o := range batch {
		if o.claim != nil {
			return true
		}
	}
	return false
}

// setSync picks the durability of the next commit. Only claims need their own
// fsync: a lost acknowledgement, failure count or prune is redone harmlessly
// (a batch is re-sent, Postgres's claim absorbs it). So with --sync full, a
// commit without claims skips the fsync, and the next claim's fsync of the WAL
// covers it too. This keeps the spool's fsyncs off the disk while it drains.
func (s *Spool) setSync(ctx context.Context, claims bool) error {
	mode := s.cfg.Sync
	if !claims {
		mode = SyncNormal
	}
	if mode == s.syncNow {
		return nil
	}
	if _, err := s.wconn.ExecContext(ctx, "PRAGMA synchronous = "+string(mode)); err != nil {
		return fmt.Errorf("set spool sync mode: %w", err)
	}
	s.syncNow = mode
	return nil
}
