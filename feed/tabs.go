package feed

import (
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// A tab's rows are read as a few index ranges (branches), each of which
// holds only, or almost only, rows of the tab, so that a page at any depth
// reads about the rows it returns, whatever the watermarks cover:
//
//   - above a watermark (newer in feed order than its newest), rows are in a
//     tab by their own columns, and a partial index holds exactly them
//     (notifications_inbox: not archived by item; notifications_archived;
//     notifications_inbox_unread: neither read nor archived by item);
//   - below it, a watermark decides, but for the few rows it left out: those
//     that committed after it was asked (late: read through the index of
//     the user's rows in commit order, between its snapshot's xmin and
//     xmax), and those marked back against it since (notifications_marked_unread,
//     notifications_unarchived, which hold only rows whose last change by
//     item was a mark unread or an unarchive).
//
// Branches of one read never hold the same row: each excludes what an
// earlier one reads.

// branch is one index range of a tab.
type branch struct {
	// where is its condition on a row n under the watermarks m, beside the
	// user, the span's bounds, the upper bound and the cursor; SLACK stands
	// for IngestSlack's placeholder.
	where string
	// reach tells, from the watermarks, how far back its rows may lie: from
	// (nil: anywhere), or none at all (ok false). A read of the weeks
	// before the newest reads the branch only there.
	reach func(t markTimes) (from *time.Time, ok bool)
	// below, when set, is a watermark's newest in feed order (its at and
	// id columns): the branch's rows lie at or before it. A page after a
	// cursor bounds the scan by the earlier of the two as one row
	// comparison: given two, Postgres starts the scan at one of them, and
	// starting at the watermark walks every row between it and a deep
	// cursor.
	below [2]string
}

// The conditions shared by the tabs' branches.
var (
	lateRead     = lateFor("r", "SLACK")
	lateArchived = lateFor("a", "SLACK")
	// aboveMarks: newer in feed order than both watermarks' newest.
	aboveMarks = `((n.created_at, n.id) > (m.r_at, m.r_id) AND (n.created_at, n.id) > (m.a_at, m.a_id))`
	inbox      = ` AND NOT ` + isArchived
	unread     = ` AND NOT ` + isRead + ` AND NOT ` + isArchived
	// unarchivedAfter: below archive-all and visible to it, unarchived by
	// item after it.
	unarchivedAfter = `n.archived_at IS NULL AND n.archive_tx IS NOT NULL AND (n.created_at, n.id) <= (m.a_at, m.a_id)
		AND coalesce(pg_visible_in_snapshot(n.tx, m.a_snap), true) AND (n.archive_tx, n.archive_seq) > (m.a_tx, m.a_seq)`
)

// anywhere: a branch whose rows may lie in any week.
func anywhere(markTimes) (*time.Time, bool) { return nil, true }

// above is the reach of rows newer than the watermarks' newest (at): from
// the newest of them; anywhere when there is none.
func above(ats ...pgtype.Timestamptz) (*time.Time, bool) {
	var from *time.Time
	for _, at := range ats {
		if finite(at) && (from == nil || at.Time.After(*from)) {
			from = &at.Time
		}
	}
	return from, true
}

// since is the reach of the rows a watermark asked at marked left out as
// late: none without one; from IngestSlack before it.
func since(marked *time.Time) (*time.Time, bool) {
	if marked == nil {
		return nil, false
	}
	from := marked.Add(-IngestSlack)
	return &from, true
}

// hinted is the reach of the rows marked back against watermarks: from the
// oldest of their hints; none without one.
func hinted(hints ...*time.Time) (*time.Time, bool) {
	var from *time.Time
	for _, h := range hints {
		if h != nil && (from == nil || h.Before(*from)) {
			from = h
		}
	}
	return from, from != nil
}

func finite(t pgtype.Timestamptz) bool { return t.Valid && t.InfinityModifier == pgtype.Finite }

// tabBranches are the branches of a tab.
func tabBranches(tab Status) []branch {
	switch tab {
	case Archived:
		return []branch{
			// Archived by item, above archive-all.
			{where: `n.archived_at IS NOT NULL AND (n.created_at, n.id) > (m.a_at, m.a_id)`,
				reach: func(t markTimes) (*time.Time, bool) {
					if t.aItems == nil {
						return nil, false
					}
					from, _ := above(t.aAt, pgtype.Timestamptz{Time: *t.aItems, Valid: true})
					return from, true
				}},
			// Below archive-all: all of it but what it left out, read by
			// the feed's index.
			{where: isArchived, below: [2]string{"m.a_at", "m.a_id"},
				reach: func(t markTimes) (*time.Time, bool) { return nil, finite(t.aAt) }},
		}
	case Unread:
		return []branch{
			{where: `n.read_at IS NULL AND n.archived_at IS NULL AND ` + aboveMarks,
				reach: func(t markTimes) (*time.Time, bool) { return above(t.rAt, t.aAt) }},
			{where: lateRead + unread,
				reach: func(t markTimes) (*time.Time, bool) { return since(t.rMarked) }},
			{where: lateArchived + ` AND NOT coalesce(` + lateRead + `, false)` + unread,
				reach: func(t markTimes) (*time.Time, bool) { return since(t.aMarked) }},
			{where: `n.read_at IS NULL AND n.read_tx IS NOT NULL AND NOT ` + aboveMarks +
				` AND NOT coalesce(` + lateRead + `, false) AND NOT coalesce(` + lateArchived + `, false)` + unread,
				reach: func(t markTimes) (*time.Time, bool) { return hinted(t.rOver, t.aOver) }},
			{where: `n.archived_at IS NULL AND n.archive_tx IS NOT NULL AND NOT (n.read_at IS NULL AND n.read_tx IS NOT NULL) AND NOT ` + aboveMarks +
				` AND NOT coalesce(` + lateRead + `, false) AND NOT coalesce(` + lateArchived + `, false)` + unread,
				reach: func(t markTimes) (*time.Time, bool) { return hinted(t.aOver) }},
		}
	}
	return []branch{
		// Not archived by item, above archive-all.
		{where: `n.archived_at IS NULL AND (n.created_at, n.id) > (m.a_at, m.a_id)`,
			reach: func(t markTimes) (*time.Time, bool) { return above(t.aAt) }},
		{where: lateArchived + ` AND n.archived_at IS NULL`,
			reach: func(t markTimes) (*time.Time, bool) { return since(t.aMarked) }},
		{where: unarchivedAfter,
			reach: func(t markTimes) (*time.Time, bool) { return hinted(t.aOver) }},
	}
}

// unseenBranches are the branches of the rows not archived that the seen
// position does not cover: the "all" tab's, from IngestSlack before the
// seen position's time (a row after it in commit order started no earlier).
func unseenBranches() []branch {
	all := tabBranches(All)
	out := make([]branch, len(all))
	for i, b := range all {
		reach := b.reach
		out[i] = branch{
			where: b.where + ` AND ` + `(n.tx, n.id) > (m.v_tx, m.v_id) AND n.created_at >= m.v_at - SLACK::interval`,
			reach: func(t markTimes) (*time.Time, bool) {
				from, ok := reach(t)
				if !ok || !finite(t.vAt) {
					return from, ok
				}
				seen := t.vAt.Time.Add(-IngestSlack)
				if from == nil || seen.After(*from) {
					from = &seen
				}
				return from, true
			},
		}
	}
	return out
}

// markTimes are the watermarks' times a read learns with its first
// statement, which bound what a read of the older weeks looks at.
type markTimes struct {
	rAt, aAt, vAt                          pgtype.Timestamptz
	rMarked, aMarked, rOver, aOver, aItems *time.Time
}

// markTimesColumns are markTimes's columns in a statement that joins Marks as m.
const markTimesColumns = `m.r_at, m.r_marked, m.r_over, m.a_at, m.a_marked, m.a_over, m.a_items, m.v_at`

func (t *markTimes) targets() []any {
	return []any{&t.rAt, &t.rMarked, &t.rOver, &t.aAt, &t.aMarked, &t.aOver, &t.aItems, &t.vAt}
}

// restSpans are the branches' spans in a read of every partition before
// the week before (the partitioned table): each bounded from its reach, so
// that Postgres plans only the partitions it may find rows in; a branch
// that can have none there is left out.
func restSpans(branches []branch, t markTimes, before time.Time) (out []branch, spans []span) {
	for _, b := range branches {
		from, ok := b.reach(t)
		if !ok || from != nil && !from.Before(before) {
			continue
		}
		sp := span{table: "notifications", before: &before}
		if from != nil {
			f := *from
			sp.from = &f
		}
		out, spans = append(out, b), append(spans, sp)
	}
	return out, spans
}

// rowColumns are the columns a branch returns: the notification and the
// columns of its states (StateColumns reads them as n).
const rowColumns = NotificationFields + `, n.tx, n.read_at, n.read_tx, n.read_seq, n.archived_at, n.archive_tx, n.archive_seq`

// branchSQL is b over sp for user $1, with IngestSlack's placeholder in
// place (slack, added to args the first time a branch needs it: Postgres
// cannot type an argument no statement uses).
// after, when set, is a cursor's at and id placeholders: the rows are read
// before it.
func branchSQL(b branch, sp span, head string, args *queryArgs, slack *string, after *[2]string) string {
	where := b.where
	if strings.Contains(where, "SLACK") {
		if *slack == "" {
			*slack = args.add(IngestSlack)
		}
		where = strings.ReplaceAll(where, "SLACK", *slack)
	}
	switch {
	case b.below != [2]string{} && after != nil:
		// The earlier of the watermark (inclusive) and the cursor
		// (exclusive: inclusive of the id before it, ids being integers).
		w, at, id := `(`+b.below[0]+`, `+b.below[1]+`)`, after[0]+`::timestamptz`, after[1]+`::bigint - 1`
		first := w + ` <= (` + at + `, ` + id + `)`
		where += ` AND (n.created_at, n.id) <= (CASE WHEN ` + first + ` THEN ` + b.below[0] + ` ELSE ` + at + ` END, CASE WHEN ` + first + ` THEN ` + b.below[1] + ` ELSE ` + id + ` END)`
	case b.below != [2]string{}:
		where += ` AND (n.created_at, n.id) <= (` + b.below[0] + `, ` + b.below[1] + `)`
	case after != nil:
		// A row comparison matches the index order, so the scan starts
		// right at the cursor whatever its depth.
		where += ` AND (n.created_at, n.id) < (` + after[0] + `, ` + after[1] + `)`
	}
	return sp.bound(head+` FROM `+sp.source()+` WHERE n.user_id = $1 AND `+where, args)
}
