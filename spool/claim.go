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
	result     ClaimResult
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
	c := &claimOp{entry: e, receivedAt: s.cfg.Clock.Now()}
	if err := s.submit(ctx, &op{claim: c}); err != nil {
		return ClaimResult{}, err
	}
	return c.result, nil
}

// writerStmts are the writer's statements, prepared once on its connection.
// savepoint, release and undo wrap each op of a batch (see runBatch).
type writerStmts struct {
	insert, insertPayload, lookup, totals *sql.Stmt
	savepoint, release, undo              *sql.Stmt
}

func prepareWriter(ctx context.Context, conn *sql.Conn) (*writerStmts, error) {
	var st writerStmts
	for _, p := range []struct {
		dst   **sql.Stmt
		query string
	}{
		{&st.insert, `INSERT OR IGNORE INTO events (seq, producer, key, request_hash, size, fanout, received_at) VALUES (?, ?, ?, ?, ?, ?, ?)`},
		{&st.insertPayload, `INSERT INTO payloads (seq, payload) VALUES (?, ?)`},
		{&st.lookup, `SELECT request_hash, received_at FROM events WHERE producer = ? AND key = ?`},
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
	for _, s := range []*sql.Stmt{st.insert, st.insertPayload, st.lookup, st.totals, st.savepoint, st.release, st.undo} {
		if s != nil {
			s.Close()
		}
	}
}

// applyClaim runs one claim inside the writer's transaction. The loser of a race
// (an earlier row, or an earlier claim in the same batch) reads the winner's
// hash. A new key is inserted only if its payload fits under MaxBytes. It
// advances nextSeq and pending only once both rows are in; on an error the
// caller undoes what it wrote (runBatch's savepoint).
func (s *Spool) applyClaim(ctx context.Context, c *claimOp) (isNew bool, err error) {
	e, st := c.entry, s.stmts
	size := int64(len(e.Payload))
	if s.pending+size <= s.cfg.MaxBytes {
		res, err := st.insert.ExecContext(ctx, s.nextSeq, e.Producer, e.Key, e.Hash, size, max(1, e.Fanout), c.receivedAt.UnixNano())
		if err != nil {
			return false, fmt.Errorf("claim %q: %w", e.Key, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return false, fmt.Errorf("claim %q: %w", e.Key, err)
		}
		if n == 1 {
			if _, err := st.insertPayload.ExecContext(ctx, s.nextSeq, e.Payload); err != nil {
				return false, fmt.Errorf("claim %q: %w", e.Key, err)
			}
			s.nextSeq++
			s.pending += size
			c.result = ClaimResult{Outcome: event.Accepted, ReceivedAt: c.receivedAt}
			return true, nil
		}
	}
	var hash []byte
	var receivedAt int64
	err = st.lookup.QueryRowContext(ctx, e.Producer, e.Key).Scan(&hash, &receivedAt)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// Only reachable when the payload did not fit: the key is new.
		return false, ErrFull
	case err != nil:
		return false, fmt.Errorf("claim %q: read winner: %w", e.Key, err)
	}
	c.result = ClaimResult{Outcome: event.Conflict, ReceivedAt: time.Unix(0, receivedAt)}
	if bytes.Equal(hash, e.Hash) {
		c.result.Outcome = event.Duplicate
	}
	return false, nil
}
