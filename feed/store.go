package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
type Store struct{ db DB }

// NewStore returns a store over db.
func NewStore(db DB) *Store { return &Store{db: db} }

const pageColumns = `id, type, category, title, body, data, producer, created_at, received_at, read_at`

// Page returns the page q names, newest first. It reads limit+1 rows to learn
// whether another page follows.
func (s *Store) Page(ctx context.Context, q Query) (Page, error) {
	limit := q.Limit
	if limit == 0 {
		limit = DefaultLimit
	}
	if limit < 1 || limit > MaxLimit {
		return Page{}, fmt.Errorf("limit %d: want 1..%d", limit, MaxLimit)
	}
	sql := `SELECT ` + pageColumns + ` FROM notifications WHERE user_id = $1`
	args := []any{q.UserID, limit + 1}
	if q.UnreadOnly {
		sql += ` AND read_at IS NULL`
	}
	if q.After != nil {
		// A row comparison matches the index order, so the scan starts right
		// at the cursor whatever its depth.
		sql += ` AND (created_at, id) < ($3, $4)`
		args = append(args, q.After.CreatedAt, q.After.ID)
	}
	sql += ` ORDER BY created_at DESC, id DESC LIMIT $2`
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		return Page{}, fmt.Errorf("read feed: %w", err)
	}
	items, err := pgx.CollectRows(rows, scanNotification)
	if err != nil {
		return Page{}, fmt.Errorf("read feed: %w", err)
	}
	p := Page{Items: items}
	if len(items) > limit {
		p.Items, p.HasMore = items[:limit], true
		last := p.Items[limit-1]
		p.Next = Cursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	return p, nil
}

func scanNotification(row pgx.CollectableRow) (Notification, error) {
	var n Notification
	err := row.Scan(&n.ID, &n.Type, &n.Category, &n.Title, &n.Body, &n.Data, &n.Producer, &n.CreatedAt, &n.ReceivedAt, &n.ReadAt)
	return n, err
}

// MarkRead marks one of the user's notifications read. Marking it again is
// not an error; another user's notification is ErrNotFound.
func (s *Store) MarkRead(ctx context.Context, userID string, id int64) error {
	var found bool
	err := s.db.QueryRow(ctx, `WITH target AS (
			SELECT id FROM notifications WHERE id = $1 AND user_id = $2
		), marked AS (
			UPDATE notifications n SET read_at = now() FROM target t WHERE n.id = t.id AND n.read_at IS NULL
		)
		SELECT EXISTS (SELECT 1 FROM target)`, id, userID).Scan(&found)
	if err != nil {
		return fmt.Errorf("mark read: %w", err)
	}
	if !found {
		return ErrNotFound
	}
	return nil
}

// MarkAllRead marks every unread notification of the user read and returns how many.
func (s *Store) MarkAllRead(ctx context.Context, userID string) (int64, error) {
	tag, err := s.db.Exec(ctx, `UPDATE notifications SET read_at = now() WHERE user_id = $1 AND read_at IS NULL`, userID)
	if err != nil {
		return 0, fmt.Errorf("mark all read: %w", err)
	}
	return tag.RowsAffected(), nil
}

// UnreadCount counts the user's unread notifications up to UnreadCap; capped
// is true when there are more. It never counts a whole feed.
func (s *Store) UnreadCount(ctx context.Context, userID string) (count int, capped bool, err error) {
	err = s.db.QueryRow(ctx, `SELECT count(*) FROM (
			SELECT 1 FROM notifications WHERE user_id = $1 AND read_at IS NULL LIMIT $2
		) unread`, userID, UnreadCap+1).Scan(&count)
	if err != nil {
		return 0, false, fmt.Errorf("unread count: %w", err)
	}
	if count > UnreadCap {
		return UnreadCap, true, nil
	}
	return count, false, nil
}

// FormatID is how a notification id appears in the API: a decimal string.
func FormatID(id int64) string { return strconv.FormatInt(id, 10) }

// ParseID reads an API notification id; anything but a positive decimal is ErrNotFound.
func ParseID(s string) (int64, error) {
	if s == "" || s[0] < '1' || s[0] > '9' {
		return 0, ErrNotFound
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, ErrNotFound
	}
	return id, nil
}
