package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pghistory"
	"github.com/spoolcast/spoolcast/internal/weekly"
)

// Limits of a page.
const (
	DefaultLimit = 20
	MaxLimit     = 100
	// UnreadCap is the most unread rows counted; past it the count says "capped".
	UnreadCap = 100
)

// ErrNotFound: no such notification for this user (another user's is not found either).
var ErrNotFound = errors.New("notification not found")

// DB is what the feed needs of Postgres: a pgxpool.Pool or a pgx.Conn.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Notification is one row of a user's feed.
type Notification struct {
	ID         int64           `json:"-"`
	Type       string          `json:"type"`
	Category   string          `json:"category"`
	Title      string          `json:"title"`
	Body       string          `json:"body"`
	Data       json.RawMessage `json:"data"`
	Producer   string          `json:"producer"`
	CreatedAt  time.Time       `json:"created_at"`
	ReceivedAt *time.Time      `json:"received_at"`
	ReadAt     *time.Time      `json:"read_at"`
}

// Item is a notification as the API shows it: its public id beside its fields.
type Item struct {
	ID string `json:"id"`
	Notification
}

// Item returns the notification as the API shows it.
func (n Notification) Item() Item { return Item{ID: n.PublicID().String(), Notification: n} }

// Page is one page of a feed.
type Page struct {
	Items   []Notification
	HasMore bool
	// Next is the cursor of the page after this one; zero when HasMore is false.
	Next Cursor
	// Refresh is where a since read starts, read with the page when
	// Query.Refresh asked for it.
	Refresh *Refresh
}

// Query selects a page.
type Query struct {
	UserID string
	// Limit is 1..MaxLimit; 0 means DefaultLimit.
	Limit int
	// After, when set, starts the page after this position.
	After *Cursor
	// UnreadOnly keeps only rows without read_at.
	UnreadOnly bool
	// Refresh also reads the refresh cursor (Page.Refresh), in the page's
	// statement. Only for a first page (no After).
	Refresh bool
}

// Store reads and updates feeds.
type Store struct {
	db         DB
	clock      clock.Clock
	partitions *partitionCache
	prepare    pgx.QueryRewriter // runs reads as named prepared statements where it may; nil: unnamed
}

// NewStore returns a store over db that tells time by clk: the newest
// created_at a read expects, and when a missing partition is looked up
// again; nil is the wall clock.
func NewStore(db DB, clk clock.Clock) *Store {
	return &Store{db: db, clock: clock.Or(clk), partitions: &partitionCache{}}
}

// On returns the store reading and writing through db instead (a read
// replica, a transaction), sharing what this one knows of the partitions:
// they are the same on a streaming standby, and a partition it does not
// have yet is only read through the partitioned table for a while.
func (s *Store) On(db DB) *Store {
	return &Store{db: db, clock: s.clock, partitions: s.partitions, prepare: s.prepare}
}

// WithPreparedReads returns the store running its reads (pages, unread
// counts) through prepare, passed as each read's first argument: a query
// rewriter that runs a read as a named prepared statement on the
// connections that may hold one (pgpool.PrepareWhereAllowed). Prepared, a
// read is parsed once per connection and, once Postgres settles on a
// generic plan, planned once, where an unnamed statement is parsed and
// planned at every run (most of what a page costs Postgres:
// benchmarks/README.md, "Feed reads under load"). Their texts name the
// weeks' partitions, so a connection prepares a few more each week.
func (s *Store) WithPreparedReads(prepare pgx.QueryRewriter) *Store {
	out := *s
	out.prepare = prepare
	return &out
}

// args are a read's arguments, after the rewriter that prepares it.
func (s *Store) args(args queryArgs) []any {
	if s.prepare != nil {
		return append([]any{s.prepare}, args...)
	}
	return args
}

// The notification read shape, shared with the live stream's reads: the
// columns of a notifications row n that make a Notification, the read state
// a feed shows, and the scan that fills a Notification (ScanTargets).
const (
	// NotificationFields are the columns that make a Notification, all but
	// its read state.
	NotificationFields = `n.id, n.type, n.category, n.title, n.body, n.data, n.producer, n.created_at, n.received_at`
	// ReadState is when the row was read: its own read_at or, when the
	// user's read-all w (ReadMark) covers it (ReadAllCovers), when read-all
	// was asked.
	ReadState = `coalesce(n.read_at, CASE WHEN ` + ReadAllCovers + ` THEN w.marked END)`
	// NotificationColumns are a feed read's columns: NotificationFields,
	// then ReadState. The query joins ReadMark as w.
	NotificationColumns = NotificationFields + `, ` + ReadState
)

// ScanTargets returns where the columns NotificationFields, then a read
// state (ReadState, or a plain n.read_at), scan into, in order: a query may
// scan columns of its own around them.
//
// Data scans as the bytes Postgres sent: as a json.RawMessage pgx would
// parse it (json.Unmarshal) only to keep it as it came.
func (n *Notification) ScanTargets() []any {
	return []any{&n.ID, &n.Type, &n.Category, &n.Title, &n.Body, (*[]byte)(&n.Data), &n.Producer, &n.CreatedAt, &n.ReceivedAt, &n.ReadAt}
}

// ReadMark is the last read-all of user $1 as a row of one, joined as w: the
// newest notification it covered in feed order (at, id), when it was asked
// (marked), and the snapshot it was asked in (snap; NULL for a read-all
// from before migration 7, which covered by feed order alone).
const ReadMark = `(SELECT coalesce(m.through_at, '-infinity') AS at, coalesce(m.through_id, 0) AS id, m.marked_at AS marked, m.snapshot AS snap
	FROM (SELECT) one LEFT JOIN read_marks m ON m.user_id = $1)`

// ReadAllCovers holds for a notification n that the user's read-all w marks
// read: it had committed when read-all was asked (visible in its snapshot),
// so it was in the feed the user saw, at or before the newest one in feed
// order. A notification that commits later arrives unread everywhere, even
// when its created_at is older.
const ReadAllCovers = `((n.created_at, n.id) <= (w.at, w.id) AND coalesce(pg_visible_in_snapshot(n.tx, w.snap), true))`

// IngestSlack bounds how long before its commit a notification may have been
// created: its created_at is its ingest transaction's start, and ingest runs
// as one statement cancelled by its timeout (the forwarder's 30 s, central's
// --db-statement-timeout), far below this. Reads that bound created_at for
// partition pruning look this far back from a time that bounds the commits
// they must see.
const IngestSlack = time.Hour

// FutureSlack bounds how far ahead of this process's clock a new row's
// created_at may lie: Postgres's clock may run ahead of ours, but not by a
// day. Reads of the newest rows bound created_at by now plus FutureSlack.
const FutureSlack = 24 * time.Hour

// directWeeks is how many weekly partitions a read asks by name, newest
// first, before it asks the partitioned table for the rest. Postgres plans a
// query on the partitioned table at a cost that grows with its partitions,
// several times a small page's own cost; a query on one partition plans like
// a plain table. Most reads are answered from the newest one or two, in one
// statement that reads them in turn.
const directWeeks = 2

// span is a piece of a read: one week, asked by its partition's name, or
// through the partitioned table ("notifications") with bounds on created_at:
// a week whose partition does not exist, or every partition before a week.
type span struct {
	table  string
	from   *time.Time // the partitioned table: only rows created at or after this
	before *time.Time // the partitioned table: only rows created before this
	week   time.Time  // the week's start; zero for every partition before a week
}

// bound adds the span's created_at bounds to a query on table n.
func (sp span) bound(sql string, args *queryArgs) string {
	if sp.before != nil {
		sql += ` AND n.created_at < ` + args.add(*sp.before)
	}
	if sp.from != nil {
		sql += ` AND n.created_at >= ` + args.add(*sp.from)
	}
	return sql
}

// source is the span's table in a FROM list, as n.
func (sp span) source() string { return pgx.Identifier{sp.table}.Sanitize() + ` n` }

// queryArgs are the arguments of a statement being built.
type queryArgs []any

// add appends an argument and returns its placeholder.
func (a *queryArgs) add(v any) string {
	*a = append(*a, v)
	return "$" + strconv.Itoa(len(*a))
}

// week returns the span of the week that starts at start: its partition by
// name, or, when it does not exist (weeks before the deployment, or a week
// maintenance has not created yet), the partitioned table bounded to the
// week, rather than a name Postgres would answer with an error.
func (s *Store) week(ctx context.Context, start time.Time) (span, error) {
	name := weekly.Partition("notifications", start)
	exists, err := s.partitions.exists(ctx, s.db, s.clock, name)
	if err != nil {
		return span{}, err
	}
	if exists {
		return span{table: name, week: start}, nil
	}
	from, before := start, start.AddDate(0, 0, 7)
	return span{table: "notifications", from: &from, before: &before, week: start}, nil
}

// weeks returns the spans of the weeks from newest's back to oldest's, newest first.
func (s *Store) weeks(ctx context.Context, newest, oldest time.Time) ([]span, error) {
	var out []span
	for w, last := weekly.Start(newest), weekly.Start(oldest); !w.Before(last); w = w.AddDate(0, 0, -7) {
		sp, err := s.week(ctx, w)
		if err != nil {
			return nil, err
		}
		out = append(out, sp)
	}
	return out, nil
}

// spans returns the pieces of a read of rows at or before upper, newest
// first: by name, the weeks from upper's back to directWeeks-1 weeks before
// at's (a read of the newest rows bounds them by now plus FutureSlack, so
// from Sunday it names next week's too), and the rest, every partition
// before them, through the partitioned table.
func (s *Store) spans(ctx context.Context, upper, at time.Time) (named []span, rest span, err error) {
	named, err = s.weeks(ctx, upper, at.AddDate(0, 0, -7*(directWeeks-1)))
	if err != nil {
		return nil, span{}, err
	}
	before := named[len(named)-1].week
	return named, span{table: "notifications", before: &before}, nil
}

// forget drops what is known of the spans' partitions: a statement naming
// them found one missing (retention dropped it since it was looked up).
func (s *Store) forget(spans ...[]span) {
	for _, sps := range spans {
		for _, sp := range sps {
			s.partitions.forget(sp.table)
		}
	}
}

// partitionRecheck is how long a partition found missing is read through the
// partitioned table before its name is looked up again.
const partitionRecheck = time.Minute

// partitionCache remembers which weekly partitions exist: one lookup per
// name, then again only for those found missing, after partitionRecheck.
type partitionCache struct {
	mu      sync.Mutex
	present map[string]bool
	missing map[string]time.Time // when it was found missing
}

func (c *partitionCache) exists(ctx context.Context, db DB, clk clock.Clock, name string) (bool, error) {
	c.mu.Lock()
	present, checked := c.present[name], c.missing[name]
	c.mu.Unlock()
	if present {
		return true, nil
	}
	if !checked.IsZero() && clock.Since(clk, checked) < partitionRecheck {
		return false, nil
	}
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{name}.Sanitize()).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up partition %s: %w", name, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.present == nil {
		c.present, c.missing = map[string]bool{}, map[string]time.Time{}
	}
	if exists {
		c.present[name] = true
		delete(c.missing, name)
	} else {
		c.missing[name] = clk.Now()
	}
	return exists, nil
}

// forget drops a partition that was dropped after it was looked up
// (retention): the next read looks it up again.
func (c *partitionCache) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.present, name)
}

// Refresh is where a since read of the user's notifications in commit order
// (live.Since) starts after a first page: the cursor live.Now makes, read
// in the page's own statement, so from its snapshot. What committed before
// it is on the page or further down the feed; every row after it is
// returned by a since read from it (a row may be in both).
type Refresh struct {
	// Tx and ID are the position of the user's last row below the
	// statement's horizon (pg_snapshot_xmin) among those created within
	// IngestSlack before At; zero when none is.
	Tx uint64
	ID int64
	// At is the statement's time (now()).
	At time.Time
	// History, WAL and Synchronous are the database's history, the
	// statement's place in its WAL, and whether its commits wait for a
	// synchronous standby (package pghistory).
	History     pghistory.History
	WAL         uint64
	Synchronous bool
}

// Page returns the page q names, newest first. It reads limit+1 rows to learn
// whether another page follows. Notifications are partitioned by week of
// created_at: one statement reads the newest partitions by name in turn (from
// the cursor's week, after a cursor), the read mark and, with q.Refresh, the
// refresh cursor; only a page those weeks cannot fill reads on, through the
// partitioned table, so its cost does not grow with the partitions kept.
func (s *Store) Page(ctx context.Context, q Query) (Page, error) {
	limit := q.Limit
	if limit == 0 {
		limit = DefaultLimit
	}
	if limit < 1 || limit > MaxLimit {
		return Page{}, fmt.Errorf("limit %d: want 1..%d", limit, MaxLimit)
	}
	if q.Refresh && q.After != nil {
		return Page{}, errors.New("a refresh cursor is read with a first page only")
	}
	now := s.clock.Now()
	upper, at := now.Add(FutureSlack), now
	if q.After != nil {
		upper, at = q.After.CreatedAt, q.After.CreatedAt
	}
	p, err := s.page(ctx, q, limit, now, upper, at)
	if undefinedTable(err) { // a partition dropped since it was looked up: once more, looked up again
		p, err = s.page(ctx, q, limit, now, upper, at)
	}
	if err != nil {
		return Page{}, fmt.Errorf("read feed: %w", err)
	}
	return p, nil
}

func (s *Store) page(ctx context.Context, q Query, limit int, now, upper, at time.Time) (Page, error) {
	named, rest, err := s.spans(ctx, upper, at)
	if err != nil {
		return Page{}, err
	}
	var refresh []span
	if q.Refresh {
		// The weeks that can hold a row created within IngestSlack before
		// Postgres's now(), which may differ from ours by FutureSlack.
		if refresh, err = s.weeks(ctx, now.Add(FutureSlack), now.Add(-FutureSlack-IngestSlack)); err != nil {
			return Page{}, err
		}
	}
	p := Page{}
	p.Items, p.Refresh, err = s.readPage(ctx, q, named, upper, limit+1, refresh)
	if err != nil {
		if undefinedTable(err) {
			s.forget(named, refresh)
		}
		return Page{}, err
	}
	if len(p.Items) <= limit {
		more, _, err := s.readPage(ctx, q, []span{rest}, upper, limit+1-len(p.Items), nil)
		if err != nil {
			return Page{}, err
		}
		p.Items = append(p.Items, more...)
	}
	if len(p.Items) > limit {
		p.Items, p.HasMore = p.Items[:limit], true
		last := p.Items[limit-1]
		p.Next = Cursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	return p, nil
}

// readPage reads, in one statement, up to n rows of q's page created at or
// before upper from the spans, newest first: each span's rows in index
// order, merged, read no further than n; with refresh (the spans the
// refresh position may lie in), the refresh cursor too.
func (s *Store) readPage(ctx context.Context, q Query, spans []span, upper time.Time, n int, refresh []span) ([]Notification, *Refresh, error) {
	args := queryArgs{q.UserID}
	limit, up := args.add(n), args.add(upper)
	var afterAt, afterID string
	if q.After != nil {
		afterAt, afterID = args.add(q.After.CreatedAt), args.add(q.After.ID)
	}
	branches := make([]string, len(spans))
	for i, sp := range spans {
		b := `SELECT ` + NotificationColumns + ` FROM ` + sp.source() + `, w WHERE n.user_id = $1 AND n.created_at <= ` + up
		b = sp.bound(b, &args)
		if q.UnreadOnly {
			b += ` AND n.read_at IS NULL AND NOT ` + ReadAllCovers
		}
		if q.After != nil {
			// A row comparison matches the index order, so the scan starts
			// right at the cursor whatever its depth.
			b += ` AND (n.created_at, n.id) < (` + afterAt + `, ` + afterID + `)`
		}
		branches[i] = b + ` ORDER BY n.created_at DESC, n.id DESC LIMIT ` + limit
	}
	page := branches[0]
	if len(branches) > 1 {
		// Postgres merges the branches (Merge Append) and stops at the
		// limit: an older week is read only as far as the page needs it.
		page = `SELECT * FROM ((` + strings.Join(branches, `) UNION ALL (`) + `)) u ORDER BY u.created_at DESC, u.id DESC LIMIT ` + limit
	}
	sql := `WITH w AS MATERIALIZED ` + ReadMark + ` ` + page
	if refresh != nil {
		sql = refreshSQL(refresh, page, &args)
	}
	rows, err := s.db.Query(ctx, sql, s.args(args)...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	items := make([]Notification, 0, n)
	var r Refresh
	var sys int64
	var tl int32
	var head []any // the refresh cursor's columns, before the page's
	if refresh != nil {
		head = []any{&r.At, &sys, &tl, &r.WAL, &r.Synchronous, &r.Tx, &r.ID}
	}
	read := false
	for rows.Next() {
		read = true
		var note Notification
		dest := append(head, note.ScanTargets()...)
		empty := refresh != nil && rows.RawValues()[len(head)] == nil // the refresh cursor alone: no row
		if empty {
			dest = append(head, make([]any, len(dest)-len(head))...)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, err
		}
		if !empty {
			items = append(items, note)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	if refresh == nil {
		return items, nil, nil
	}
	if !read {
		return nil, nil, errors.New("the refresh cursor was not read")
	}
	r.History = pghistory.History{System: uint64(sys), Timeline: uint32(tl)}
	return items, &r, nil
}

// refreshSQL is the statement of a first page that also reads where a since
// read starts (Refresh): the statement's state, evaluated once, and the
// user's last row below its horizon (in commit order) among those created
// within IngestSlack before its time, on every row of the page, and alone
// on one row when the page is empty. This is live.Now's read, in the
// page's snapshot: every row not in the page's snapshot belongs to a
// transaction at or above the horizon, so a since read returns it.
func refreshSQL(refresh []span, page string, args *queryArgs) string {
	slack, future := args.add(IngestSlack), args.add(FutureSlack)
	branches := make([]string, len(refresh))
	for i, sp := range refresh {
		branches[i] = sp.bound(`SELECT n.tx, n.id FROM `+sp.source()+` WHERE n.user_id = $1 AND n.tx < s.hz
			AND n.created_at >= s.at - `+slack+`::interval AND n.created_at < s.at + `+future+`::interval`, args)
	}
	return `WITH w AS MATERIALIZED ` + ReadMark + `, s(hz, at, sys, tl, wal, sync) AS MATERIALIZED (
			SELECT pg_snapshot_xmin(pg_current_snapshot()), now(), ` + pghistory.Columns + `, ` + pghistory.WAL + `, ` + pghistory.Synchronous + `)
		SELECT s.at, s.sys, s.tl, s.wal, s.sync, coalesce(r.tx, '0'::xid8), coalesce(r.id, 0), p.*
		FROM s LEFT JOIN LATERAL (
			SELECT r.tx, r.id FROM ((` + strings.Join(branches, `) UNION ALL (`) + `)) r
			ORDER BY r.tx DESC, r.id DESC LIMIT 1) r ON true
		LEFT JOIN (` + page + `) p ON true
		ORDER BY p.created_at DESC, p.id DESC`
}

// undefinedTable reports a missing relation: a week whose partition does not exist.
func undefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// MarkRead marks one of the user's notifications read. Marking it again, or
// one already under the read-all watermark, is not an error and changes
// nothing; another user's notification is ErrNotFound. The id names the
// row's partition, so only that partition is read.
func (s *Store) MarkRead(ctx context.Context, userID string, id ID) error {
	var found bool
	err := s.db.QueryRow(ctx, `WITH target AS (
			SELECT n.id, n.created_at FROM notifications n
			WHERE n.user_id = $1 AND n.created_at = $2 AND n.id = $3
		), marked AS (
			UPDATE notifications n SET read_at = now()
			FROM target t, `+ReadMark+` w
			WHERE n.created_at = t.created_at AND n.id = t.id AND n.read_at IS NULL
			  AND NOT `+ReadAllCovers+`
			RETURNING n.id
		), told AS (
			-- The user's other devices hear of it on the live stream.
			INSERT INTO read_events (user_id, read_id) SELECT $1, $4 FROM marked
		)
		SELECT EXISTS (SELECT 1 FROM target)`, userID, id.CreatedAt, id.Seq, id.String()).Scan(&found)
	if err != nil {
		return fmt.Errorf("mark read: %w", err)
	}
	if !found {
		return ErrNotFound
	}
	return nil
}

// MarkAllRead marks read every notification of the user that has committed
// when it is asked, and returns the newest of them in feed order; ok is false
// when they have none. One statement reads the newest row and records it with
// the statement's snapshot, so what it covers is exactly what a feed read at
// that moment showed; a notification whose transaction commits later stays
// unread. It costs the same for 10 and 10 M unread rows: one row of
// read_marks.
func (s *Store) MarkAllRead(ctx context.Context, userID string) (through ID, ok bool, err error) {
	var at time.Time
	var seq int64
	err = s.db.QueryRow(ctx, `WITH newest AS (
			SELECT n.created_at, n.id FROM notifications n
			WHERE n.user_id = $1 AND n.created_at < now() + $2::interval
			ORDER BY n.created_at DESC, n.id DESC LIMIT 1
		), marked AS (
			INSERT INTO read_marks (user_id, through_at, through_id, marked_at, snapshot)
			SELECT $1, created_at, id, now(), pg_current_snapshot() FROM newest
			ON CONFLICT (user_id) DO UPDATE SET through_at = EXCLUDED.through_at, through_id = EXCLUDED.through_id,
				marked_at = EXCLUDED.marked_at, snapshot = EXCLUDED.snapshot
			-- Never backwards: a read-all that covers less than the one
			-- recorded (it raced a newer one) changes nothing.
			WHERE (read_marks.through_at, read_marks.through_id) < (EXCLUDED.through_at, EXCLUDED.through_id)
			   OR (read_marks.through_at, read_marks.through_id) = (EXCLUDED.through_at, EXCLUDED.through_id)
			      AND (read_marks.snapshot IS NULL OR pg_snapshot_xmax(read_marks.snapshot) < pg_snapshot_xmax(EXCLUDED.snapshot))
			RETURNING through_at, through_id, snapshot
		), told AS (
			-- The user's other devices hear of it on the live stream, with
			-- what it left unread.
			INSERT INTO read_events (user_id, through_at, through_seq, snapshot)
			SELECT $1, through_at, through_id, snapshot FROM marked
		)
		SELECT created_at, id FROM newest`, userID, FutureSlack).Scan(&at, &seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return ID{}, false, nil
	}
	if err != nil {
		return ID{}, false, fmt.Errorf("mark all read: %w", err)
	}
	return ID{CreatedAt: at, Seq: seq}, true, nil
}

// UnreadCount counts the user's unread notifications up to UnreadCap; capped
// is true when there are more. It never counts a whole feed: it reads the
// unread index from the top down to the newest notification read-all
// covered, at most UnreadCap+1 rows, and the few that committed after the
// read-all though older in feed order. One statement reads the newest
// partitions by name; only when the read-all lies further back (or there is
// none) and they hold no more than UnreadCap does a second read the rest.
func (s *Store) UnreadCount(ctx context.Context, userID string) (count int, capped bool, err error) {
	now := s.clock.Now()
	count, capped, err = s.unreadCount(ctx, userID, now)
	if undefinedTable(err) { // a partition dropped since it was looked up: once more, looked up again
		count, capped, err = s.unreadCount(ctx, userID, now)
	}
	if err != nil {
		return 0, false, fmt.Errorf("unread count: %w", err)
	}
	return count, capped, nil
}

func (s *Store) unreadCount(ctx context.Context, userID string, now time.Time) (int, bool, error) {
	named, _, err := s.spans(ctx, now.Add(FutureSlack), now)
	if err != nil {
		return 0, false, err
	}
	var ranges []unreadRange
	for _, sp := range named {
		ranges = append(ranges, unreadRange{span: sp}, unreadRange{span: sp, late: true})
	}
	n, through, oldestLate, err := s.countUnread(ctx, userID, ranges, UnreadCap+1)
	if undefinedTable(err) {
		s.forget(named)
	}
	if err != nil {
		return 0, false, err
	}
	if n > UnreadCap {
		return UnreadCap, true, nil
	}
	// What lies before the named weeks, through the partitioned table, and
	// only what the read mark leaves unread: the newer range from the read
	// mark on, the late range from how far back it reaches. Both bounds
	// are known now, so Postgres plans only the partitions between them.
	before := named[len(named)-1].week
	finite := func(t pgtype.Timestamptz) bool { return t.Valid && t.InfinityModifier == pgtype.Finite }
	ranges = ranges[:0]
	if !finite(through) || through.Time.Before(before) {
		sp := span{table: "notifications", before: &before}
		if finite(through) {
			sp.from = &through.Time
		}
		ranges = append(ranges, unreadRange{span: sp})
	}
	if finite(oldestLate) && oldestLate.Time.Before(before) { // none without a read-all
		ranges = append(ranges, unreadRange{span: span{table: "notifications", before: &before, from: &oldestLate.Time}, late: true})
	}
	if len(ranges) == 0 {
		return n, false, nil // everything older was covered by read-all
	}
	more, _, _, err := s.countUnread(ctx, userID, ranges, UnreadCap+1-n)
	if err != nil {
		return 0, false, err
	}
	if n += more; n > UnreadCap {
		return UnreadCap, true, nil
	}
	return n, false, nil
}

// unreadRange is one range of the unread index in a span: above the newest
// notification read-all covered, or (late) below it, the few whose
// transactions were still open when it was asked (they started at most
// IngestSlack before), which it left unread.
type unreadRange struct {
	span
	late bool
}

// countUnread counts up to max unread rows of the user in the ranges, in
// one statement that reads them in turn and no further than max, and
// returns the read mark's newest notification and how far back rows it
// left unread may lie.
func (s *Store) countUnread(ctx context.Context, userID string, ranges []unreadRange, max int) (n int, through, oldestLate pgtype.Timestamptz, err error) {
	args := queryArgs{userID}
	limit, slack := args.add(max), args.add(IngestSlack)
	selects := make([]string, len(ranges))
	for i, r := range ranges {
		sql := `SELECT 1 FROM ` + r.source() + ` WHERE n.user_id = $1 AND n.read_at IS NULL AND (n.created_at, n.id) > (w.at, w.id)`
		if r.late {
			sql = `SELECT 1 FROM ` + r.source() + ` WHERE n.user_id = $1 AND n.read_at IS NULL AND (n.created_at, n.id) <= (w.at, w.id)
				AND n.created_at >= w.marked - ` + slack + `::interval AND NOT pg_visible_in_snapshot(n.tx, w.snap)`
		}
		selects[i] = r.bound(sql, &args)
	}
	sql := `SELECT (SELECT count(*) FROM ((` + strings.Join(selects, `) UNION ALL (`) + `) LIMIT ` + limit + `) c),
			w.at, w.marked - ` + slack + `::interval FROM ` + ReadMark + ` w`
	err = s.db.QueryRow(ctx, sql, s.args(args)...).Scan(&n, &through, &oldestLate)
	return n, through, oldestLate, err
}
