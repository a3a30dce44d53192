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
	// Status is the tab: All (not archived, the default), Unread (neither
	// read nor archived) or Archived.
	Status Status
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
// the cursor's week, after a cursor), each as the few index ranges of its
// tab (tabs.go), the watermarks and, with q.Refresh, the refresh cursor;
// only a page those weeks cannot fill reads on, through the partitioned
// table, and only the ranges the watermarks leave rows of the tab in, from
// as far back as they may lie: so its cost does not grow with the
// partitions kept, nor with how deep the watermarks lie.
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
	branches := tabBranches(q.Status)
	var named2 []branch
	var spans []span
	for _, sp := range named {
		for _, b := range branches {
			named2, spans = append(named2, b), append(spans, sp)
		}
	}
	p := Page{}
	var marks markTimes
	p.Items, p.Refresh, marks, err = s.readPage(ctx, q, named2, spans, upper, limit+1, refresh)
	if err != nil {
		if undefinedTable(err) {
			s.forget(named, refresh)
		}
		return Page{}, err
	}
	if len(p.Items) <= limit {
		if more, spans := restSpans(branches, marks, *rest.before); len(more) > 0 {
			items, _, _, err := s.readPage(ctx, q, more, spans, upper, limit+1-len(p.Items), nil)
			if err != nil {
				return Page{}, err
			}
			p.Items = append(p.Items, items...)
		}
	}
	if len(p.Items) > limit {
		p.Items, p.HasMore = p.Items[:limit], true
		last := p.Items[limit-1]
		p.Next = Cursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	return p, nil
}

// readPage reads, in one statement, the watermarks' times and up to n rows
// of q's page created at or before upper from the branches, each over its
// span, newest first: each branch's rows in index order, merged, read no
// further than n; with refresh (the spans the refresh position may lie in),
// the refresh cursor too.
func (s *Store) readPage(ctx context.Context, q Query, branches []branch, spans []span, upper time.Time, n int, refresh []span) ([]Notification, *Refresh, markTimes, error) {
	args := queryArgs{q.UserID}
	limit, up := args.add(n), args.add(upper)
	var slack string
	var after *[2]string
	if q.After != nil {
		after = &[2]string{args.add(q.After.CreatedAt), args.add(q.After.ID)}
	}
	parts := make([]string, len(branches))
	for i, b := range branches {
		sql := branchSQL(b, spans[i], `SELECT `+rowColumns, &args, &slack, after) + ` AND n.created_at <= ` + up
		parts[i] = sql + ` ORDER BY n.created_at DESC, n.id DESC LIMIT ` + limit
	}
	page := parts[0]
	if len(parts) > 1 {
		// Postgres merges the branches (Merge Append) and stops at the
		// limit: an older week, or a range, is read only as far as the
		// page needs it.
		page = `SELECT * FROM ((` + strings.Join(parts, `) UNION ALL (`) + `)) u ORDER BY u.created_at DESC, u.id DESC LIMIT ` + limit
	}
	// The watermarks on every row, and alone on one row when the page is
	// empty; the states of the page's rows only.
	sql := `WITH m AS MATERIALIZED ` + Marks + `
		SELECT ` + markTimesColumns + `, ` + NotificationFields + `, ` + StateColumns + `
		FROM m LEFT JOIN LATERAL (` + page + `) n ON true
		ORDER BY n.created_at DESC, n.id DESC`
	if refresh != nil {
		sql = refreshSQL(refresh, page, &args)
	}
	rows, err := s.db.Query(ctx, sql, s.args(args)...)
	if err != nil {
		return nil, nil, markTimes{}, err
	}
	defer rows.Close()
	items := make([]Notification, 0, n)
	var r Refresh
	var marks markTimes
	var sys int64
	var tl int32
	head := marks.targets() // the watermarks' columns, and the refresh cursor's, before the page's
	if refresh != nil {
		head = append([]any{&r.At, &sys, &tl, &r.WAL, &r.Synchronous, &r.Tx, &r.ID}, head...)
	}
	read := false
	for rows.Next() {
		read = true
		var note Notification
		dest := append(head, note.ScanTargets()...)
		empty := rows.RawValues()[len(head)] == nil // the head alone: no row
		if empty {
			dest = append(head, make([]any, len(dest)-len(head))...)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, markTimes{}, err
		}
		if !empty {
			items = append(items, note)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, markTimes{}, err
	}
	if !read {
		return nil, nil, markTimes{}, errors.New("the watermarks were not read")
	}
	if refresh == nil {
		return items, nil, marks, nil
	}
	r.History = pghistory.History{System: uint64(sys), Timeline: uint32(tl)}
	return items, &r, marks, nil
}

// refreshSQL is the statement of a first page that also reads where a since
// read starts (Refresh): the statement's state, evaluated once, and the
// user's last row below its horizon (in commit order: a notification or a
// change of state) among those created within IngestSlack before its time,
// on every row of the page, and alone on one row when the page is empty.
// This is live.Now's read, in the page's snapshot: every row not in the
// page's snapshot belongs to a transaction at or above the horizon, so a
// since read returns it.
func refreshSQL(refresh []span, page string, args *queryArgs) string {
	slack, future := args.add(IngestSlack), args.add(FutureSlack)
	branches := make([]string, len(refresh))
	for i, sp := range refresh {
		branches[i] = sp.bound(`SELECT n.tx, n.id FROM `+sp.source()+` WHERE n.user_id = $1 AND n.tx < s.hz
			AND n.created_at >= s.at - `+slack+`::interval AND n.created_at < s.at + `+future+`::interval`, args)
	}
	return `WITH m AS MATERIALIZED ` + Marks + `, s(hz, at, sys, tl, wal, sync) AS MATERIALIZED (
			SELECT pg_snapshot_xmin(pg_current_snapshot()), now(), ` + pghistory.Columns + `, ` + pghistory.WAL + `, ` + pghistory.Synchronous + `)
		SELECT s.at, s.sys, s.tl, s.wal, s.sync, coalesce(r.tx, '0'::xid8), coalesce(r.id, 0), ` + markTimesColumns + `, ` + NotificationFields + `, ` + StateColumns + `
		FROM s CROSS JOIN m LEFT JOIN LATERAL (
			SELECT r.tx, r.id FROM ((` + strings.Join(branches, `) UNION ALL (`) + `) UNION ALL (` + strings.ReplaceAll(LastStateEvent, "SLACK", slack) + `)) r
			ORDER BY r.tx DESC, r.id DESC LIMIT 1) r ON true
		LEFT JOIN LATERAL (` + page + `) n ON true
		ORDER BY n.created_at DESC, n.id DESC`
}

// LastStateEvent is the position (tx, id) of user $1's last change of state
// below the horizon s.hz, when it was made within IngestSlack (placeholder
// SLACK) before s.at: the newest by position, looked at alone (older ones
// by position are no newer).
const LastStateEvent = `SELECT e.tx, e.id FROM (SELECT e.tx, e.id, e.created_at FROM state_events e WHERE e.user_id = $1 AND e.tx < s.hz
	ORDER BY e.tx DESC, e.id DESC LIMIT 1) e WHERE e.created_at >= s.at - SLACK::interval`
