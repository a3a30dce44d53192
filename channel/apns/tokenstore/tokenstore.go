// Package tokenstore keeps the deployment's APNs provider token in
// Postgres (table apns_provider_tokens), so that every central replica
// sends one token per signing key and one replica at a time renews it:
// Apple refuses a key's token renewed more often than every 20 minutes.
// It implements apns.TokenStore; it never imports the dispatcher.
package tokenstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/channel/apns"
)

// DB is what the store needs of Postgres (a *pgxpool.Pool).
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Postgres is the store.
type Postgres struct{ db DB }

var _ apns.TokenStore = (*Postgres)(nil)

// New returns the store over db, migrated to 25 or later.
func New(db DB) *Postgres { return &Postgres{db: db} }

const read = `SELECT bearer, issued_at FROM apns_provider_tokens WHERE key_id = $1 AND team_id = $2`

// Token answers the stored token, or signs and stores one when there is
// none, it is stale or refused. Renewal takes a transaction-scoped
// advisory lock on the key first and judges the row again in a fresh
// statement after it: the replicas that found the token stale together
// wait on the one renewing, then read its token.
func (p *Postgres) Token(ctx context.Context, keyID, teamID string, staleBefore time.Time, refused string,
	sign func() (string, time.Time, error)) (string, time.Time, error) {
	usable := func(bearer string, at time.Time) bool { return at.After(staleBefore) && bearer != refused }
	var bearer string
	var at time.Time
	err := p.db.QueryRow(ctx, read, keyID, teamID).Scan(&bearer, &at)
	switch {
	case err == nil && usable(bearer, at):
		return bearer, at, nil
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return "", time.Time{}, fmt.Errorf("read the APNs provider token: %w", err)
	}
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("renew the APNs provider token: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('spoolcast.apns_provider_token:' || $1 || ':' || $2, 0))`, keyID, teamID); err != nil {
		return "", time.Time{}, fmt.Errorf("lock the APNs provider token: %w", err)
	}
	err = tx.QueryRow(ctx, read, keyID, teamID).Scan(&bearer, &at)
	switch {
	case err == nil && usable(bearer, at):
		return bearer, at, tx.Commit(ctx) // renewed by another replica meanwhile
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return "", time.Time{}, fmt.Errorf("read the APNs provider token: %w", err)
	}
	if bearer, at, err = sign(); err != nil {
		return "", time.Time{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO apns_provider_tokens (key_id, team_id, bearer, issued_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (key_id, team_id) DO UPDATE SET bearer = excluded.bearer, issued_at = excluded.issued_at`, keyID, teamID, bearer, at); err != nil {
		return "", time.Time{}, fmt.Errorf("store the APNs provider token: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return "", time.Time{}, fmt.Errorf("store the APNs provider token: %w", err)
	}
	return bearer, at, nil
}
