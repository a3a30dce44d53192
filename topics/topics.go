// Package topics keeps topics and their members: named sets of users that
// services fill in bulk and that users join themselves where an operator
// opened the topic.
package topics

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/event"
)

// Limits of the API.
const (
	// MaxChange is how many users one membership change may name (added
	// and removed together).
	MaxChange = 10_000
	// MaxUserLen is a member's id's longest, an event recipient's.
	MaxUserLen = 256
	// MaxListPage is the longest page of a user's topics.
	MaxListPage = 1000
)

// ErrInvalid is a request that breaks a rule; its text says which.
var ErrInvalid = errors.New("invalid")

// ErrNotFound: no such topic, or, for a user, not one open to subscription
// (a closed topic is not told apart from a missing one).
var ErrNotFound = errors.New("no such topic open to subscription")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// CheckName reports whether name is a topic's name: 1–128 of a-z, 0-9,
// '.', '_' and '-', the first a letter or digit.
func CheckName(name string) error {
	if !event.ValidTopic(name) {
		return invalid("topic %.140q: a topic's name is 1 to 128 of a-z, 0-9, '.', '_' and '-', the first a letter or digit", name)
	}
	return nil
}

// CheckUser reports whether id can be a member: an event recipient's rules.
func CheckUser(id string) error {
	switch {
	case strings.TrimSpace(id) == "":
		return invalid("a user id is empty")
	case len(id) > MaxUserLen:
		return invalid("user %.40q…: longer than %d bytes", id, MaxUserLen)
	case !utf8.ValidString(id):
		return invalid("user %q: not valid UTF-8", id)
	case strings.ContainsRune(id, 0):
		return invalid("user %q: contains a NUL character", id)
	}
	return nil
}

// DB is what the store needs of Postgres.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Store reads and writes topics.
type Store struct{ db DB }

// NewStore returns a store on db.
func NewStore(db DB) *Store { return &Store{db: db} }

// Topic is a topic's settings.
type Topic struct {
	Name string `json:"name"`
	// Open: users may subscribe and unsubscribe themselves.
	Open      bool      `json:"open"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Subscription is a user's membership of a topic.
type Subscription struct {
	Topic        string    `json:"topic"`
	Open         bool      `json:"open"`
	SubscribedAt time.Time `json:"subscribed_at"`
}

// Change is what a membership change did: the users it added (not members
// before) and removed (members before).
type Change struct {
	Added   int `json:"added"`
	Removed int `json:"removed"`
}

// CheckChange validates a membership change: a topic's name, at most
// MaxChange users in all, each a valid id, none both added and removed.
func CheckChange(topic string, add, remove []string) error {
	if err := CheckName(topic); err != nil {
		return err
	}
	if len(add)+len(remove) > MaxChange {
		return invalid("%d users named; at most %d a request (added and removed together)", len(add)+len(remove), MaxChange)
	}
	for _, u := range slices.Concat(add, remove) {
		if err := CheckUser(u); err != nil {
			return err
		}
	}
	removing := make(map[string]bool, len(remove))
	for _, u := range remove {
		removing[u] = true
	}
	for _, u := range add {
		if removing[u] {
			return invalid("user %q is both added and removed", u)
		}
	}
	return nil
}

// ChangeMembers adds and removes members of topic in one transaction,
// creating the topic (closed) when it adds to one that does not exist.
// Adding a member keeps its subscription as it was; removing a user who
// is not one changes nothing: the same change twice does nothing more.
func (s *Store) ChangeMembers(ctx context.Context, topic string, add, remove []string) (Change, error) {
	// Sorted and once each: two changes naming the same new members in
	// other orders would otherwise each wait for a row the other inserted,
	// and Postgres would end one as a deadlock.
	add = slices.Compact(slices.Sorted(slices.Values(add)))
	remove = slices.Compact(slices.Sorted(slices.Values(remove)))
	if err := CheckChange(topic, add, remove); err != nil {
		return Change{}, err
	}
	var c Change
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if len(add) > 0 {
			if _, err := tx.Exec(ctx, `INSERT INTO topics (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, topic); err != nil {
				return err
			}
		}
		return tx.QueryRow(ctx, `WITH removed AS (
				DELETE FROM topic_members WHERE topic = $1 AND user_id = ANY($3::text[]) RETURNING 1
			), added AS (
				INSERT INTO topic_members (topic, user_id) SELECT $1, u FROM unnest($2::text[]) u
				ON CONFLICT (topic, user_id) DO NOTHING RETURNING 1
			)
			SELECT (SELECT count(*) FROM added), (SELECT count(*) FROM removed)`, topic, add, remove).Scan(&c.Added, &c.Removed)
	})
	if err != nil {
		return Change{}, fmt.Errorf("change the members of topic %s: %w", topic, err)
	}
	return c, nil
}

// Set creates topic or changes whether it is open; created reports which.
func (s *Store) Set(ctx context.Context, topic string, open bool) (t Topic, created bool, err error) {
	if err := CheckName(topic); err != nil {
		return Topic{}, false, err
	}
	err = s.db.QueryRow(ctx, `INSERT INTO topics AS t (name, open) VALUES ($1, $2)
		ON CONFLICT (name) DO UPDATE SET open = excluded.open,
			updated_at = CASE WHEN t.open = excluded.open THEN t.updated_at ELSE now() END
		RETURNING name, open, created_at, updated_at, xmax = 0`, topic, open).Scan(&t.Name, &t.Open, &t.CreatedAt, &t.UpdatedAt, &created)
	if err != nil {
		return Topic{}, false, fmt.Errorf("set topic %s: %w", topic, err)
	}
	return t, created, nil
}

// Get returns a topic's settings, or ErrNotFound.
func (s *Store) Get(ctx context.Context, topic string) (Topic, error) {
	if err := CheckName(topic); err != nil {
		return Topic{}, err
	}
	var t Topic
	err := s.db.QueryRow(ctx, `SELECT name, open, created_at, updated_at FROM topics WHERE name = $1`, topic).Scan(&t.Name, &t.Open, &t.CreatedAt, &t.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Topic{}, ErrNotFound
	}
	if err != nil {
		return Topic{}, fmt.Errorf("read topic %s: %w", topic, err)
	}
	return t, nil
}

// Subscribe makes user a member of an open topic, and returns the
// subscription; created is false when the user was one already (its
// subscription unchanged). ErrNotFound: no such topic open.
func (s *Store) Subscribe(ctx context.Context, user, topic string) (sub Subscription, created bool, err error) {
	if err := CheckName(topic); err != nil {
		return Subscription{}, false, err
	}
	if err := CheckUser(user); err != nil {
		return Subscription{}, false, err
	}
	// A statement finds neither its insert nor a row in its snapshot only
	// when another request subscribed the user after the snapshot was
	// taken; the next statement sees that row, or inserts if a leave took
	// it meanwhile.
	for range 3 {
		var open bool
		var added, before *time.Time
		err = s.db.QueryRow(ctx, `WITH t AS (SELECT name FROM topics WHERE name = $1 AND open),
				ins AS (INSERT INTO topic_members (topic, user_id) SELECT name, $2 FROM t
				        ON CONFLICT (topic, user_id) DO NOTHING RETURNING subscribed_at)
			SELECT EXISTS (SELECT 1 FROM t), (SELECT subscribed_at FROM ins),
			       (SELECT subscribed_at FROM topic_members WHERE topic = $1 AND user_id = $2)`, topic, user).Scan(&open, &added, &before)
		switch {
		case err != nil:
			return Subscription{}, false, fmt.Errorf("subscribe to topic %s: %w", topic, err)
		case !open:
			return Subscription{}, false, ErrNotFound
		case added != nil:
			return Subscription{Topic: topic, Open: true, SubscribedAt: *added}, true, nil
		case before != nil:
			return Subscription{Topic: topic, Open: true, SubscribedAt: *before}, false, nil
		}
	}
	return Subscription{}, false, fmt.Errorf("subscribe to topic %s: the subscription changed under three tries in a row; retry", topic)
}

// Unsubscribe ends user's membership of an open topic; not being a member
// is no error. ErrNotFound: no such topic open.
func (s *Store) Unsubscribe(ctx context.Context, user, topic string) error {
	if err := CheckName(topic); err != nil {
		return err
	}
	var open bool
	err := s.db.QueryRow(ctx, `WITH t AS (SELECT name FROM topics WHERE name = $1 AND open),
			d AS (DELETE FROM topic_members m USING t WHERE m.topic = t.name AND m.user_id = $2 RETURNING 1)
		SELECT EXISTS (SELECT 1 FROM t)`, topic, user).Scan(&open)
	if err != nil {
		return fmt.Errorf("unsubscribe from topic %s: %w", topic, err)
	}
	if !open {
		return ErrNotFound
	}
	return nil
}

// List returns user's subscriptions by topic name, after the name after
// (empty: from the first), at most limit; more reports whether there are
// others after them.
func (s *Store) List(ctx context.Context, user, after string, limit int) (subs []Subscription, more bool, err error) {
	if limit < 1 || limit > MaxListPage {
		return nil, false, invalid("limit %d: want 1 to %d", limit, MaxListPage)
	}
	if after != "" {
		if err := CheckName(after); err != nil {
			return nil, false, fmt.Errorf("after: %w", err)
		}
	}
	rows, err := s.db.Query(ctx, `SELECT m.topic, t.open, m.subscribed_at FROM topic_members m JOIN topics t ON t.name = m.topic
		WHERE m.user_id = $1 AND m.topic > $2 ORDER BY m.topic LIMIT $3`, user, after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list the topics of %s: %w", user, err)
	}
	subs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Subscription, error) {
		var s Subscription
		return s, r.Scan(&s.Topic, &s.Open, &s.SubscribedAt)
	})
	if err != nil {
		return nil, false, fmt.Errorf("list the topics of %s: %w", user, err)
	}
	if len(subs) > limit {
		return subs[:limit], true, nil
	}
	return subs, false, nil
}
