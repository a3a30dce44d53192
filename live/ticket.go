package live

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/internal/clock"
)

// TicketTTL is how long a stream ticket may wait for its one use: an app
// asks for one just before it opens the stream.
const TicketTTL = 30 * time.Second

// ticketBytes is a ticket's randomness: 256 bits, so that a SHA-256 of it
// is all a replica needs to keep (no guess reaches one, no salt is needed).
const ticketBytes = 32

// ErrTicket: the ticket was used, has expired, or was never issued (answer 401).
var ErrTicket = errors.New("the stream ticket was used, has expired, or was never issued")

// Ticket is a one-use stand-in for a user's token on the stream's URL.
type Ticket struct {
	Value     string    `json:"ticket"`
	ExpiresAt time.Time `json:"expires_at"`
}

// TicketRefused is why a ticket is refused, for the problem's detail.
const TicketRefused = "the ticket was used, has expired, or was never issued: each connection needs a new one (POST /v1/stream/tickets)"

// Tickets issues and redeems stream tickets, for a browser's EventSource,
// which cannot send headers: the app asks for a ticket with its token and
// opens /v1/stream?ticket=…, so the token itself never rides in a URL.
// Tickets are kept in Postgres (the SHA-256 of each, its user and its
// expiry), so a ticket one replica issued is redeemed at any other; a
// redeemed ticket is deleted in the same statement, so it serves once.
type Tickets struct {
	db      DB
	clock   clock.Clock
	metrics *Metrics
}

// NewTickets returns the tickets kept in db, expiring by clk (default the
// wall clock), counted in m (nil: not exported).
func NewTickets(db DB, clk clock.Clock, m *Metrics) *Tickets {
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Tickets{db: db, clock: clock.Or(clk), metrics: m}
}

// Issue makes a ticket for user, valid for TicketTTL.
func (t *Tickets) Issue(ctx context.Context, user string) (Ticket, error) {
	var raw [ticketBytes]byte
	_, _ = rand.Read(raw[:]) // never fails (crypto/rand)
	tk := Ticket{Value: base64.RawURLEncoding.EncodeToString(raw[:]), ExpiresAt: t.clock.Now().Add(TicketTTL).UTC().Truncate(time.Microsecond)}
	sum := sha256.Sum256([]byte(tk.Value))
	var n int
	if err := t.db.QueryRow(ctx, `WITH i AS (INSERT INTO stream_tickets (hash, user_id, expires_at) VALUES ($1, $2, $3) RETURNING 1)
		SELECT count(*) FROM i`, sum[:], user, tk.ExpiresAt).Scan(&n); err != nil {
		return Ticket{}, fmt.Errorf("issue a stream ticket: %w", err)
	}
	t.metrics.tickets.WithLabelValues("issued").Inc()
	return tk, nil
}

// User is a ticket's user, without using it up: ErrTicket when it was used,
// has expired, or was never issued. The stream checks a ticket with it,
// and redeems it only once the handshake passed every other check, so
// that a handshake refused for another reason (too many streams, a
// replica not ready, a cursor refused) leaves the app its ticket.
func (t *Tickets) User(ctx context.Context, ticket string) (string, error) {
	sum, ok := t.hash(ticket)
	if !ok {
		return "", ErrTicket
	}
	var user string
	var expires time.Time
	err := t.db.QueryRow(ctx, `SELECT user_id, expires_at FROM stream_tickets WHERE hash = $1`, sum[:]).Scan(&user, &expires)
	switch {
	case errors.Is(err, pgx.ErrNoRows) || err == nil && !t.clock.Now().Before(expires):
		t.metrics.tickets.WithLabelValues("refused").Inc()
		return "", ErrTicket
	case err != nil:
		return "", fmt.Errorf("check a stream ticket: %w", err)
	}
	return user, nil
}

// hash is the key a ticket is kept under; ok is false, the refusal
// counted, for what cannot be a ticket.
func (t *Tickets) hash(ticket string) (sum [sha256.Size]byte, ok bool) {
	if base64.RawURLEncoding.DecodedLen(len(ticket)) != ticketBytes {
		t.metrics.tickets.WithLabelValues("refused").Inc()
		return sum, false
	}
	return sha256.Sum256([]byte(ticket)), true
}

// Redeem uses a ticket up and returns its user: ErrTicket when it was used,
// has expired, or was never issued.
func (t *Tickets) Redeem(ctx context.Context, ticket string) (string, error) {
	sum, ok := t.hash(ticket)
	if !ok {
		return "", ErrTicket
	}
	var user string
	var expires time.Time
	err := t.db.QueryRow(ctx, `DELETE FROM stream_tickets WHERE hash = $1 RETURNING user_id, expires_at`, sum[:]).Scan(&user, &expires)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		t.metrics.tickets.WithLabelValues("refused").Inc()
		return "", ErrTicket
	case err != nil:
		return "", fmt.Errorf("redeem a stream ticket: %w", err)
	case !t.clock.Now().Before(expires):
		t.metrics.tickets.WithLabelValues("refused").Inc()
		return "", ErrTicket
	}
	t.metrics.tickets.WithLabelValues("redeemed").Inc()
	return user, nil
}
