package spool

import (
	"context"
	"database/sql"
	"fmt"
	"math/bits"
	"strings"

	"github.com/spoolcast/spoolcast/event"
)

// The writer decides each claim of a batch first (duplicate, conflict, full,
// or new with the next seq) and inserts the new ones together: one
// multi-row statement per table and one update of the totals per batch,
// instead of two statements and two trigger runs per claim.

// newClaims are a batch's claims decided new and not yet inserted.
type newClaims struct {
	claims       []*claimOp
	byKey        map[string]*claimOp // recentID → the batch's claim of it
	dups         []*claimOp          // claims that repeat one of claims
	startSeq     int64
	startPending int64
}

func (n *newClaims) reset(nextSeq, pending int64) {
	n.claims, n.dups = n.claims[:0], n.dups[:0]
	clear(n.byKey)
	n.startSeq, n.startPending = nextSeq, pending
}

// decideClaim answers c from what the spool holds, or gives it the next seq.
// The error is c's own; nothing is written.
func (s *Spool) decideClaim(ctx context.Context, c *claimOp, n *newClaims) error {
	e := c.entry
	if first, ok := n.byKey[recentID(e.Producer, e.Key)]; ok {
		c.dupOf = first
		c.result = winner{found: true, hash: first.entry.Hash, receivedAt: first.receivedAt.UnixNano()}.result(e.Hash)
		n.dups = append(n.dups, c)
		return nil
	}
	w, err := s.recentWinner(ctx, e.Producer, e.Key)
	if err == nil && !w.found && s.keys.indexed.Load() != c.merged {
		w, err = s.mergedWinner(ctx, s.stmts.bySeq, e.Producer, e.Key)
	}
	if err != nil {
		return fmt.Errorf("claim %q: %w", e.Key, err)
	}
	if w.found {
		c.result = w.result(e.Hash)
		return nil
	}
	size := int64(len(e.Payload))
	if s.pending+size > s.cfg.MaxBytes {
		return ErrFull
	}
	if s.recent.len()+len(n.claims) >= s.unmergedLimit() {
		return ErrKeysBehind
	}
	c.seq = s.nextSeq
	s.nextSeq++
	s.pending += size
	n.claims = append(n.claims, c)
	n.byKey[recentID(e.Producer, e.Key)] = c
	return nil
}

// flushClaims inserts the batch's new claims. If the multi-row insert fails
// short of a full disk, one of its rows could not be stored: it is undone,
// and the claims are inserted one by one, each under a savepoint, so that
// only the failing one fails and the others take consecutive seqs. A claim
// that repeats a failed one fails with it. It returns the claims inserted;
// err fails the batch.
func (s *Spool) flushClaims(ctx context.Context, n *newClaims) (added int, err error) {
	defer n.reset(s.nextSeq, s.pending)
	if len(n.claims) == 0 {
		return 0, nil
	}
	st := s.stmts
	if _, err := st.bulkSavepoint.ExecContext(ctx); err != nil {
		return 0, fmt.Errorf("spool savepoint: %w", err)
	}
	bulkErr := s.insertClaims(ctx, n.claims, s.pending-n.startPending)
	if bulkErr != nil {
		if isDiskFull(bulkErr) {
			return 0, bulkErr
		}
		if _, err := st.bulkUndo.ExecContext(ctx); err != nil {
			return 0, fmt.Errorf("undo a failed spool write (%w): %w", bulkErr, err)
		}
	}
	if _, err := st.bulkRelease.ExecContext(ctx); err != nil {
		return 0, fmt.Errorf("release spool savepoint: %w", err)
	}
	if bulkErr == nil {
		for _, c := range n.claims {
			s.accepted(c)
		}
		return len(n.claims), nil
	}
	s.nextSeq, s.pending = n.startSeq, n.startPending
	for _, c := range n.claims {
		c.seq = s.nextSeq
		o := &op{fn: func(ctx context.Context, _ execer) error {
			return s.insertClaims(ctx, []*claimOp{c}, int64(len(c.entry.Payload)))
		}}
		c.err, err = s.apply(ctx, o)
		if err != nil {
			return 0, err
		}
		if c.err == nil {
			s.nextSeq++
			s.pending += int64(len(c.entry.Payload))
			s.accepted(c)
			added++
		}
	}
	for _, d := range n.dups {
		d.err = d.dupOf.err
	}
	return added, nil
}

func (s *Spool) accepted(c *claimOp) {
	s.recent.add(c.seq, c.entry.Producer, c.entry.Key)
	s.wroteForCheckpoint(int64(len(c.entry.Payload) + len(c.entry.Key) + 100))
	c.result = ClaimResult{Outcome: event.Accepted, ReceivedAt: c.receivedAt}
}

// insertClaims writes the claims' events and payload rows, and adds them to
// the totals, in statements of a power of two rows each.
func (s *Spool) insertClaims(ctx context.Context, claims []*claimOp, bytes int64) error {
	st := s.stmts
	for rest := claims; len(rest) > 0; {
		size := 1 << (bits.Len(uint(min(len(rest), 512))) - 1)
		part := rest[:size]
		rest = rest[size:]
		evs, err := bulkStmt(ctx, s.wconn, st.bulkEvents, size, `INSERT INTO events (seq, producer, key, request_hash, size, fanout, received_at) VALUES `, "(?, ?, ?, ?, ?, ?, ?)")
		if err != nil {
			return err
		}
		pls, err := bulkStmt(ctx, s.wconn, st.bulkPayloads, size, `INSERT INTO payloads (seq, payload) VALUES `, "(?, ?)")
		if err != nil {
			return err
		}
		evArgs := make([]any, 0, 7*size)
		plArgs := make([]any, 0, 2*size)
		for _, c := range part {
			e := c.entry
			evArgs = append(evArgs, c.seq, e.Producer, e.Key, e.Hash, int64(len(e.Payload)), max(1, e.Fanout), c.receivedAt.UnixNano())
			plArgs = append(plArgs, c.seq, e.Payload)
		}
		if _, err := evs.ExecContext(ctx, evArgs...); err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		if _, err := pls.ExecContext(ctx, plArgs...); err != nil {
			return fmt.Errorf("claim: %w", err)
		}
	}
	if _, err := st.addTotals.ExecContext(ctx, len(claims), bytes); err != nil {
		return fmt.Errorf("claim: count: %w", err)
	}
	return nil
}

func bulkStmt(ctx context.Context, conn *sql.Conn, cache map[int]*sql.Stmt, rows int, head, row string) (*sql.Stmt, error) {
	if stmt, ok := cache[rows]; ok {
		return stmt, nil
	}
	stmt, err := conn.PrepareContext(ctx, head+strings.TrimSuffix(strings.Repeat(row+", ", rows), ", "))
	if err != nil {
		return nil, fmt.Errorf("prepare spool statement: %w", err)
	}
	cache[rows] = stmt
	return stmt, nil
}
