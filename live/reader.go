package live

import (
	"context"
	"reflect"
	"time"

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

// The replica's reads, each in commit-safe order from a position ($1, $2),
// at most $3 rows, only below the statement's horizon: rows at or above it
// are not fetched, one index probe (held) tells that some have committed and
// wait. The state and the probe are a materialized CTE: evaluated once, not
// once per row. A read always answers one row at least: the statement's state, with
// no notification when none is new. A new notification's read state is its
// own read_at: read-all is not joined.
//
// Each range on tx has a lower and an upper bound, though one of them says
// nothing new (a row visible to the statement is below xmax; a row after
// the position has at least its tx): planned without the arguments (a
// prepared statement's generic plan), a two-sided range looks as narrow as
// the one on created_at, so the plan reads the (tx, id) index, a few
// entries, not every row created since the lower bound (it did: 7 ms a read
// with 10,000 rows from the last hour, and growing).
const (
	readNotifications = `WITH s AS MATERIALIZED (
			SELECT s.*, EXISTS (SELECT 1 FROM notifications h WHERE h.tx >= s.hz AND h.tx < s.xmax AND (h.tx, h.id) > ($1::xid8, $2::bigint)
				AND h.created_at >= $4 AND h.created_at < s.at + $5::interval) AS held
			FROM (` + readState + `) s(hz, xmax, at, sys, tl, wal, sync))
		SELECT s.hz, s.xmax, s.at, s.sys, s.tl, s.wal, s.sync, s.held, n.tx, n.user_id, ` + feed.NotificationFields + `, n.read_at, NULL::timestamptz, n.archived_at
		FROM s LEFT JOIN LATERAL (
			SELECT n.* FROM notifications n
			WHERE (n.tx, n.id) > ($1::xid8, $2::bigint) AND n.tx >= $1::xid8 AND n.tx < s.hz
			  AND n.created_at >= $4 AND n.created_at < s.at + $5::interval
			ORDER BY n.tx, n.id
			LIMIT $3) n ON true
		ORDER BY n.tx, n.id`
	readReadEvents = `WITH s AS MATERIALIZED (
			SELECT s.hz, EXISTS (SELECT 1 FROM state_events h WHERE h.tx >= s.hz AND h.tx < s.xmax AND (h.tx, h.id) > ($1::xid8, $2::bigint)) AS held
			FROM (SELECT least(` + horizon + `, $4::xid8), pg_snapshot_xmax(pg_current_snapshot())) s(hz, xmax))
		SELECT s.hz, s.held,
			r.tx, r.id, r.user_id, CASE WHEN r.kind = 'read' THEN spoolcast_public_id(r.note_at, r.note_seq) ELSE '' END, '',
			CASE WHEN r.kind = 'read_all' THEN r.note_at END, CASE WHEN r.kind = 'read_all' THEN r.note_seq END, r.snapshot::text
		FROM s LEFT JOIN LATERAL (
			SELECT r.* FROM state_events r
			WHERE (r.tx, r.id) > ($1::xid8, $2::bigint) AND r.tx >= $1::xid8 AND r.tx < s.hz AND r.kind IN ('read', 'read_all')
			ORDER BY r.tx, r.id
			LIMIT $3) r ON true
		ORDER BY r.tx, r.id`
	// readAllLeft lists what a read-all (snapshot $2, covering through ($3,
	// $4) in feed order) left unread: the user's notifications that committed
	// after it was asked though older in feed order.
	readAllLeft = `SELECT n.created_at, n.id FROM notifications n
		WHERE n.user_id = $1 AND n.tx >= pg_snapshot_xmin($2::pg_snapshot)
		  AND (n.created_at, n.id) <= ($3, $4) AND NOT pg_visible_in_snapshot(n.tx, $2::pg_snapshot)
		ORDER BY n.tx, n.id LIMIT 100`
)

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
	return []string{readNotifications, readReadEvents, readAllLeft}
}

// reader is the replica's one reader of newly committed rows.
type reader struct {
	hub     *Hub
	notes   Position // the last notification read
	reads   Position // the last read-state change read
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
	r.notes = Position{Tx: st.horizon}
	r.reads = Position{Tx: st.horizon}
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

// read reads and delivers one page of each table. more: a page was full,
// read again at once; held: committed rows wait behind an older transaction.
//
// Read-state changes are read only below where the notifications were read
// (that read's horizon, or its last row when the page was full): a read-all
// frame never overtakes a notification it covers, whose own frame says
// unread.
func (r *reader) read(ctx context.Context) (more, held bool, err error) {
	moreN, heldN, bound, err := r.readNotifications(ctx)
	if err != nil {
		return false, false, err
	}
	moreR, heldR, err := r.readReadEvents(ctx, bound)
	if err != nil {
		return false, false, err
	}
	return moreN || moreR, heldN || heldR, nil
}

// delivery is a frame for one user's sockets.
type delivery struct {
	user  string
	frame func() (frame, error)
}

// deliver builds and sends the frames of users with a socket here.
func (r *reader) deliver(ds []delivery) error {
	for _, d := range ds {
		if !r.hub.connected(d.user) {
			continue
		}
		f, err := d.frame()
		if err != nil {
			return err
		}
		r.hub.deliver(d.user, f)
	}
	return nil
}

// readNotifications reads and delivers one page of notifications. A row in
// another history than the one the reader stands in means a restore or a
// failover: the reader starts again at the new horizon, and every socket is
// closed so that its app resumes (and, with a cursor from the old history,
// starts over).
func (r *reader) readNotifications(ctx context.Context) (more, held bool, bound uint64, err error) {
	rows, err := r.hub.cfg.ReaderDB.Query(ctx, readNotifications, r.notes.Tx, r.notes.ID, readPage, r.caughtUp.Add(-r.hub.cfg.txSlack), feed.FutureSlack)
	if err != nil {
		return false, false, 0, err
	}
	defer rows.Close()
	var st dbState
	var ds []delivery
	n := 0
	for rows.Next() {
		var tx *uint64
		var user *string
		var note feed.Notification
		var fields orNull
		dest, scanned := st.scanTargets()
		dest = append(dest, &held, &tx, &user)
		if err := rows.Scan(append(dest, fields.wrap(note.ScanTargets())...)...); err != nil {
			return false, false, 0, err
		}
		scanned()
		if tx == nil {
			break // nothing new: the state alone
		}
		fields.fill()
		n++
		pos := Position{Tx: *tx, ID: note.ID}
		r.notes = pos
		c := st.cursor(pos, note.CreatedAt)
		ds = append(ds, delivery{user: *user, frame: func() (frame, error) { return notificationFrame(note, c, true) }})
	}
	if err := rows.Err(); err != nil {
		return false, false, 0, err
	}
	rows.Close()
	if st.history != r.history {
		r.historyChanged(ctx, st)
		return false, false, 0, nil
	}
	r.hub.seen(st)
	more = n == readPage
	bound = st.horizon
	if more {
		bound = r.notes.Tx
	} else if !held {
		r.caughtUp = st.at
	}
	return more, held, bound, r.deliver(ds)
}

// historyChanged repositions the reader in a new history and closes every
// socket, whose frames from here on could not follow their cursors.
func (r *reader) historyChanged(ctx context.Context, st dbState) {
	r.hub.log.Warn("the database's history changed (a restore, or a failover to a standby): the live stream starts again at the new horizon and every socket reconnects",
		"system_identifier_was", r.history.System, "system_identifier", st.history.System, "timeline_was", r.history.Timeline, "timeline", st.history.Timeline)
	r.notes, r.reads = Position{Tx: st.horizon}, Position{Tx: st.horizon}
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

// readReadEvents reads and delivers one page of read-state changes. A
// read-all's frame names what it left unread (committed after it was asked),
// read once every transaction it could not see has ended.
func (r *reader) readReadEvents(ctx context.Context, bound uint64) (more, held bool, err error) {
	rows, err := r.hub.cfg.ReaderDB.Query(ctx, readReadEvents, r.reads.Tx, r.reads.ID, readPage, bound)
	if err != nil {
		return false, false, err
	}
	defer rows.Close()
	type readAll struct {
		msg      *readMessage
		user     string
		snapshot string
		at       time.Time
		seq      int64
	}
	var ds []delivery
	var alls []readAll
	var hz uint64
	n := 0
	for rows.Next() {
		var tx *uint64
		var id, throughSeq *int64
		var user, readID, throughID, snapshot *string
		var throughAt *time.Time
		if err := rows.Scan(&hz, &held, &tx, &id, &user, &readID, &throughID, &throughAt, &throughSeq, &snapshot); err != nil {
			return false, false, err
		}
		if tx == nil {
			break
		}
		n++
		r.reads = Position{Tx: *tx, ID: *id}
		msg := &readMessage{Type: "read", ID: *readID, Through: *throughID}
		if throughAt != nil && throughSeq != nil {
			msg.Through = feed.ID{CreatedAt: *throughAt, Seq: *throughSeq}.String()
			if snapshot != nil && r.hub.connected(*user) {
				alls = append(alls, readAll{msg: msg, user: *user, snapshot: *snapshot, at: *throughAt, seq: *throughSeq})
			}
		}
		ds = append(ds, delivery{user: *user, frame: func() (frame, error) { return textFrame(kindRead, msg, "") }})
	}
	if err := rows.Err(); err != nil {
		return false, false, err
	}
	rows.Close()
	for _, a := range alls {
		left, err := r.hub.cfg.ReaderDB.Query(ctx, readAllLeft, a.user, a.snapshot, a.at, a.seq)
		if err != nil {
			return false, false, err
		}
		ids, err := pgx.CollectRows(left, func(row pgx.CollectableRow) (string, error) {
			var id feed.ID
			err := row.Scan(&id.CreatedAt, &id.Seq)
			return id.String(), err
		})
		if err != nil {
			return false, false, err
		}
		a.msg.Unread = ids
	}
	return n == readPage, held, r.deliver(ds)
}
