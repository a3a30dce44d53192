package feed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/internal/pghistory"
)

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
