package push

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/feed"
)

// Limits of a delivery log page.
const (
	DefaultDeliveriesLimit = 50
	MaxDeliveriesLimit     = 200
)

// ErrBadCursor: a delivery log cursor this server did not make.
var ErrBadCursor = errors.New("malformed cursor")

// Delivery is one dispatch as the delivery log shows it.
type Delivery struct {
	ID             string  `json:"id"`
	NotificationID *string `json:"notification_id"` // null when cancelled: it never existed
	Title          string  `json:"title"`
	Category       string  `json:"category"`
	UserID         string  `json:"user_id"`
	Token          *string `json:"token"` // masked
	// Provider reaches the device: expo, webpush, apns, fcm; null for a
	// row without a device (skipped, cancelled before any).
	Provider  *string    `json:"provider"`
	State     string     `json:"state"`
	Error     *string    `json:"error"`
	TicketID  *string    `json:"ticket_id"`
	CreatedAt time.Time  `json:"created_at"`
	SentAt    *time.Time `json:"sent_at"`
	UpdatedAt time.Time  `json:"updated_at"`
	// Clear is the clear sent to the device once the notification was read
	// or archived; absent when there is none.
	Clear *DeliveryClear `json:"clear,omitempty"`
	seq   int64
}

// DeliveryClear is what became of a dispatch's clear (see
// DispatcherConfig.ClearOnRead).
type DeliveryClear struct {
	State     string     `json:"state"` // queued, sending, sent, failed, skipped
	Error     *string    `json:"error"`
	TicketID  *string    `json:"ticket_id"`
	CreatedAt time.Time  `json:"created_at"` // when the read or archive committed
	SentAt    *time.Time `json:"sent_at"`
}

// DeliveryQuery selects a page of the delivery log.
type DeliveryQuery struct {
	UserID string // "" for every user
	State  string // "" for every state
	Limit  int
	Cursor string // "" for the newest
}

// DeliveryPage is one page of the delivery log, newest first.
type DeliveryPage struct {
	Data       []Delivery `json:"data"`
	HasMore    bool       `json:"has_more"`
	NextCursor *string    `json:"next_cursor"`
}

// Validate reports a cursor this server did not make (ErrBadCursor) before
// any read: a caller that may read from a replica, then the primary, learns
// of it once.
func (q DeliveryQuery) Validate() error {
	if q.Cursor == "" {
		return nil
	}
	_, _, err := decodeCursor(q.Cursor)
	return err
}

// DeliveryReader is what Deliveries needs of Postgres: a pool, a connection,
// or a transaction (on a read replica).
type DeliveryReader interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// States lists the dispatch states, for validating a filter.
var States = []string{StateQueued, StateSent, StateDelivered, StateReceiptError, StateReceiptMissing, StateFailed, StateSkipped,
	StateDeferred, StateDigested, StateThrottled, StateSuppressed, StateCancelled}

// Deliveries returns a keyset page of dispatches on (created_at DESC, id
// DESC), with their notification's title and category and the token masked.
func Deliveries(ctx context.Context, db DeliveryReader, q DeliveryQuery) (DeliveryPage, error) {
	limit := q.Limit
	if limit == 0 {
		limit = DefaultDeliveriesLimit
	}
	// A cancelled dispatch's title and category are its scheduled row's,
	// kept as long as the log keeps it.
	sql := `SELECT d.id, d.created_at, d.notification_id, d.notification_created_at,
			coalesce(n.title, s.title, ''), coalesce(n.category, s.category, ''),
			d.user_id, d.token, d.state, d.error, d.ticket_id, d.sent_at, d.updated_at,
			c.state, c.error, c.ticket_id, c.created_at, c.sent_at,
			CASE WHEN d.token IS NOT NULL THEN coalesce(v.provider, CASE WHEN d.token LIKE 'WebPush[%' THEN 'webpush' ELSE 'expo' END) END
		FROM push_dispatches d
		LEFT JOIN notifications n ON d.state <> 'cancelled' AND n.id = d.notification_id AND n.created_at = d.notification_created_at
		LEFT JOIN scheduled_notifications s ON d.state = 'cancelled' AND s.id = d.notification_id
		LEFT JOIN push_clears c ON c.notification_id = d.notification_id AND c.token = d.token
		LEFT JOIN devices v ON v.token = d.token
		WHERE true`
	args := []any{limit + 1}
	if q.UserID != "" {
		args = append(args, q.UserID)
		sql += fmt.Sprintf(" AND d.user_id = $%d", len(args))
	}
	if q.State != "" {
		args = append(args, q.State)
		sql += fmt.Sprintf(" AND d.state = $%d", len(args))
	}
	if q.Cursor != "" {
		at, id, err := decodeCursor(q.Cursor)
		if err != nil {
			return DeliveryPage{}, err
		}
		args = append(args, at, id)
		sql += fmt.Sprintf(" AND (d.created_at, d.id) < ($%d, $%d) AND d.created_at <= $%d", len(args)-1, len(args), len(args)-1)
	}
	rows, err := db.Query(ctx, sql+" ORDER BY d.created_at DESC, d.id DESC LIMIT $1", args...)
	if err != nil {
		return DeliveryPage{}, fmt.Errorf("read deliveries: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		var nid int64
		var ncreated time.Time
		var clearState *string
		var clear DeliveryClear
		var clearCreated *time.Time
		err := r.Scan(&d.seq, &d.CreatedAt, &nid, &ncreated, &d.Title, &d.Category, &d.UserID, &d.Token, &d.State, &d.Error, &d.TicketID, &d.SentAt, &d.UpdatedAt,
			&clearState, &clear.Error, &clear.TicketID, &clearCreated, &clear.SentAt, &d.Provider)
		if clearState != nil && clearCreated != nil {
			clear.State, clear.CreatedAt = *clearState, *clearCreated
			d.Clear = &clear
		}
		d.ID = encodeCursor(d.CreatedAt, d.seq)
		if d.State != StateCancelled {
			id := feed.ID{CreatedAt: ncreated, Seq: nid}.String()
			d.NotificationID = &id
		}
		if d.Token != nil {
			masked := MaskToken(*d.Token)
			d.Token = &masked
		}
		return d, err
	})
	if err != nil {
		return DeliveryPage{}, fmt.Errorf("read deliveries: %w", err)
	}
	page := DeliveryPage{Data: items}
	if page.Data == nil {
		page.Data = []Delivery{}
	}
	if len(items) > limit {
		page.Data, page.HasMore = items[:limit], true
		next := page.Data[limit-1].ID
		page.NextCursor = &next
	}
	return page, nil
}

// MaskToken shows enough of a push token to tell two apart in a log, and no
// more: ExponentPushToken[abcd…wxyz], and an APNs or FCM token's first and
// last four characters (9f3a…c01d).
func MaskToken(token string) string {
	open := strings.IndexByte(token, '[')
	if open < 0 || !strings.HasSuffix(token, "]") {
		if len(token) <= 12 {
			return "…"
		}
		return token[:4] + "…" + token[len(token)-4:]
	}
	if len(token)-open-2 <= 8 {
		return token[:open+1] + "…]"
	}
	inner := token[open+1 : len(token)-1]
	return token[:open+1] + inner[:4] + "…" + inner[len(inner)-4:] + "]"
}

// A delivery's id, and the log's cursor, is its (created_at, id), opaque.
func encodeCursor(at time.Time, id int64) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(at.UnixMicro()))
	binary.BigEndian.PutUint64(b[8:], uint64(id))
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func decodeCursor(s string) (time.Time, int64, error) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(b) != 16 {
		return time.Time{}, 0, ErrBadCursor
	}
	at := time.UnixMicro(int64(binary.BigEndian.Uint64(b[:8]))).UTC()
	id := int64(binary.BigEndian.Uint64(b[8:]))
	if id <= 0 || encodeCursor(at, id) != s {
		return time.Time{}, 0, ErrBadCursor
	}
	return at, id, nil
}
