package feed

import (
	"encoding/json"
	"time"
)

// Notification is one row of a user's feed, with its inbox states.
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
	// ReadAt is when it was read: marked by itself, or by the read-all
	// that covers it; nil while unread.
	ReadAt *time.Time `json:"read_at"`
	// SeenAt is when the user's seen position first covered it (States);
	// nil while unseen.
	SeenAt *time.Time `json:"seen_at"`
	// ArchivedAt is when it was archived, by itself or by archive-all; nil
	// while it is in the inbox.
	ArchivedAt *time.Time `json:"archived_at"`
}

// Item is a notification as the API shows it: its public id beside its fields.
type Item struct {
	ID string `json:"id"`
	Notification
}

// Item returns the notification as the API shows it.
func (n Notification) Item() Item { return Item{ID: n.PublicID().String(), Notification: n} }

// NotificationFields are the columns of a notifications row n that make a
// Notification, all but its states: the read shape shared with the live
// stream's reads.
const NotificationFields = `n.id, n.type, n.category, n.title, n.body, n.data, n.producer, n.created_at, n.received_at`

// ScanTargets returns where the columns NotificationFields, then its three
// states (read_at, seen_at, archived_at: StateColumns, or a row's own
// columns), scan into, in order: a query may scan columns of its own around
// them.
//
// Data scans as the bytes Postgres sent: as a json.RawMessage pgx would
// parse it (json.Unmarshal) only to keep it as it came.
func (n *Notification) ScanTargets() []any {
	return []any{&n.ID, &n.Type, &n.Category, &n.Title, &n.Body, (*[]byte)(&n.Data), &n.Producer, &n.CreatedAt, &n.ReceivedAt,
		&n.ReadAt, &n.SeenAt, &n.ArchivedAt}
}

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
