package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/spoolcast/spoolcast/internal/clock"
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
}

// Store reads and updates feeds.
type Store struct {
	db         DB
	clock      clock.Clock
	partitions *partitionCache
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
	return &Store{db: db, clock: s.clock, partitions: s.partitions}
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
func (n *Notification) ScanTargets() []any {
	return []any{&n.ID, &n.Type, &n.Category, &n.Title, &n.Body, &n.Data, &n.Producer, &n.CreatedAt, &n.ReceivedAt, &n.ReadAt}
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
// a plain table. Most reads are answered from the newest one or two.
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
func (sp span) bound(sql string, args []any) (string, []any) {
	if sp.before != nil {
		args = append(args, *sp.before)
		sql += fmt.Sprintf(` AND n.created_at < $%d`, len(args))
	}
	if sp.from != nil {
		args = append(args, *sp.from)
		sql += fmt.Sprintf(` AND n.created_at >= $%d`, len(args))
	}
	return sql, args
}

// spans returns the pieces of a read of rows at or before upper, newest
// first. A week whose partition does not exist (weeks before the deployment,
// or a week maintenance has not created yet) is read through the partitioned
// table rather than by a name Postgres would answer with an error.
func (s *Store) spans(ctx context.Context, upper time.Time) ([]span, error) {
	out := make([]span, 0, directWeeks+1)
	week := weekly.Start(upper)
	for range directWeeks {
		name := weekly.Partition("notifications", week)
		exists, err := s.partitions.exists(ctx, s.db, s.clock, name)
		if err != nil {
			return nil, err
		}
		if exists {
			out = append(out, span{table: name, week: week})
		} else {
			from, before := week, week.AddDate(0, 0, 7)
			out = append(out, span{table: "notifications", from: &from, before: &before, week: week})
		}
		week = week.AddDate(0, 0, -7)
	}
	before := week.AddDate(0, 0, 7)
	return append(out, span{table: "notifications", before: &before}), nil
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

// Page returns the page q names, newest first. It reads limit+1 rows to learn
// whether another page follows. Notifications are partitioned by week of
// created_at: the page reads the newest partitions first, each by name, and
// stops once it has its rows, so its cost does not grow with the partitions kept.
func (s *Store) Page(ctx context.Context, q Query) (Page, error) {
	limit := q.Limit
	if limit == 0 {
		limit = DefaultLimit
	}
	if limit < 1 || limit > MaxLimit {
		return Page{}, fmt.Errorf("limit %d: want 1..%d", limit, MaxLimit)
	}
	upper := s.clock.Now().Add(FutureSlack)
	if q.After != nil {
		upper = q.After.CreatedAt
	}
	var items []Notification
	spans, err := s.spans(ctx, upper)
	if err != nil {
		return Page{}, fmt.Errorf("read feed: %w", err)
	}
	for _, sp := range spans {
		more, err := s.pageIn(ctx, q, sp, upper, limit+1-len(items))
		if err != nil {
			return Page{}, fmt.Errorf("read feed: %w", err)
		}
		if items = append(items, more...); len(items) > limit {
			break
		}
	}
	p := Page{Items: items}
	if len(items) > limit {
		p.Items, p.HasMore = items[:limit], true
		last := p.Items[limit-1]
		p.Next = Cursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	return p, nil
}

// pageIn reads up to n rows of q's page, created at or before upper, from one span.
func (s *Store) pageIn(ctx context.Context, q Query, sp span, upper time.Time, n int) ([]Notification, error) {
	sql := `SELECT ` + NotificationColumns + `
		FROM ` + pgx.Identifier{sp.table}.Sanitize() + ` n, ` + ReadMark + ` w
		WHERE n.user_id = $1 AND n.created_at <= $3`
	args := []any{q.UserID, n, upper}
	sql, args = sp.bound(sql, args)
	if q.UnreadOnly {
		sql += ` AND n.read_at IS NULL AND NOT ` + ReadAllCovers
	}
	if q.After != nil {
		// A row comparison matches the index order, so the scan starts right
		// at the cursor whatever its depth.
		sql += fmt.Sprintf(` AND (n.created_at, n.id) < ($%d, $%d)`, len(args)+1, len(args)+2)
		args = append(args, q.After.CreatedAt, q.After.ID)
	}
	sql += ` ORDER BY n.created_at DESC, n.id DESC LIMIT $2`
	rows, err := s.db.Query(ctx, sql, args...)
	var items []Notification
	if err == nil {
		items, err = pgx.CollectRows(rows, scanNotification)
	}
	if undefinedTable(err) {
		s.partitions.forget(sp.table)
		return nil, nil // dropped since it was looked up: nothing is left in it
	}
	return items, err
}

// undefinedTable reports a missing relation: a week whose partition does not exist.
func undefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

func scanNotification(row pgx.CollectableRow) (Notification, error) {
	var n Notification
	err := row.Scan(n.ScanTargets()...)
	return n, err
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
// covered, at most UnreadCap+1 rows, the newest partitions first (older ones
// only while that lies further back), then the few that committed after the
// read-all though older in feed order.
func (s *Store) UnreadCount(ctx context.Context, userID string) (count int, capped bool, err error) {
	spans, err := s.spans(ctx, s.clock.Now().Add(FutureSlack))
	if err != nil {
		return 0, false, fmt.Errorf("unread count: %w", err)
	}
	for _, sp := range spans {
		// Two ranges of the unread index: above the newest notification
		// read-all covered, and below it the few whose transactions were
		// still open when it was asked (they started at most IngestSlack
		// before), which it left unread.
		newer := `SELECT 1 FROM ` + pgx.Identifier{sp.table}.Sanitize() + ` n
				WHERE n.user_id = $1 AND n.read_at IS NULL AND (n.created_at, n.id) > (w.at, w.id)`
		args := []any{userID, UnreadCap + 1 - count, IngestSlack}
		newer, args = sp.bound(newer, args)
		late := `SELECT 1 FROM ` + pgx.Identifier{sp.table}.Sanitize() + ` n
				WHERE n.user_id = $1 AND n.read_at IS NULL AND (n.created_at, n.id) <= (w.at, w.id)
				  AND n.created_at >= w.marked - $3::interval AND NOT pg_visible_in_snapshot(n.tx, w.snap)`
		late, args = sp.bound(late, args)
		sql := `SELECT (SELECT count(*) FROM (` + newer + ` LIMIT $2) a) + (SELECT count(*) FROM (` + late + ` LIMIT $2) b),
				w.at, w.marked - $3::interval FROM ` + ReadMark + ` w`
		var n int
		var through, oldestLate pgtype.Timestamptz
		err := s.db.QueryRow(ctx, sql, args...).Scan(&n, &through, &oldestLate)
		if undefinedTable(err) {
			s.partitions.forget(sp.table)
			continue
		}
		if err != nil {
			return 0, false, fmt.Errorf("unread count: %w", err)
		}
		if count += n; count > UnreadCap {
			return UnreadCap, true, nil
		}
		covered := func(t pgtype.Timestamptz) bool {
			return t.Valid && t.InfinityModifier == pgtype.Finite && !t.Time.Before(sp.week)
		}
		if !sp.week.IsZero() && covered(through) && covered(oldestLate) {
			break // everything older was covered by read-all
		}
	}
	return count, false, nil
}
