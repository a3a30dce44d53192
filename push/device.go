package push

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
)

// Platforms a device may register.
const (
	IOS     = "ios"
	Android = "android"
)

// Reasons a token is disabled, the values of the metric's reason label.
const (
	DisabledByUser      = "user_request"          // DELETE /v1/devices/{token}
	DisabledUnreachable = "device_not_registered" // Expo: DeviceNotRegistered
	DisabledInvalid     = "invalid_token"         // a stored token that is not an Expo push token
)

// ErrInvalidToken: not an Expo push token (ExponentPushToken[…] or ExpoPushToken[…]).
var ErrInvalidToken = errors.New("not an Expo push token: want ExponentPushToken[…] or ExpoPushToken[…]")

// ErrNoDevice: no such token among the caller's devices.
var ErrNoDevice = errors.New("no such device")

var tokenShape = regexp.MustCompile(`^(?:ExponentPushToken|ExpoPushToken)\[[A-Za-z0-9_-]{1,256}\]$`)

// ValidToken reports whether token has the shape of an Expo push token.
func ValidToken(token string) bool { return tokenShape.MatchString(token) }

// Device is one push token of a user.
type Device struct {
	Token          string     `json:"token"`
	Platform       string     `json:"platform"`
	Enabled        bool       `json:"enabled"`
	DisabledReason *string    `json:"disabled_reason"`
	DisabledAt     *time.Time `json:"disabled_at"`
	CreatedAt      time.Time  `json:"created_at"`
	LastSeenAt     time.Time  `json:"last_seen_at"`
}

// Devices registers and lists users' push tokens.
type Devices struct {
	db      DB
	metrics *Metrics
}

// NewDevices returns the device store over db; metrics may be nil.
func NewDevices(db DB, metrics *Metrics) *Devices {
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	return &Devices{db: db, metrics: metrics}
}

// Register records token for user: a new token, a token seen again, a
// disabled token turned back on, or a token that moved to another user (a
// phone that changed hands follows its new owner).
func (d *Devices) Register(ctx context.Context, userID, token, platform string) (Device, error) {
	if !ValidToken(token) {
		return Device{}, ErrInvalidToken
	}
	if platform != IOS && platform != Android {
		return Device{}, fmt.Errorf("platform %q: want ios or android", platform)
	}
	rows, err := d.db.Query(ctx, `INSERT INTO devices (token, user_id, platform) VALUES ($1, $2, $3)
		ON CONFLICT (token) DO UPDATE SET user_id = EXCLUDED.user_id, platform = EXCLUDED.platform,
			enabled = true, disabled_reason = NULL, disabled_at = NULL, last_seen_at = now()
		RETURNING `+deviceColumns, token, userID, platform)
	if err != nil {
		return Device{}, fmt.Errorf("register device: %w", err)
	}
	dev, err := pgx.CollectExactlyOneRow(rows, scanDevice)
	if err != nil {
		return Device{}, fmt.Errorf("register device: %w", err)
	}
	return dev, nil
}

// Disable soft-disables the user's token with why; another user's token is ErrNoDevice.
func (d *Devices) Disable(ctx context.Context, userID, token string) error {
	tag, err := d.db.Exec(ctx, `UPDATE devices SET enabled = false,
			disabled_reason = CASE WHEN enabled THEN $3 ELSE disabled_reason END,
			disabled_at = CASE WHEN enabled THEN now() ELSE disabled_at END
		WHERE token = $1 AND user_id = $2`, token, userID, DisabledByUser)
	if err != nil {
		return fmt.Errorf("disable device: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNoDevice
	}
	d.metrics.tokensDisabled.WithLabelValues(DisabledByUser).Inc()
	return nil
}

// List returns the user's devices, enabled or not, newest first.
func (d *Devices) List(ctx context.Context, userID string) ([]Device, error) {
	rows, err := d.db.Query(ctx, `SELECT `+deviceColumns+` FROM devices WHERE user_id = $1 ORDER BY created_at DESC, token`, userID)
	if err != nil {
		return nil, fmt.Errorf("list devices: %w", err)
	}
	devs, err := pgx.CollectRows(rows, scanDevice)
	if err != nil {
		return nil, fmt.Errorf("list devices: %w", err)
	}
	return devs, nil
}

// disableTokens turns tokens off with reason; it counts the ones it turned off.
func (d *Devices) disableTokens(ctx context.Context, tokens []string, reason string) error {
	if len(tokens) == 0 {
		return nil
	}
	tag, err := d.db.Exec(ctx, `UPDATE devices SET enabled = false, disabled_reason = $2, disabled_at = now()
		WHERE token = ANY($1) AND enabled`, tokens, reason)
	if err != nil {
		return fmt.Errorf("disable tokens: %w", err)
	}
	d.metrics.tokensDisabled.WithLabelValues(reason).Add(float64(tag.RowsAffected()))
	return nil
}

// disableUnreachable turns off the tokens Expo says are not registered
// (DeviceNotRegistered), each as of the send the answer was about: a token
// seen since — registered again, or by another user — is newer than the
// answer and stays on. since[i] is the dispatch's created_at, compared in
// Postgres with last_seen_at, both Postgres's time; the latest send counts
// for a token named twice.
func (d *Devices) disableUnreachable(ctx context.Context, tokens []string, since []time.Time) error {
	if len(tokens) == 0 {
		return nil
	}
	tag, err := d.db.Exec(ctx, `UPDATE devices d SET enabled = false, disabled_reason = $3, disabled_at = now()
		FROM (SELECT token, max(since) AS since FROM unnest($1::text[], $2::timestamptz[]) AS u(token, since) GROUP BY token) u
		WHERE d.token = u.token AND d.enabled AND d.last_seen_at < u.since`, tokens, since, DisabledUnreachable)
	if err != nil {
		return fmt.Errorf("disable tokens: %w", err)
	}
	d.metrics.tokensDisabled.WithLabelValues(DisabledUnreachable).Add(float64(tag.RowsAffected()))
	return nil
}

// enabledTokens returns the enabled tokens of users, by user.
func (d *Devices) enabledTokens(ctx context.Context, users []string) (map[string][]string, error) {
	rows, err := d.db.Query(ctx, `SELECT user_id, token FROM devices WHERE user_id = ANY($1) AND enabled ORDER BY user_id, created_at, token`, users)
	if err != nil {
		return nil, fmt.Errorf("read devices: %w", err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var user, token string
		if err := rows.Scan(&user, &token); err != nil {
			return nil, err
		}
		out[user] = append(out[user], token)
	}
	return out, rows.Err()
}

const deviceColumns = `token, platform, enabled, disabled_reason, disabled_at, created_at, last_seen_at`

func scanDevice(row pgx.CollectableRow) (Device, error) {
	var d Device
	err := row.Scan(&d.Token, &d.Platform, &d.Enabled, &d.DisabledReason, &d.DisabledAt, &d.CreatedAt, &d.LastSeenAt)
	return d, err
}
