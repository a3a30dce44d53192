package spool

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// op is one write waiting for the writer. Exactly one of claim and fn is set.
type op struct {
	ctx    context.Context
	claim  *claimOp
	fn     func(context.Context, execer) error
	result chan error // buffered: the writer never blocks on an abandoned caller
}

// submit hands op to the writer and waits for the commit that carries it.
func (s *Spool) submit(ctx context.Context, o *op) error {
	o.ctx = ctx
	o.result = make(chan error, 1)
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	select {
	case s.ops <- o:
		s.mu.RUnlock()
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	select {
	case err := <-o.result:
		return err
	case <-ctx.Done():
		// The write may still commit; the caller has stopped waiting for it.
		return ctx.Err()
	}
}

// execer is the writer's connection while its transaction is open.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// write runs fn inside the writer's next transaction.
func (s *Spool) write(ctx context.Context, fn func(context.Context, execer) error) error {
	return s.submit(ctx, &op{fn: fn})
}

// runWriter is the group-commit loop: it takes one waiting op, then everything
// else already queued (up to MaxCommitBatch), and runs them all in one
// transaction with one fsync. It exits when ops is closed and drained.
func (s *Spool) runWriter() {
	defer s.writerWG.Done()
	batch := make([]*op, 0, s.cfg.MaxCommitBatch)
	for first := range s.ops {
		batch = append(batch[:0], first)
	drain:
		for len(batch) < s.cfg.MaxCommitBatch {
			select {
			case o, ok := <-s.ops:
				if !ok {
					break drain
				}
				batch = append(batch, o)
			default:
				break drain
			}
		}
		s.commit(batch)
	}
}

func (s *Spool) commit(batch []*op) {
	// The batch is committed even if some callers gave up: their rows may be
	// answered as duplicates on retry, which is the contract.
	ctx := context.Background()
	start := time.Now()
	errs := make([]error, len(batch))
	added, err := s.runBatch(ctx, batch, errs)
	took := time.Since(start)
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
		s.log.Error("spool commit failed", "err", err, "writes", len(batch))
		return
	}
	if added > 0 {
		s.signalWake()
	}
}

// runBatch runs the batch's ops in one transaction. A failing op gets its own
// error and the others still commit; a failing commit fails them all. The
// transaction is opened with BEGIN IMMEDIATE on the writer's own connection, so
// the statements prepared once at Open run inside it.
func (s *Spool) runBatch(ctx context.Context, batch []*op, errs []error) (added int, err error) {
	if err := s.setSync(ctx, hasClaim(batch)); err != nil {
		return 0, err
	}
	if _, err := s.wconn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return 0, fmt.Errorf("begin spool transaction: %w", err)
	}
	for i, o := range batch {
		if o.claim != nil {
			var isNew bool
			isNew, errs[i] = s.applyClaim(ctx, o.claim)
			if isNew {
				added++
			}
			continue
		}
		errs[i] = o.fn(ctx, s.wconn)
	}
	if _, err := s.wconn.ExecContext(ctx, "COMMIT"); err != nil {
		if _, rbErr := s.wconn.ExecContext(ctx, "ROLLBACK"); rbErr != nil {
			s.log.Debug("rollback after failed commit", "err", rbErr)
		}
		return 0, fmt.Errorf("commit spool transaction: %w", err)
	}
	if err := s.refreshUsage(ctx); err != nil {
		s.log.Warn("measure spool after commit", "err", err)
	}
	return added, nil
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
