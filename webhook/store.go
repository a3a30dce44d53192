package webhook

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/internal/clock"
)

// Event types an endpoint can take.
const (
	NotificationCreated  = "notification.created"
	NotificationRead     = "notification.read"
	NotificationArchived = "notification.archived"
	PushSent             = "push.sent"
	PushDelivered        = "push.delivered"
	PushFailed           = "push.failed" // failed, receipt_error, receipt_missing
	PushSkipped          = "push.skipped"
	PushDeferred         = "push.deferred"
	PushDigested         = "push.digested"
	PushThrottled        = "push.throttled"
	PushSuppressed       = "push.suppressed"
	PushCancelled        = "push.cancelled"
	TopicFanoutCompleted = "topic.fanout.completed"
)

// EventTypes are every type, in the order the docs list them.
var EventTypes = []string{NotificationCreated, NotificationRead, NotificationArchived, PushSent, PushDelivered, PushFailed,
	PushSkipped, PushDeferred, PushDigested, PushThrottled, PushSuppressed, PushCancelled, TopicFanoutCompleted}

// Limits of an endpoint's definition.
const (
	MaxDescriptionLen = 512
	MaxEndpoints      = 100
	// MaxOverlap bounds how long a rotated-out secret still signs.
	MaxOverlap = 7 * 24 * time.Hour
	// DefaultOverlap is a rotation's overlap when none is asked for.
	DefaultOverlap = 24 * time.Hour
)

// Errors of the admin API.
var (
	ErrNotFound     = errors.New("webhook: no such endpoint")
	ErrTooMany      = fmt.Errorf("webhook: at most %d endpoints", MaxEndpoints)
	ErrInvalidInput = errors.New("webhook: invalid endpoint")
)

// DB is what the store and the deliverer need of Postgres: a pgxpool.Pool.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Endpoint is one subscriber, as the admin API shows it. Secret is set only
// in the answer that made it.
type Endpoint struct {
	ID             string     `json:"id"`
	URL            string     `json:"url"`
	Description    string     `json:"description"`
	Events         []string   `json:"events"`
	Secret         string     `json:"secret,omitempty"`
	Enabled        bool       `json:"enabled"`
	DisabledReason *string    `json:"disabled_reason"`
	DisabledAt     *time.Time `json:"disabled_at"`
	FailingSince   *time.Time `json:"failing_since"`
	// PreviousSecretUntil: a rotated-out secret signs beside the new one until then.
	PreviousSecretUntil *time.Time `json:"previous_secret_until"`
	CreatedAt           time.Time  `json:"created_at"`
}

// NewEndpoint is what creating an endpoint takes.
type NewEndpoint struct {
	URL         string   `json:"url"`
	Events      []string `json:"events"`
	Description string   `json:"description"`
}

// StoreConfig configures a Store.
type StoreConfig struct {
	DB DB
	// AllowPrivate lets endpoints target loopback, link-local and private
	// addresses (--webhook-allow-private).
	AllowPrivate bool
	Clock        clock.Clock
}

// Store is the admin API's view of endpoints and their deliveries.
type Store struct{ cfg StoreConfig }

// NewStore returns a store.
func NewStore(cfg StoreConfig) *Store {
	cfg.Clock = clock.Or(cfg.Clock)
	return &Store{cfg: cfg}
}

// InputError is a request the admin API refuses, naming the field at fault.
type InputError struct{ Field, Detail string }

func (e *InputError) Error() string        { return e.Field + ": " + e.Detail }
func (e *InputError) Is(target error) bool { return target == ErrInvalidInput }

func invalid(field, format string, args ...any) error {
	return &InputError{Field: field, Detail: fmt.Sprintf(format, args...)}
}

// check validates a new endpoint; its events come back deduplicated, in
// the order of EventTypes.
func (s *Store) check(ctx context.Context, e NewEndpoint) ([]string, error) {
	if err := CheckURL(ctx, e.URL, s.cfg.AllowPrivate); err != nil {
		if errors.Is(err, ErrPrivateTarget) {
			return nil, invalid("url", "%v (start central with --webhook-allow-private to permit it)", err)
		}
		return nil, invalid("url", "%v", err)
	}
	if len(e.Events) == 0 {
		return nil, invalid("events", "name at least one of %s", strings.Join(EventTypes, ", "))
	}
	for _, t := range e.Events {
		if !slices.Contains(EventTypes, t) {
			return nil, invalid("events", "%q is not an event type; want one of %s", t, strings.Join(EventTypes, ", "))
		}
	}
	if len(e.Description) > MaxDescriptionLen {
		return nil, invalid("description", "longer than %d bytes", MaxDescriptionLen)
	}
	var events []string
	for _, t := range EventTypes {
		if slices.Contains(e.Events, t) {
			events = append(events, t)
		}
	}
	return events, nil
}

// newID names an endpoint: ep_ and 16 random bytes in lower-case base32.
func newID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return "ep_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

const endpointColumns = `id, url, description, events, enabled, disabled_reason, disabled_at, failing_since,
	CASE WHEN previous_secret_until > $1 THEN previous_secret_until END, created_at`

func scanEndpoint(row pgx.Row) (Endpoint, error) {
	var e Endpoint
	err := row.Scan(&e.ID, &e.URL, &e.Description, &e.Events, &e.Enabled, &e.DisabledReason, &e.DisabledAt, &e.FailingSince,
		&e.PreviousSecretUntil, &e.CreatedAt)
	return e, err
}

// Create adds an endpoint and returns it with its secret, the one time the
// secret is shown.
func (s *Store) Create(ctx context.Context, e NewEndpoint) (Endpoint, error) {
	events, err := s.check(ctx, e)
	if err != nil {
		return Endpoint{}, err
	}
	secret := NewSecret()
	// The count and the insert in one statement, under a lock on the table
	// only creates take, so concurrent creates cannot pass the cap together.
	tx, err := s.cfg.DB.Begin(ctx)
	if err != nil {
		return Endpoint{}, err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('spoolcast webhook endpoints'))`); err != nil {
		return Endpoint{}, err
	}
	out, err := scanEndpoint(tx.QueryRow(ctx, `INSERT INTO webhook_endpoints (id, url, description, events, secret, created_at, updated_at)
		SELECT $2, $3, $4, $5, $6, $1, $1 WHERE (SELECT count(*) FROM webhook_endpoints) < $7
		RETURNING `+endpointColumns, s.cfg.Clock.Now(), newID(), e.URL, e.Description, events, secret, MaxEndpoints))
	if errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, ErrTooMany
	}
	if err != nil {
		return Endpoint{}, fmt.Errorf("create webhook endpoint: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Endpoint{}, err
	}
	out.Secret = secret
	return out, nil
}

// List returns every endpoint, oldest first, without secrets.
func (s *Store) List(ctx context.Context) ([]Endpoint, error) {
	rows, err := s.cfg.DB.Query(ctx, `SELECT `+endpointColumns+` FROM webhook_endpoints ORDER BY created_at, id`, s.cfg.Clock.Now())
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Endpoint, error) { return scanEndpoint(r) })
	if out == nil {
		out = []Endpoint{}
	}
	return out, err
}

// Get returns one endpoint without its secret.
func (s *Store) Get(ctx context.Context, id string) (Endpoint, error) {
	e, err := scanEndpoint(s.cfg.DB.QueryRow(ctx, `SELECT `+endpointColumns+` FROM webhook_endpoints WHERE id = $2`, s.cfg.Clock.Now(), id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, ErrNotFound
	}
	return e, err
}

// Delete removes an endpoint, its deliveries and their log.
func (s *Store) Delete(ctx context.Context, id string) error {
	// The endpoint alone: nothing is sent to it from this commit on (the
	// deliverer leases only enabled endpoints' rows), and its deliveries
	// and log, however many, go a batch at a time in Maintain.
	tag, err := s.cfg.DB.Exec(ctx, `DELETE FROM webhook_endpoints WHERE id = $1`, id)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// RotateSecret gives the endpoint a new secret and returns it; the old one
// signs beside it for overlap (0: not at all, for a leaked secret), so
// receivers can switch without dropping a delivery. A rotation during
// another's overlap ends that older secret.
func (s *Store) RotateSecret(ctx context.Context, id string, overlap time.Duration) (secret string, oldUntil time.Time, err error) {
	if overlap < 0 || overlap > MaxOverlap {
		return "", time.Time{}, invalid("overlap", "between 0s and %s", MaxOverlap)
	}
	secret = NewSecret()
	now := s.cfg.Clock.Now()
	err = s.cfg.DB.QueryRow(ctx, `UPDATE webhook_endpoints SET previous_secret = secret, previous_secret_until = $3,
			secret = $2, updated_at = $4
		WHERE id = $1 RETURNING previous_secret_until`, id, secret, now.Add(overlap), now).Scan(&oldUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", time.Time{}, ErrNotFound
	}
	return secret, oldUntil, err
}

// Replay sends again every delivery of the endpoint created at or after
// since, whatever became of it, with its own webhook-id (receivers
// deduplicate), and turns a disabled endpoint back on: replaying is how an
// operator says the receiver is back. It returns how many it queued. The
// deliveries are queued replayBatch at a time, newest first, each batch its
// own statement, so that no lock or transaction grows with the endpoint's
// traffic; a ctx that ends midway leaves the older ones as they were (n
// says how many were queued), and calling again with the same since
// finishes it, sending the newer ones once more under their webhook-ids.
func (s *Store) Replay(ctx context.Context, id string, since time.Time) (n int64, err error) {
	now := s.cfg.Clock.Now()
	if since.After(now) {
		return 0, invalid("since", "in the future")
	}
	tag, err := s.cfg.DB.Exec(ctx, `UPDATE webhook_endpoints SET enabled = true, disabled_reason = NULL, disabled_at = NULL,
		failing_since = NULL, updated_at = $2 WHERE id = $1`, id, now)
	if err != nil {
		return 0, err
	}
	if tag.RowsAffected() == 0 {
		return 0, ErrNotFound
	}
	// A replayed delivery gets a fresh retry period from now: created_at is
	// what the body says; replayed_at is what the retry deadline counts from
	// (and, equal to now, marks the rows this replay has done). The last
	// attempt's columns are the new run's, so it is new again.
	var upper *time.Time // the first batch from the newest
	for {
		var done int64
		var oldest *time.Time
		err := s.cfg.DB.QueryRow(ctx, `WITH replayed AS (
				UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = $3, replayed_at = $3,
					attempts = 0, ended_at = NULL, last_attempt_at = NULL, last_status = NULL, last_error = NULL
				WHERE id IN (SELECT id FROM webhook_deliveries
					WHERE endpoint_id = $1 AND created_at >= $2 AND ($4::timestamptz IS NULL OR created_at <= $4) AND replayed_at IS DISTINCT FROM $3
					ORDER BY created_at DESC LIMIT $5)
				RETURNING created_at)
			SELECT count(*), min(created_at) FROM replayed`, id, since, now, upper, replayBatch).Scan(&done, &oldest)
		if err != nil {
			return n, err
		}
		n += done
		if done < replayBatch || oldest == nil {
			return n, nil
		}
		upper = oldest
	}
}

// replayBatch is how many deliveries one statement of a replay queues.
const replayBatch = 5000

// Attempt is one try at a delivery, for the delivery log.
type Attempt struct {
	ID          int64     `json:"-"`
	DeliveryID  string    `json:"delivery_id"`
	Type        string    `json:"type"`
	AttemptedAt time.Time `json:"attempted_at"`
	Status      *int      `json:"status"`
	Error       *string   `json:"error"`
	DurationMS  int       `json:"duration_ms"`
	// State is where the delivery stands now: pending, delivered or failed.
	State    string `json:"state"`
	Attempts int    `json:"attempts"`
}

// Attempts returns the endpoint's delivery log, newest first: up to limit
// attempts older than the one with id before (0: from the newest).
func (s *Store) Attempts(ctx context.Context, id string, before int64, limit int) ([]Attempt, error) {
	if _, err := s.Get(ctx, id); err != nil {
		return nil, err
	}
	rows, err := s.cfg.DB.Query(ctx, `SELECT a.id, a.delivery_id::text, coalesce(d.type, ''), a.attempted_at, a.status, a.error, a.duration_ms,
			coalesce(d.state, 'deleted'), coalesce(d.attempts, 0)
		FROM webhook_attempts a LEFT JOIN webhook_deliveries d ON d.id = a.delivery_id
		WHERE a.endpoint_id = $1 AND ($2 = 0 OR a.id < $2)
		ORDER BY a.id DESC LIMIT $3`, id, before, limit)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		err := r.Scan(&a.ID, &a.DeliveryID, &a.Type, &a.AttemptedAt, &a.Status, &a.Error, &a.DurationMS, &a.State, &a.Attempts)
		return a, err
	})
	if out == nil {
		out = []Attempt{}
	}
	return out, err
}
