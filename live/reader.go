package live

import (
	"cmp"
	"context"
	"reflect"
	"time"

	"github.com/gobwas/ws"
	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/pghistory"
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
// created: a row's created_at is its ingest transaction's start, and ingest
// runs as one statement cancelled by its timeout (the forwarder's 30 s,
// central's --db-statement-timeout), far below this. Reads look back from
// the last time the reader had read everything committed (caughtUp), not
// from now: while another transaction holds the horizon back for hours (a
// forgotten BEGIN, a backfill, an orphaned prepared transaction), rows that
// committed at the start of the hold are still read when it ends. The bound
// keeps reads to the newest weekly partitions (0.13 ms against 1.4 ms with
// 25).
const txSlack = feed.IngestSlack

// horizon is the oldest transaction still running in the statement's
// snapshot: every transaction below it has committed or aborted.
const horizon = `pg_snapshot_xmin(pg_current_snapshot())`

// readState is one statement's view: its horizon, the next transaction id
// (xmax), Postgres's time, the history and the WAL position below which lies
// everything it sees, computed once per statement.
const readState = `SELECT ` + horizon + ` AS hz, pg_snapshot_xmax(pg_current_snapshot()) AS xmax, now() AS at, ` +
	pghistory.Columns + `, ` + pghistory.WAL + `, ` + pghistory.Synchronous

// readStream is the replica's read, in commit-safe order from a position
// ($1, $2), of at most $3 rows of notifications and changes of state
// merged (Merge Append of the two tables' (tx, id) indexes), only below
// the statement's horizon: rows at or above it are not fetched, one index
// probe of each table (held) tells that some have committed and wait. The
// state and the probe are a materialized CTE: evaluated once, not once per
// row. A read always answers one row at least: the statement's state, with
// no row when none is new. A new notification's states are its own
// columns: the watermarks are not joined (one asked since follows it in
// the stream).
//
// Each range on tx has a lower and an upper bound, though one of them says
// nothing new (a row visible to the statement is below xmax; a row after
// the position has at least its tx): planned without the arguments (a
// prepared statement's generic plan), a two-sided range looks as narrow as
// the one on created_at, so the plan reads the (tx, id) index, a few
// entries, not every row created since the lower bound (it did: 7 ms a read
// with 10,000 rows from the last hour, and growing). Notifications are read
// from $4 on (created_at) and below $5 past the statement's time, so that
// Postgres reads the newest weekly partitions alone; state_events is one
// table.
var readStream = `WITH s AS MATERIALIZED (
		SELECT s.*, EXISTS (SELECT 1 FROM notifications h WHERE h.tx >= s.hz AND h.tx < s.xmax AND (h.tx, h.id) > ($1::xid8, $2::bigint)
				AND h.created_at >= $4 AND h.created_at < s.at + $5::interval)
			OR EXISTS (SELECT 1 FROM state_events h WHERE h.tx >= s.hz AND h.tx < s.xmax AND (h.tx, h.id) > ($1::xid8, $2::bigint)) AS held
		FROM (` + readState + `) s(hz, xmax, at, sys, tl, wal, sync))
	SELECT s.hz, s.xmax, s.at, s.sys, s.tl, s.wal, s.sync, s.held, r.*
	FROM s LEFT JOIN LATERAL (
		SELECT * FROM ((
			SELECT ` + streamNotificationColumns(`n.read_at, NULL::timestamptz, n.archived_at`) + ` FROM notifications n
			WHERE (n.tx, n.id) > ($1::xid8, $2::bigint) AND n.tx >= $1::xid8 AND n.tx < s.hz
			  AND n.created_at >= $4 AND n.created_at < s.at + $5::interval
			ORDER BY n.tx, n.id
			LIMIT $3
		) UNION ALL (
			SELECT ` + streamStateColumns + ` FROM state_events e
			WHERE (e.tx, e.id) > ($1::xid8, $2::bigint) AND e.tx >= $1::xid8 AND e.tx < s.hz
			ORDER BY e.tx, e.id
			LIMIT $3
		)) r
		ORDER BY r.tx, r.id
		LIMIT $3) r ON true
	ORDER BY r.tx, r.id`

// ReaderStatements are the statements the reader runs on ReaderDB at every
// wake-up, for its connection to prepare (pgpool.Config.Prepare, with
// GenericPlans): planning them, not running them, is most of what a read
// costs Postgres, and every replica reads at every wake-up (in the live
// benchmark a read cost 2 ms of Postgres CPU unnamed, 0.5 ms prepared with
// a generic plan). Their plans do not depend on their arguments: index
// ranges in (tx, id) order, the partitions below the created_at bound
// pruned as the plan starts. Left to itself, Postgres would plan the
// notifications read at every run: it rates the generic plan above a
// custom plan's cost, by estimate only.
func ReaderStatements() []string {
	return []string{readStream, readLeft}
}

// reader is the replica's one reader of newly committed rows.
type reader struct {
	hub     *Hub
	pos     Position // the last row read: a notification or a change of state
	failLog *lograte.Limiter
	// caughtUp is Postgres's time at the last read that found every
	// committed notification read: every row not read yet is from a
	// transaction running then or started since.
	caughtUp time.Time
	history  History
}

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
	st, err := readStateOf(ctx, r.hub.cfg.ReaderDB)
	if err != nil {
		return err
	}
	r.pos = Position{Tx: st.horizon}
	r.caughtUp = st.at
	r.history = st.history
	r.hub.seen(st)
	r.recordSwitch(ctx)
	return nil
}

// recordSwitch records where the primary's timeline began, if it was
// promoted moments ago (pghistory.RecordSwitch): the cursors of every socket
// it closes then resume on it. A failure only costs those cursors.
func (r *reader) recordSwitch(ctx context.Context) {
	recorded, err := pghistory.RecordSwitch(ctx, r.hub.cfg.ReaderDB)
	switch {
	case err != nil:
		r.hub.log.Warn("cannot record where the database's timeline began; cursors from before the failover will be refused", "err", err)
	case recorded:
		r.hub.log.Info("recorded where the promoted primary's timeline began: cursors from before it resume here when it kept what they saw", "timeline", r.history.Timeline)
	}
}

// dbState is what one statement saw of the database.
type dbState struct {
	horizon, xmax uint64
	at            time.Time
	history       History
	wal           uint64
	sync          bool
}

// scanTargets returns where readState's columns scan into, and the function
// that sets the history once they have.
func (st *dbState) scanTargets() (dest []any, scanned func()) {
	history, h := pghistory.Scan()
	return append(append([]any{&st.horizon, &st.xmax, &st.at}, history...), &st.wal, &st.sync), func() { st.history = h() }
}

// cursor is a cursor at pos, made by the statement that saw st.
func (st *dbState) cursor(pos Position, at time.Time) Cursor {
	return Cursor{Position: pos, At: at, History: st.history, WAL: st.wal, Synchronous: st.sync}
}

// readStateOf reads the database's state in a statement of its own.
func readStateOf(ctx context.Context, db DB) (dbState, error) {
	var st dbState
	dest, scanned := st.scanTargets()
	err := db.QueryRow(ctx, readState, pgx.QueryExecModeCacheDescribe).Scan(dest...)
	scanned()
	return st, err
}

// read reads and delivers one page of rows, notifications and changes of
// state in one order. more: the page was full, read again at once; held:
// committed rows wait behind an older transaction.
func (r *reader) read(ctx context.Context) (more, held bool, err error) {
	return r.readStream(ctx)
}

// delivery is a frame for one user's sockets, built only when they have
// one here; ok is false for a row without a frame.
type delivery struct {
	user  string
	frame func() (f frame, ok bool, err error)
}

// deliver builds and sends the frames of users with a socket here. A frame
// that cannot be built (Postgres failed reading what a watermark left out)
// closes its user's sockets, which resume from their cursors and miss
// nothing (the reader stands past the page), and fails the read once the
// other users' frames are sent.
func (r *reader) deliver(ds []delivery) error {
	var failed error
	for _, d := range ds {
		if !r.hub.connected(d.user) {
			continue
		}
		f, ok, err := d.frame()
		if err != nil {
			r.hub.closeUser(d.user, ws.StatusInternalServerError, "try again")
			failed = cmp.Or(failed, err)
			continue
		}
		if ok {
			r.hub.deliver(d.user, f)
		}
	}
	return failed
}

// readStream reads and delivers one page of rows. A row in another history
// than the one the reader stands in means a restore or a failover: the
// reader starts again at the new horizon, and every socket is closed so
// that its app resumes (and, with a cursor from the old history, starts
// over).
func (r *reader) readStream(ctx context.Context) (more, held bool, err error) {
	db := r.hub.cfg.ReaderDB
	rows, err := db.Query(ctx, readStream, r.pos.Tx, r.pos.ID, readPage, r.caughtUp.Add(-r.hub.cfg.txSlack), feed.FutureSlack)
	if err != nil {
		return false, false, err
	}
	defer rows.Close()
	var st dbState
	var read []streamRow
	for rows.Next() {
		dest, scanned := st.scanTargets()
		row, ok, err := scanStreamRow(rows, append(dest, &held))
		if err != nil {
			return false, false, err
		}
		scanned()
		if !ok {
			break // nothing new: the state alone
		}
		read = append(read, row)
	}
	if err := rows.Err(); err != nil {
		return false, false, err
	}
	rows.Close()
	if st.history != r.history {
		r.historyChanged(ctx, st)
		return false, false, nil
	}
	r.hub.seen(st)
	if len(read) > 0 {
		r.pos = read[len(read)-1].pos
	}
	more = len(read) == readPage
	if !more && !held {
		r.caughtUp = st.at
	}
	ds := make([]delivery, 0, len(read))
	for _, row := range read {
		c := st.cursor(row.pos, row.note.CreatedAt)
		if row.state == nil {
			note := row.note
			ds = append(ds, delivery{user: row.user, frame: func() (frame, bool, error) {
				f, err := notificationFrame(note, c, true)
				return f, true, err
			}})
			continue
		}
		state := *row.state
		ds = append(ds, delivery{user: row.user, frame: func() (frame, bool, error) {
			return stateFrameOf(ctx, db, state, c, r.hub.cfg.txSlack)
		}})
	}
	return more, held, r.deliver(ds)
}

// historyChanged repositions the reader in a new history and closes every
// socket, whose frames from here on could not follow their cursors.
func (r *reader) historyChanged(ctx context.Context, st dbState) {
	r.hub.log.Warn("the database's history changed (a restore, or a failover to a standby): the live stream starts again at the new horizon and every socket reconnects",
		"system_identifier_was", r.history.System, "system_identifier", st.history.System, "timeline_was", r.history.Timeline, "timeline", st.history.Timeline)
	r.pos = Position{Tx: st.horizon}
	r.caughtUp, r.history = st.at, st.history
	r.hub.seen(st)
	r.recordSwitch(ctx)
	r.hub.closeAll(StatusTryAgainLater, "the database failed over; reconnect")
}

// orNull scans columns that a LEFT JOIN leaves NULL when it matched
// nothing into targets that cannot hold NULL: each such target gets a
// pointer to scan into, copied in by fill once the row is known to be one.
type orNull struct{ holders, targets []reflect.Value }

// wrap returns what to scan into in place of targets (pointers; a target
// that is a pointer to a pointer takes NULL as it is).
func (o *orNull) wrap(targets []any) []any {
	out := make([]any, len(targets))
	for i, t := range targets {
		v := reflect.ValueOf(t)
		if v.Elem().Kind() == reflect.Pointer {
			out[i] = t
			continue
		}
		h := reflect.New(v.Type()) // **T
		o.holders, o.targets = append(o.holders, h), append(o.targets, v)
		out[i] = h.Interface()
	}
	return out
}

// fill copies what was scanned into the targets.
func (o *orNull) fill() {
	for i, h := range o.holders {
		if p := h.Elem(); !p.IsNil() {
			o.targets[i].Elem().Set(p.Elem())
		}
	}
}
