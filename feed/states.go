package feed

import "strings"

// The inbox states of a notification (seen, read, archived) are kept as the
// feed keeps everything: per row where a user acts on one notification, and
// as per-user watermarks where they act on all of them, which cost one row
// whatever the feed holds.
//
//   - Read: the row's read_at, set and cleared by MarkRead and MarkUnread;
//     and read-all (read_marks), which covers the notifications that had
//     committed when it was asked, at or before the newest of them in feed
//     order (ReadAllCovers).
//   - Archived: the row's archived_at, set and cleared by Archive and
//     Unarchive; and archive-all (archive_marks), which covers as read-all
//     does.
//   - Seen: the stream's seen position (stream_seen, in commit order), moved
//     by the app's seen messages; seen_at is when a recorded move of it
//     first covered the notification (state_events of kind seen).
//
// Every change is a state event (state_events) with a position in the
// stream, (its transaction id, a sequence number from the notifications'
// own sequence), in the commit-safe order in which the live stream sends it.
// The row keeps the position of its last change by item (read_tx, read_seq;
// archive_tx, archive_seq) and a watermark keeps its own (tx, seq): where
// both speak of a notification, the later position decides. So a mark
// unread after a read-all leaves that one unread, and a read-all after it
// reads it again; the server decides exactly as an app that applies the
// stream's frames in their order.

// Status is a tab of the inbox.
type Status uint8

const (
	// All is every notification not archived.
	All Status = iota
	// Unread is every notification neither read nor archived.
	Unread
	// Archived is every archived notification.
	Archived
)

// String is the status as the API names it.
func (s Status) String() string {
	switch s {
	case Unread:
		return "unread"
	case Archived:
		return "archived"
	}
	return "all"
}

// ParseStatus reads a status as the API names it; ok is false for another.
func ParseStatus(s string) (Status, bool) {
	switch s {
	case "all":
		return All, true
	case "unread":
		return Unread, true
	case "archived":
		return Archived, true
	}
	return All, false
}

// Marks is a one-row subquery of user $1's watermarks, joined as m: read-all
// (r_*), archive-all (a_*) and the seen position (v_*). A missing watermark
// covers nothing: its newest is -infinity, its position zero.
//
//   - r_at, r_id / a_at, a_id: the newest notification it covered, in feed
//     order; r_marked / a_marked: when it was asked; r_snap / a_snap: the
//     snapshot it was asked in (NULL for a read-all from before migration 7,
//     which covers by feed order alone); r_tx, r_seq / a_tx, a_seq: its
//     position in the stream (zero for a read-all from before migration 19,
//     which every change by item since follows); r_over / a_over: how far
//     back the notifications marked unread (unarchived) against it since
//     lie, NULL when none is; a_items: how far back the notifications
//     archived one by one lie, NULL when none is (archive_marks holds it
//     before any archive-all).
//   - v_tx, v_id: the seen position; v_at: its cursor's time, which bounds
//     how old a notification after it may be (IngestSlack before it);
//     v_moved: when it last moved.
const Marks = `(SELECT coalesce(r.through_at, '-infinity') AS r_at, coalesce(r.through_id, 0) AS r_id, r.marked_at AS r_marked,
		r.snapshot AS r_snap, coalesce(r.tx, '0') AS r_tx, coalesce(r.seq, 0) AS r_seq, r.overrides_from AS r_over,
		coalesce(a.through_at, '-infinity') AS a_at, coalesce(a.through_id, 0) AS a_id, a.marked_at AS a_marked,
		a.snapshot AS a_snap, coalesce(a.tx, '0') AS a_tx, coalesce(a.seq, 0) AS a_seq, a.overrides_from AS a_over, a.archived_from AS a_items,
		coalesce(v.through_tx, '0') AS v_tx, coalesce(v.through_id, 0) AS v_id, coalesce(v.through_at, '-infinity') AS v_at, v.seen_at AS v_moved
	FROM (SELECT) one LEFT JOIN read_marks r ON r.user_id = $1 LEFT JOIN archive_marks a ON a.user_id = $1 LEFT JOIN stream_seen v ON v.user_id = $1)`

// The states of a notifications row n under the watermarks m (Marks).
const (
	// readCovers: read-all covers n (ReadAllCovers, on m).
	readCovers = `((n.created_at, n.id) <= (m.r_at, m.r_id) AND coalesce(pg_visible_in_snapshot(n.tx, m.r_snap), true))`
	// readByMark: n is read by read-all, no change by item since.
	readByMark = `(` + readCovers + ` AND (n.read_tx IS NULL OR (n.read_tx, n.read_seq) < (m.r_tx, m.r_seq)))`
	// isRead: n is read, by itself or by read-all.
	isRead = `(n.read_at IS NOT NULL OR ` + readByMark + `)`
	// readAt: when n was read.
	readAt = `coalesce(n.read_at, CASE WHEN ` + readByMark + ` THEN m.r_marked END)`

	archiveCovers  = `((n.created_at, n.id) <= (m.a_at, m.a_id) AND coalesce(pg_visible_in_snapshot(n.tx, m.a_snap), true))`
	archivedByMark = `(` + archiveCovers + ` AND (n.archive_tx IS NULL OR (n.archive_tx, n.archive_seq) < (m.a_tx, m.a_seq)))`
	isArchived     = `(n.archived_at IS NOT NULL OR ` + archivedByMark + `)`
	archivedAt     = `coalesce(n.archived_at, CASE WHEN ` + archivedByMark + ` THEN m.a_marked END)`

	// isSeen: the seen position covers n.
	isSeen = `((n.tx, n.id) <= (m.v_tx, m.v_id))`
	// seenAt: when the first recorded move of the seen position that
	// covers n was made (the seen positions only move forward, so the
	// first by position); a move that covered none of the user's newest
	// notifications in feed order is not recorded, so the watermark's
	// last move when none is.
	seenAt = `CASE WHEN ` + isSeen + ` THEN coalesce((SELECT e.created_at FROM state_events e
		WHERE e.user_id = $1 AND e.kind = 'seen' AND (e.seen_tx, e.seen_id) >= (n.tx, n.id)
		ORDER BY e.seen_tx, e.seen_id LIMIT 1), m.v_moved) END`

	// late is n committed after a watermark was asked (below its newest in
	// feed order, not visible in its snapshot), read by the index of the
	// user's rows in commit order: its transaction was running then or took
	// its id later, so it lies at or above the snapshot's xmin (not below
	// its xmax: a snapshot's xmax is one past the newest transaction
	// completed, so a running one holding the newest id lies at or above
	// it), and it started at most IngestSlack before the watermark was
	// asked. p is r or a, slack the placeholder of IngestSlack.
	late = `(n.tx >= pg_snapshot_xmin(m.P_snap) AND NOT pg_visible_in_snapshot(n.tx, m.P_snap)
		AND (n.created_at, n.id) <= (m.P_at, m.P_id) AND n.created_at >= m.P_marked - SLACK::interval)`
)

// ReadOrArchived holds for a notifications row n read or archived, by
// itself or by a watermark, exactly as the feed shows it (a mark unread
// after a read-all leaves it unread), under the watermarks m of its user
// joined as MarksOf("n.user_id").
const ReadOrArchived = `(` + isRead + ` OR ` + isArchived + `)`

// MarksOf is Marks for the user the SQL expression user names, for a
// LATERAL join over many users' notifications.
func MarksOf(user string) string { return strings.ReplaceAll(Marks, "$1", user) }

// StateColumns are the states of a notifications row n (read_at, seen_at,
// archived_at) under the watermarks m (Marks) of user $1.
const StateColumns = readAt + `, ` + seenAt + `, ` + archivedAt

// lateFor is late for watermark p (r or a) with IngestSlack at placeholder slack.
func lateFor(p, slack string) string {
	return strings.NewReplacer("P_", p+"_", "SLACK", slack).Replace(late)
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
// when its created_at is older. (A mark unread since may have made a
// notification it covers unread again: see States.)
const ReadAllCovers = `((n.created_at, n.id) <= (w.at, w.id) AND coalesce(pg_visible_in_snapshot(n.tx, w.snap), true))`
