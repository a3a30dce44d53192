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
	// Set by the writer: the seq a new key will take, or the claim of the
	// same batch whose key this one repeats.
	seq   int64
	dupOf *claimOp
	err   error // the claim's own failure, for the claims that repeat it
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
	insert, insertPayload, bySeq, totals, addTotals *sql.Stmt
	savepoint, release, undo                        *sql.Stmt
	bulkSavepoint, bulkRelease, bulkUndo            *sql.Stmt
	// bulk holds multi-row inserts of events and payloads, by row count (a
	// power of two), prepared when first needed.
	bulkEvents, bulkPayloads map[int]*sql.Stmt
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
		{&st.addTotals, `UPDATE totals SET pending_rows = pending_rows + ?, pending_bytes = pending_bytes + ? WHERE id = 1`},
		{&st.bulkSavepoint, `SAVEPOINT bulk`},
		{&st.bulkRelease, `RELEASE bulk`},
		{&st.bulkUndo, `ROLLBACK TO bulk`},
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
	st.bulkEvents, st.bulkPayloads = map[int]*sql.Stmt{}, map[int]*sql.Stmt{}
	return &st, nil
}

func (st *writerStmts) close() {
	all := []*sql.Stmt{st.insert, st.insertPayload, st.bySeq, st.totals, st.addTotals, st.savepoint, st.release, st.undo,
		st.bulkSavepoint, st.bulkRelease, st.bulkUndo}
	for _, m := range []map[int]*sql.Stmt{st.bulkEvents, st.bulkPayloads} {
		for _, s := range m {
			all = append(all, s)
		}
	}
	for _, s := range all {
		if s != nil {
			s.Close()
		}
	}
}
