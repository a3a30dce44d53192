package feed

import (
	"encoding/json"
	"time"
)

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
