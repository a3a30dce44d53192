package devices

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/channel/webpush"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Providers the store registers devices of itself; the others are the
// channels' (Channels), each named by its Provider().
const (
	ProviderExpo    = expo.Provider
	ProviderWebPush = "webpush"
)

// Platforms a device may register.
const (
	IOS     = "ios"
	Android = "android"
	Web     = "web" // a browser's Web Push subscription
)

// Reasons a token is disabled, the values of the metric's reason label.
const (
	DisabledByUser      = "user_request"          // DELETE /v1/devices/{token}
	DisabledUnreachable = "device_not_registered" // Expo: DeviceNotRegistered
	DisabledInvalid     = "invalid_token"         // a stored token that is not an Expo push token
	DisabledReplaced    = "replaced"              // the user registered one more than MaxEnabledPerUser
	DisabledGone        = "subscription_gone"     // Web Push: the push service answered 404 or 410
	// DisabledForeign: the token is valid but another app's: another Expo
	// project's (PUSH_TOO_MANY_EXPERIENCE_IDS, MismatchSenderId), another
	// APNs topic's (DeviceTokenNotForTopic), another Firebase sender's
	// (SENDER_ID_MISMATCH), another VAPID key's (a browser's 401 or 403).
	DisabledForeign = "another_app"
)

// DefaultMaxEnabledPerUser is Devices.MaxEnabledPerUser's default.
const DefaultMaxEnabledPerUser = 20

// ErrInvalidToken: not an Expo push token (ExponentPushToken[…] or ExpoPushToken[…]).
var ErrInvalidToken = errors.New("not an Expo push token: want ExponentPushToken[…] or ExpoPushToken[…]")

// ErrNoDevice: no such token among the caller's devices.
var ErrNoDevice = errors.New("no such device")

// webTokenShape is the token of a Web Push subscription (WebToken).
var webTokenShape = regexp.MustCompile(`^WebPush\[[A-Za-z0-9_-]{32}\]$`)

// IsWebToken reports whether token names a Web Push subscription.
func IsWebToken(token string) bool { return webTokenShape.MatchString(token) }

// WebToken is the token of the subscription to endpoint: WebPush[…] and 24
// bytes of its SHA-256, so that the same subscription registered again is
// the same device, and logs and answers never show the endpoint, which is
// itself the right to push to the browser.
func WebToken(endpoint string) string {
	sum := sha256.Sum256([]byte(endpoint))
	return "WebPush[" + base64.RawURLEncoding.EncodeToString(sum[:24]) + "]"
}

// ValidProvider reports whether name can name a provider: lowercase
// letters, digits and _, at most 32, as the devices table checks.
func ValidProvider(name string) bool { return providerShape.MatchString(name) }

var providerShape = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// Device is one push token of a user.
type Device struct {
	Token    string `json:"token"`
	Platform string `json:"platform"`
	// Provider reaches the device: expo, webpush, apns, fcm.
	Provider       string     `json:"provider"`
	Enabled        bool       `json:"enabled"`
	DisabledReason *string    `json:"disabled_reason"`
	DisabledAt     *time.Time `json:"disabled_at"`
	CreatedAt      time.Time  `json:"created_at"`
	LastSeenAt     time.Time  `json:"last_seen_at"`
}

// Store registers and lists users' push devices, and disables them.
type Store struct {
	// MaxEnabledPerUser is the most enabled devices a user keeps: a
	// registration past it disables the user's least recently seen ones
	// (DisabledReplaced). Default (0 or less) DefaultMaxEnabledPerUser, 20.
	// Set it before the first Register.
	MaxEnabledPerUser int

	// Channels are the providers behind the channel shape that devices
	// may register with (the dispatcher's channels); set before the first
	// RegisterWith.
	Channels []channel.Channel

	db      DB
	metrics *Metrics
}

// New returns the device store over db; metrics may be nil.
func New(db DB, metrics *Metrics) *Store {
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	return &Store{db: db, metrics: metrics}
}

// Register records token for user: a new token, a token seen again, a
// disabled token turned back on, or a token that moved to another user (a
// phone that changed hands follows its new owner). The user then keeps at
// most MaxEnabledPerUser enabled devices, token among them: the least
// recently seen others are disabled as DisabledReplaced, so that a user who
// reinstalls is never locked out by the tokens of the old installs.
func (d *Store) Register(ctx context.Context, userID, token, platform string) (Device, error) {
	if !expo.ValidToken(token) {
		return Device{}, ErrInvalidToken
	}
	if platform != IOS && platform != Android {
		return Device{}, fmt.Errorf("platform %q: want ios or android", platform)
	}
	return d.registerRetrying(ctx, userID, token, platform, ProviderExpo, nil)
}

// ErrProviderNotSetUp: no channel of that provider on this deployment.
var ErrProviderNotSetUp = errors.New("provider not set up on this deployment")

// RegisterWith records a device of a provider behind the channel shape
// (apns, fcm), as Register does an Expo token: the token must have the
// provider's shape and the platform be one it reaches.
func (d *Store) RegisterWith(ctx context.Context, userID, provider, token, platform string) (Device, error) {
	var reg channel.Registrar
	for _, ch := range d.Channels {
		if ch.Provider() == provider {
			reg, _ = ch.(channel.Registrar)
		}
	}
	switch {
	case reg == nil:
		return Device{}, fmt.Errorf("%w: %s", ErrProviderNotSetUp, provider)
	case !slices.Contains(reg.Platforms(), platform):
		return Device{}, fmt.Errorf("%w: provider %s reaches %s, not %q", ErrPlatform, provider, strings.Join(reg.Platforms(), " and "), platform)
	case !reg.ValidToken(token):
		return Device{}, fmt.Errorf("%w of %s", ErrProviderToken, provider)
	}
	return d.registerRetrying(ctx, userID, reg.Canonical(token), platform, provider, nil)
}

// ErrProviderToken: not the shape of the provider's device tokens.
var ErrProviderToken = errors.New("not a device token")

// ErrPlatform: the platform is not one the provider reaches.
var ErrPlatform = errors.New("wrong platform")

// RegisterWeb records a browser's Web Push subscription for user, as
// Register does a token: its device's token is WebToken(endpoint). A
// subscription the browser renewed (a new endpoint) is a new device; the
// old one is disabled when its push service answers 404 or 410.
func (d *Store) RegisterWeb(ctx context.Context, userID string, sub webpush.Subscription) (Device, error) {
	return d.registerRetrying(ctx, userID, WebToken(sub.Endpoint), Web, ProviderWebPush, &sub)
}

func (d *Store) registerRetrying(ctx context.Context, userID, token, platform, provider string, sub *webpush.Subscription) (Device, error) {
	// A deadlock is possible, and Postgres breaks it by failing one side:
	// two users taking over each other's tokens at once, or a dispatcher
	// disabling a token this registration replaces. Both are rare; retry.
	for attempt := 1; ; attempt++ {
		dev, replaced, err := d.register(ctx, userID, token, platform, provider, sub)
		var pgErr *pgconn.PgError
		if attempt < 3 && errors.As(err, &pgErr) && pgErr.Code == deadlockDetected {
			continue
		}
		if err != nil {
			return Device{}, fmt.Errorf("register device: %w", err)
		}
		d.metrics.tokensDisabled.WithLabelValues(DisabledReplaced).Add(float64(replaced))
		return dev, nil
	}
}

// deadlockDetected is Postgres's deadlock_detected SQLSTATE.
const deadlockDetected = "40P01"

// devicesLockClass is the first key of the per-user advisory lock
// registrations take, with hashtext(user_id) the second. The two-key lock
// space does not overlap the one-key space lifecycle's lock is in; two users
// whose ids hash alike merely wait for each other.
const devicesLockClass = 0x64657673 // "devs"

// register is one attempt of Register, in one transaction; it returns how
// many devices it replaced.
func (d *Store) register(ctx context.Context, userID, token, platform, provider string, sub *webpush.Subscription) (dev Device, replaced int64, err error) {
	var endpoint, p256dh, auth *string
	if sub != nil {
		endpoint, p256dh, auth = &sub.Endpoint, &sub.P256dh, &sub.Auth
	}
	limit := d.MaxEnabledPerUser
	if limit <= 0 {
		limit = DefaultMaxEnabledPerUser
	}
	err = pgx.BeginFunc(ctx, d.db, func(tx pgx.Tx) error {
		// Every registration of the user waits here for the one before to
		// commit, so that the count below is not raced: two replicas, or an
		// app retrying, never leave the user past the limit. A row lock
		// would not do: a user with no device yet has no row to lock.
		// Nothing else turns a device on, so only registrations need it.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, devicesLockClass, userID); err != nil {
			return fmt.Errorf("lock the user's devices: %w", err)
		}
		rows, err := tx.Query(ctx, `INSERT INTO devices (token, user_id, platform, endpoint, p256dh, auth, provider) VALUES ($1, $2, $3, $4, $5, $6, $7)
			ON CONFLICT (token) DO UPDATE SET user_id = EXCLUDED.user_id, platform = EXCLUDED.platform, provider = EXCLUDED.provider,
				endpoint = EXCLUDED.endpoint, p256dh = EXCLUDED.p256dh, auth = EXCLUDED.auth,
				enabled = true, disabled_reason = NULL, disabled_at = NULL, last_seen_at = now()
			RETURNING `+deviceColumns, token, userID, platform, endpoint, p256dh, auth, provider)
		if err != nil {
			return err
		}
		if dev, err = pgx.CollectExactlyOneRow(rows, scanDevice); err != nil {
			return err
		}
		// Keep the limit-1 most recently seen other devices; disable the rest.
		// The outer conditions are checked again on a row changed meanwhile:
		// one another user took over, or Expo disabled, is left alone (the
		// user has one device fewer either way).
		tag, err := tx.Exec(ctx, `UPDATE devices SET enabled = false, disabled_reason = $4, disabled_at = now()
			WHERE user_id = $1 AND enabled AND token IN (
				SELECT token FROM devices WHERE user_id = $1 AND enabled AND token <> $2
				ORDER BY last_seen_at DESC, created_at DESC, token DESC
				OFFSET $3)`, userID, token, limit-1, DisabledReplaced)
		if err != nil {
			return fmt.Errorf("replace devices: %w", err)
		}
		replaced = tag.RowsAffected()
		// Disabled devices are kept for the record (the device list shows
		// why each stopped), as many as the limit, the latest disabled: a
		// client registering made-up tokens grows no table.
		if _, err := tx.Exec(ctx, `DELETE FROM devices WHERE user_id = $1 AND NOT enabled AND token IN (
				SELECT token FROM devices WHERE user_id = $1 AND NOT enabled
				ORDER BY disabled_at DESC NULLS LAST, token DESC
				OFFSET $2)`, userID, limit); err != nil {
			return fmt.Errorf("forget disabled devices: %w", err)
		}
		return nil
	})
	return dev, replaced, err
}

// Disable soft-disables the user's token with why; another user's token is ErrNoDevice.
func (d *Store) Disable(ctx context.Context, userID, token string) error {
	tag, err := d.db.Exec(ctx, `UPDATE devices SET enabled = false,
			disabled_reason = CASE WHEN enabled THEN $3 ELSE disabled_reason END,
			disabled_at = CASE WHEN enabled THEN now() ELSE disabled_at END
		WHERE token = ANY($1) AND user_id = $2`, d.spellings(token), userID, DisabledByUser)
	if err != nil {
		return fmt.Errorf("disable device: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNoDevice
	}
	d.metrics.tokensDisabled.WithLabelValues(DisabledByUser).Inc()
	return nil
}

// spellings are token and the canonical spellings of it that the
// providers set up here store devices under.
func (d *Store) spellings(token string) []string {
	out := []string{token}
	for _, ch := range d.Channels {
		if reg, ok := ch.(channel.Registrar); ok && reg.ValidToken(token) {
			if c := reg.Canonical(token); !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	return out
}

// List returns the user's devices, enabled or not, newest first.
func (d *Store) List(ctx context.Context, userID string) ([]Device, error) {
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

// DisableTokens turns tokens off with reason; it counts the ones it turned off.
func (d *Store) DisableTokens(ctx context.Context, tokens []string, reason string) error {
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

// DisableUnreachable turns off the tokens Expo says are not registered
// (DeviceNotRegistered), each as of the send the answer was about: a token
// seen since — registered again, or by another user — is newer than the
// answer and stays on. since[i] is the dispatch's created_at, compared in
// Postgres with last_seen_at, both Postgres's time; the latest send counts
// for a token named twice.
func (d *Store) DisableUnreachable(ctx context.Context, tokens []string, since []time.Time) error {
	return d.DisableAsOf(ctx, tokens, since, DisabledUnreachable)
}

// DisableAsOf is DisableUnreachable with the reason given.
func (d *Store) DisableAsOf(ctx context.Context, tokens []string, since []time.Time, reason string) error {
	if len(tokens) == 0 {
		return nil
	}
	tag, err := d.db.Exec(ctx, `UPDATE devices d SET enabled = false, disabled_reason = $3, disabled_at = now()
		FROM (SELECT token, max(since) AS since FROM unnest($1::text[], $2::timestamptz[]) AS u(token, since) GROUP BY token) u
		WHERE d.token = u.token AND d.enabled AND d.last_seen_at < u.since`, tokens, since, reason)
	if err != nil {
		return fmt.Errorf("disable tokens: %w", err)
	}
	d.metrics.tokensDisabled.WithLabelValues(reason).Add(float64(tag.RowsAffected()))
	return nil
}

// Enabled is what a dispatch pass needs of an enabled device beside its token.
type Enabled struct {
	Provider string
	// Address is how to reach it when the token does not say: a Web Push
	// subscription, as JSON (channel.Message.Address); "" for the others.
	Address string
}

// AddressColumn is a devices row's address (channel.Message.Address): a
// browser's subscription as JSON, as the browser gave it; empty for the
// others, and for no row (a LEFT JOIN's).
const AddressColumn = `CASE WHEN endpoint IS NOT NULL THEN json_build_object('endpoint', endpoint, 'keys', json_build_object('p256dh', p256dh, 'auth', auth))::text ELSE '' END`

// EnabledTokens returns the enabled tokens of users, by user, and each
// token's provider and address.
func (d *Store) EnabledTokens(ctx context.Context, users []string) (map[string][]string, map[string]Enabled, error) {
	rows, err := d.db.Query(ctx, `SELECT user_id, token, provider, `+AddressColumn+`
		FROM devices WHERE user_id = ANY($1) AND enabled ORDER BY user_id, created_at, token`, users)
	if err != nil {
		return nil, nil, fmt.Errorf("read devices: %w", err)
	}
	defer rows.Close()
	out, devices := map[string][]string{}, map[string]Enabled{}
	for rows.Next() {
		var user, token string
		var dev Enabled
		if err := rows.Scan(&user, &token, &dev.Provider, &dev.Address); err != nil {
			return nil, nil, err
		}
		out[user] = append(out[user], token)
		devices[token] = dev
	}
	return out, devices, rows.Err()
}

const deviceColumns = `token, platform, provider, enabled, disabled_reason, disabled_at, created_at, last_seen_at`

func scanDevice(row pgx.CollectableRow) (Device, error) {
	var d Device
	err := row.Scan(&d.Token, &d.Platform, &d.Provider, &d.Enabled, &d.DisabledReason, &d.DisabledAt, &d.CreatedAt, &d.LastSeenAt)
	return d, err
}
