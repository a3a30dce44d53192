package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/spool"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// errRefusedEverything: Postgres refused every row it was given and nothing
// shows the rows are at fault; the batch is given back and tried again later.
var errRefusedEverything = errors.New("Postgres refuses every row of the batch")

// errTooSlow: a statement ran past the ingest timeout or was cancelled by
// Postgres; the batch is retried in smaller statements.
var errTooSlow = errors.New("the ingest statement ran too long")

// Reasons a row is set aside as dead, the values of the metric's reason label.
const (
	deadInvalid  = "invalid"  // the spooled payload no longer parses or breaks a rule
	deadRefused  = "refused"  // Postgres refuses the row for good
	deadConflict = "conflict" // Postgres holds the key for a different request
)

// refusal is a row Postgres refused on its own.
type refusal struct {
	rec spool.Record
	err error
}

// forgetRefusals drops what was remembered of rows that have now landed.
func (f *Forwarder) forgetRefusals(seqs []int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.streak = 0
	if len(f.refused) == 0 {
		return
	}
	for _, seq := range seqs {
		delete(f.refused, seq)
	}
}

// atFault decides whether a refused row is to blame: rows beside it landed, or
// rows landed since it was first refused. Otherwise it remembers the refusal.
func (f *Forwarder) atFault(seq int64, othersLanded bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	first, seen := f.refused[seq]
	if othersLanded || (seen && f.landed.Load() > first.UnixNano()) {
		delete(f.refused, seq)
		return true
	}
	if !seen {
		f.refused[seq] = f.clock.Now()
	}
	return false
}

// send writes rows in one ingest transaction, halving on a refusal for good to
// find the rows at fault. It returns the seqs that landed and the rows refused
// on their own; err is a failure worth retrying as it is (errTooSlow when the
// statement ran too long).
func (f *Forwarder) send(ctx context.Context, rows []spool.Record, items []ingest.Item, acks *batchAcks) (landed []int64, refused []refusal, err error) {
	if len(rows) == 0 {
		return nil, nil, nil
	}
	start := f.clock.Now()
	seqs := make([]int64, len(rows))
	for i, rec := range rows {
		seqs[i] = rec.Seq
	}
	ictx, cancel := context.WithTimeout(ctx, f.cfg.IngestTimeout)
	results, err := ingest.Ingest(ictx, f.cfg.DB, items)
	timedOut := ictx.Err() != nil && ctx.Err() == nil
	cancel()
	if err == nil && slices.ContainsFunc(results, func(r ingest.Result) bool { return r.Outcome == event.Accepted }) {
		f.wake.Committed()
	}
	if err != nil {
		if !refusedForGood(err) {
			if markErr := f.cfg.Spool.MarkFailed(ctx, seqs); markErr != nil {
				f.log.Debug("count failed attempt", "err", markErr)
			}
			if timedOut || queryCanceled(err) {
				err = fmt.Errorf("%w (%d events): %w", errTooSlow, len(rows), err)
			}
			return nil, nil, err
		}
		if len(rows) == 1 {
			return nil, []refusal{{rows[0], err}}, nil
		}
		mid := len(rows) / 2
		l1, r1, err := f.send(ctx, rows[:mid], items[:mid], acks)
		if err != nil {
			return l1, r1, err
		}
		l2, r2, err := f.send(ctx, rows[mid:], items[mid:], acks)
		return append(l1, l2...), append(r1, r2...), err
	}
	committed := f.clock.Now()
	f.landed.Store(committed.UnixNano())
	f.forgetRefusals(seqs)
	f.checkHistory(ctx)
	if f.cfg.AfterIngest != nil {
		f.cfg.AfterIngest()
	}
	f.cfg.Metrics.observeBatch(rows, items, results, committed, clock.Since(f.clock, start))
	f.testSignals.landed.Signal(len(rows))
	// The rows are in Postgres. The worker moves on while the spool commits the
	// acknowledgement; if that fails, the rows are read again once no batch is
	// in flight, and re-sent harmlessly. A conflict is set aside as dead: the
	// producer was answered 202 for an event Postgres will never store.
	forwarded := make([]int64, 0, len(rows))
	var conflicts []spool.Record
	for i, r := range results {
		if r.Outcome == event.Conflict {
			conflicts = append(conflicts, rows[i])
		} else {
			forwarded = append(forwarded, rows[i].Seq)
		}
	}
	acks.Go(func() {
		ctx := context.WithoutCancel(ctx)
		if err := f.cfg.Spool.MarkForwarded(ctx, forwarded); err != nil {
			f.log.Warn("acknowledge forwarded batch; it will be sent again", "err", err)
		}
		for _, rec := range conflicts {
			if err := f.bury(ctx, rec, deadConflict, errConflict); err != nil {
				f.log.Warn("set aside a conflicting event; it will be sent again", "err", err)
			}
		}
	})
	return seqs, nil, nil
}

var errConflict = errors.New("Postgres holds this key for a different request (another relay of the producer, or the key reused after the relay's key TTL); nothing was written")

// bury sets aside a row that can never be forwarded, with why. It stays in
// the spool with the reason for --dead-ttl, for an operator (`spoolcast spool
// ls --dead`; `spoolcast spool requeue --dead` puts it back); losing it
// silently would be worse.
func (f *Forwarder) bury(ctx context.Context, rec spool.Record, reason string, cause error) error {
	if err := f.cfg.Spool.MarkDead(ctx, rec.Seq, reason+": "+cause.Error()); err != nil {
		return fmt.Errorf("set aside dead row %d: %w", rec.Seq, err)
	}
	f.cfg.Metrics.dead.WithLabelValues(reason).Inc()
	f.log.Error("event set aside as dead in the spool (spoolcast spool ls --dead)",
		"reason", reason, "producer", rec.Producer, "key", rec.Key, "seq", rec.Seq, "err", cause)
	return nil
}

// refusedForGood reports whether Postgres refused a batch for its content —
// bad data, a broken constraint, a limit, a statement too large to send — so
// that sending it again as it is would fail again. Anything else (a
// connection, a timeout, a missing table, a server gone or read-only; see
// serverAtFault) may pass later. Every claim uses ON CONFLICT, so not even a
// unique violation (23505) comes from a race.
func refusedForGood(err error) bool {
	if serverAtFault(err) {
		return false
	}
	if strings.Contains(err.Error(), "message body too large") {
		return true // pgx refuses to send a message over 1 GiB
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54": // data exception, integrity constraint violation, program limit exceeded
		return true
	}
	return false
}

// serverAtFault reports a failure of the server, or of the way to it,
// whatever the batch held: no connection could be made (a ConnectError,
// even one carrying the server's answer to the startup, such as a bad
// option's 22023), the connection broke (class 08, an EOF, a reset, a
// refusal), the server is going away or coming up (class 57), or it takes
// no writes (class 25: a standby, or a primary fenced during a failover).
// The batch waits out its backoff and is sent again, by then to the new
// primary (the pool follows target_session_attrs=read-write); never is a
// row set aside for it.
func serverAtFault(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error // also a bare errno such as ECONNRESET
	if errors.As(err, &connectErr) || errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "08", "25", "57": // connection exception, invalid transaction state, operator intervention
		return true
	}
	return false
}

// queryCanceled reports a statement Postgres cancelled: statement_timeout, or
// a cancel request.
func queryCanceled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014"
}
