package spool

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/spoolcast/spoolcast/event"
)

// Entry is what a claim spools: the producer-scoped key, the hash of the
// canonical request, and the payload to forward.
type Entry struct {
	Producer string
	Key      string
	Hash     []byte
	Payload  []byte
	// Fanout is how many rows the entry becomes downstream (an event's
	// recipients); forwarding batches are capped by its sum. Default 1.
	Fanout int
}

// ClaimResult is the answer to a claim. ReceivedAt is when the relay first
// received the key: now for Accepted, the winner's time otherwise.
type ClaimResult struct {
	Outcome    event.Outcome
	ReceivedAt time.Time
}

type claimOp struct {
	entry      Entry
	receivedAt time.Time
	// merged is the key index's merged seq when Claim looked the key up
	// there; the writer looks again only if a merge has run since.
	merged int64
	result ClaimResult
}

// Claim spools e unless its key is already claimed. It returns after the
// transaction that carries it has committed, so Accepted means durable. When the
// spool is full, a new key gets ErrFull, while a key already spooled is still
// answered Duplicate or Conflict. A full disk is ErrDiskFull.
//
// Once handed to the writer, a claim commits or fails whatever happens to ctx;
// ctx only bounds the wait for the answer.
func (s *Spool) Claim(ctx context.Context, e Entry) (ClaimResult, error) {
	if e.Producer == "" || e.Key == "" {
		return ClaimResult{}, errors.New("claim: producer and key are required")
	}
	c := &claimOp{entry: e, receivedAt: s.cfg.Clock.Now(), merged: s.keys.indexed.Load()}
	// A key claimed before the last merge is answered here, on the caller's
	// goroutine, from committed rows: duplicates never wait for the writer,
	// and new keys reach it already looked up in the key index.
	select {
	case <-s.closing:
		return ClaimResult{}, ErrClosed
	default:
	}
	w, err := s.mergedWinner(ctx, s.reader.bySeq, e.Producer, e.Key)
	if err != nil {
		select {
		case <-s.closing: // the files closed under the lookup
			return ClaimResult{}, ErrClosed
		default:
		}
		return ClaimResult{}, fmt.Errorf("claim %q: %w", e.Key, err)
	}
	if w.found {
		return w.result(e.Hash), nil
	}
	if err := s.submit(ctx, &op{claim: c}); err != nil {
		return ClaimResult{}, err
	}
	return c.result, nil
}

func (w winner) result(hash []byte) ClaimResult {
	r := ClaimResult{Outcome: event.Conflict, ReceivedAt: time.Unix(0, w.receivedAt)}
	if bytes.Equal(w.hash, hash) {
		r.Outcome = event.Duplicate
	}
	return r
}

// writerStmts are the writer's statements, prepared once on its connection.
// savepoint, release and undo wrap each op of a batch (see runBatch).
type writerStmts struct {
	insert, insertPayload, bySeq, totals *sql.Stmt
	savepoint, release, undo             *sql.Stmt
}

func prepareWriter(ctx context.Context, conn *sql.Conn) (*writerStmts, error) {
	var st writerStmts
	for _, p := range []struct {
		dst   **sql.Stmt
		query string
	}{
		{&st.insert, `INSERT INTO events (seq, producer, key, request_hash, size, fanout, received_at) VALUES (?, ?, ?, ?, ?, ?, ?)`},
		{&st.insertPayload, `INSERT INTO payloads (seq, payload) VALUES (?, ?)`},
		{&st.bySeq, `SELECT producer, key, request_hash, received_at FROM events WHERE seq = ?`},
		{&st.totals, `SELECT pending_bytes FROM totals WHERE id = 1`},
		{&st.savepoint, `SAVEPOINT op`},
		{&st.release, `RELEASE op`},
		{&st.undo, `ROLLBACK TO op`},
	} {
		stmt, err := conn.PrepareContext(ctx, p.query)
		if err != nil {
			st.close()
			return nil, fmt.Errorf("prepare spool statement: %w", err)
		}
		*p.dst = stmt
	}
	return &st, nil
}

func (st *writerStmts) close() {
	for _, s := range []*sql.Stmt{st.insert, st.insertPayload, st.bySeq, st.totals, st.savepoint, st.release, st.undo} {
		if s != nil {
			s.Close()
		}
	}
}

// applyClaim runs one claim inside the writer's transaction. The loser of a
// race (an earlier row, or an earlier claim in the same batch) reads the
// winner's hash. A new key is inserted only if its payload fits under
// MaxBytes. It advances nextSeq and pending, and remembers the key, only once
// both rows are in; on an error the caller undoes what it wrote (runBatch's
// savepoint).
func (s *Spool) applyClaim(ctx context.Context, c *claimOp) (isNew bool, err error) {
	e, st := c.entry, s.stmts
	w, err := s.recentWinner(ctx, e.Producer, e.Key)
	if err == nil && !w.found && s.keys.indexed.Load() != c.merged {
		w, err = s.mergedWinner(ctx, st.bySeq, e.Producer, e.Key)
	}
	if err != nil {
		return false, fmt.Errorf("claim %q: %w", e.Key, err)
	}
	if w.found {
		c.result = w.result(e.Hash)
		return false, nil
	}
	size := int64(len(e.Payload))
	if s.pending+size > s.cfg.MaxBytes {
		return false, ErrFull
	}
	if s.recent.len() >= s.unmergedLimit() {
		return false, ErrKeysBehind
	}
	if _, err := st.insert.ExecContext(ctx, s.nextSeq, e.Producer, e.Key, e.Hash, size, max(1, e.Fanout), c.receivedAt.UnixNano()); err != nil {
		return false, fmt.Errorf("claim %q: %w", e.Key, err)
	}
	if _, err := st.insertPayload.ExecContext(ctx, s.nextSeq, e.Payload); err != nil {
		return false, fmt.Errorf("claim %q: %w", e.Key, err)
	}
	s.recent.add(s.nextSeq, e.Producer, e.Key)
	s.wroteForCheckpoint(size + int64(len(e.Key)) + 100)
	s.nextSeq++
	s.pending += size
	c.result = ClaimResult{Outcome: event.Accepted, ReceivedAt: c.receivedAt}
	return true, nil
}
