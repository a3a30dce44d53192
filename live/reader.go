package live

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

const (
	// readPage is the most rows one read takes from each table.
	readPage = 1000
	// minReadGap is the least time between two reads: wake-ups from many
	// ingress points coalesce into one read.
	minReadGap = 2 * time.Millisecond
	// heldRetry is the first wait before reading again while committed rows
	// wait behind an older transaction; it doubles up to the poll interval.
	heldRetry = 2 * time.Millisecond
	// minBackoff and maxBackoff bound the wait after failed reads.
	minBackoff, maxBackoff = 100 * time.Millisecond, 5 * time.Second
)

// txSlack bounds how long before its commit a streamed row may have been
// created: a row's created_at is its transaction's start, and reads look
// only that far back, so that Postgres plans them over the newest weekly
// partitions instead of all of them (0.13 ms against 1.4 ms with 25). Ingest
// statements time out after seconds (the forwarder's 30 s, central's
// --db-statement-timeout), so no row of theirs is older at commit; a row
// written by a transaction open longer than this is in the feed but not
// streamed.
const txSlack = time.Hour

// horizon is the oldest transaction still running in the statement's
// snapshot: every transaction below it has committed or aborted.
const horizon = `pg_snapshot_xmin(pg_current_snapshot())`

// The replica's reads, each in commit-safe order from a position. Rows at or
// above the horizon are read too, only to learn that committed rows wait;
// they are not delivered until the horizon passes them. A new notification's
// read state is its own read_at: the read-all watermark is not joined.
const (
	readNotifications = `SELECT n.tx, n.user_id, ` + feed.NotificationFields + `, n.read_at, ` + horizon + `
		FROM notifications n
		WHERE (n.tx, n.id) > ($1::xid8, $2::bigint) AND n.created_at > $4 AND n.created_at < $5
		ORDER BY n.tx, n.id
		LIMIT $3`
	readReadEvents = `SELECT r.tx, r.id, r.user_id, coalesce(r.read_id, ''), coalesce(r.through_id, ''), ` + horizon + `
		FROM read_events r
		WHERE (r.tx, r.id) > ($1::xid8, $2::bigint)
		ORDER BY r.tx, r.id
		LIMIT $3`
)

// reader is the replica's one reader of newly committed rows.
type reader struct {
	hub     *Hub
	notes   Position // the last notification read
	reads   Position // the last read-state change read
	failLog *lograte.Limiter
	// skew is Postgres's clock minus this process's, measured at start: the
	// bounds on created_at are Postgres times.
	skew atomic.Int64
}

// now is Postgres's time, as the hub's clock corrected by the skew.
func (r *reader) now() time.Time { return r.hub.cfg.Clock.Now().Add(time.Duration(r.skew.Load())) }

// newest bounds the created_at of rows a read may find.
func (r *reader) newest() time.Time { return r.now().Add(feed.FutureSlack) }

// run positions the reader at the horizon, then reads on every wake-up, on
// the poll interval, and soon again while committed rows wait behind an
// older transaction.
func (r *reader) run(ctx context.Context) {
	h := r.hub
	clk := h.cfg.Clock
	r.failLog = lograte.New(30 * time.Second)
	for failures := 1; ; failures++ {
		err := r.position(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		r.failed(err)
		if !startstop.Sleep(ctx, clk, startstop.Backoff(failures, minBackoff, maxBackoff)) {
			return
		}
	}
	h.serving = ctx // resumes run under the loops' context; Serve reads it once ready
	close(h.ready)
	var wait time.Duration
	var errs, heldWaits int
	var last time.Time
	for {
		if wait > 0 && !r.await(ctx, wait) {
			return
		}
		if gap := minReadGap - clock.Since(clk, last); gap > 0 && !startstop.Sleep(ctx, clk, gap) {
			return
		}
		last = clk.Now()
		more, held, err := r.read(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			h.metrics.reads.WithLabelValues("error").Inc()
			r.failed(err)
			errs++
			wait = startstop.Backoff(errs, minBackoff, maxBackoff)
			continue
		}
		h.metrics.reads.WithLabelValues("ok").Inc()
		h.metrics.held(held, last)
		errs = 0
		switch {
		case more:
			wait, heldWaits = 0, 0
		case held:
			wait = min(heldRetry<<min(heldWaits, 10), h.cfg.PollInterval)
			heldWaits++
		default:
			wait, heldWaits = h.cfg.PollInterval, 0
		}
	}
}

// await waits d, or less when a wake-up comes; false when ctx ended first.
func (r *reader) await(ctx context.Context, d time.Duration) bool {
	t := r.hub.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-r.hub.cfg.Wake:
	case <-t.C():
	}
	return true
}

func (r *reader) failed(err error) {
	r.failLog.Do(func(suppressed int64) {
		r.hub.log.Warn("live reader cannot read Postgres; sockets get no frames until it can, then every one missed", "err", err, "suppressed", suppressed)
	})
}

// position starts the reader at the horizon: what committed before it is
// for the feed and for resumes.
func (r *reader) position(ctx context.Context) error {
	var h uint64
	var now time.Time
	if err := r.hub.cfg.DB.QueryRow(ctx, `SELECT `+horizon+`, now()`).Scan(&h, &now); err != nil {
		return err
	}
	r.skew.Store(int64(clock.Until(r.hub.cfg.Clock, now)))
	r.notes = Position{Tx: h}
	r.reads = Position{Tx: h}
	return nil
}

// read reads and delivers one page of each table. more: a page was full,
// read again at once; held: committed rows wait behind an older transaction.
func (r *reader) read(ctx context.Context) (more, held bool, err error) {
	moreN, heldN, err := r.readNotifications(ctx)
	if err != nil {
		return false, false, err
	}
	moreR, heldR, err := r.readReadEvents(ctx)
	if err != nil {
		return false, false, err
	}
	return moreN || moreR, heldN || heldR, nil
}

// committedRow is one row of a commit-order read: where it stands, whose it
// is, the read's horizon, and the frame it becomes (built only for a user
// with a socket here).
type committedRow struct {
	pos     Position
	user    string
	horizon uint64
	frame   func() (frame, error)
}

// readCommitted reads one page of query in commit order after *at and
// delivers each row below the read's horizon, moving *at past it. It stops
// at the first row at or above the horizon: held, a later read returns it.
func (r *reader) readCommitted(ctx context.Context, at *Position, query string, args []any, scan func(pgx.Rows) (committedRow, error)) (more, held bool, err error) {
	rows, err := r.hub.cfg.DB.Query(ctx, query, append([]any{at.Tx, at.ID, readPage}, args...)...)
	if err != nil {
		return false, false, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		n++
		row, err := scan(rows)
		if err != nil {
			return false, false, err
		}
		if row.pos.Tx >= row.horizon {
			held = true
			break
		}
		*at = row.pos
		if !r.hub.connected(row.user) {
			continue
		}
		f, err := row.frame()
		if err != nil {
			return false, false, err
		}
		r.hub.deliver(row.user, f)
	}
	if err := rows.Err(); err != nil {
		return false, false, err
	}
	return n == readPage && !held, held, nil
}

func (r *reader) readNotifications(ctx context.Context) (more, held bool, err error) {
	now := r.now()
	return r.readCommitted(ctx, &r.notes, readNotifications, []any{now.Add(-txSlack), now.Add(feed.FutureSlack)}, func(rows pgx.Rows) (committedRow, error) {
		var row committedRow
		var note feed.Notification
		dest := append([]any{&row.pos.Tx, &row.user}, note.ScanTargets()...)
		if err := rows.Scan(append(dest, &row.horizon)...); err != nil {
			return row, err
		}
		row.pos.ID = note.ID
		row.frame = func() (frame, error) {
			return notificationFrame(note, Cursor{Position: row.pos, At: note.CreatedAt}, true)
		}
		return row, nil
	})
}

func (r *reader) readReadEvents(ctx context.Context) (more, held bool, err error) {
	return r.readCommitted(ctx, &r.reads, readReadEvents, nil, func(rows pgx.Rows) (committedRow, error) {
		var row committedRow
		msg := readMessage{Type: "read"}
		if err := rows.Scan(&row.pos.Tx, &row.pos.ID, &row.user, &msg.ID, &msg.Through, &row.horizon); err != nil {
			return row, err
		}
		row.frame = func() (frame, error) {
			b, err := textFrame(msg)
			return frame{kind: kindRead, bytes: b}, err
		}
		return row, nil
	})
}
