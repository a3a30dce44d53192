package feed

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

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
