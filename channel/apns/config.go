package apns

import (
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
)

// Config configures a Channel. Flags map onto it in cmd/.
type Config struct {
	// KeyFile is the team's .p8 signing key (--apns-key-file), as
	// downloaded from the Apple developer account. Required unless Key is set.
	KeyFile string
	// Key is the signing key itself; when set, KeyFile is not read.
	Key *ecdsa.PrivateKey
	// KeyID is the key's 10-character Key ID (--apns-key-id), the JWT's kid.
	KeyID string
	// TeamID is the 10-character Team ID (--apns-team-id), the JWT's iss.
	TeamID string
	// Topic is the app's bundle id (--apns-topic), sent as apns-topic.
	Topic string
	// Sandbox sends to api.sandbox.push.apple.com, where the tokens of
	// development builds are valid. Default false: api.push.apple.com.
	Sandbox bool
	// Host, when set, replaces the host chosen by Sandbox: a base URL
	// (https://host:port) for a proxy or a fake APNs.
	Host string
	// RootCAs, when set, are the only roots trusted for Host's TLS (a
	// fake's self-signed certificate). Default nil: the system's, through
	// apns2's own transport.
	RootCAs *x509.CertPool
	// Concurrency is the most requests in flight, HTTP/2 streams on the one
	// connection, shared by every Send. Default 100.
	Concurrency int
	// Timeout bounds one request, from taking a connection to reading the
	// answer. Default 10s.
	Timeout time.Duration
	// DefaultExpiration is how long APNs keeps a message for an offline
	// device when Message.Expires is zero. Default 24h.
	DefaultExpiration time.Duration
	// Clock dates the default expiration and the provider tokens signed.
	// Default nil: the wall clock. (Without Tokens, apns2 renews the JWT
	// on the wall clock whatever this is.)
	Clock clock.Clock
	// Tokens, when set, keeps one provider token for the deployment,
	// shared by every replica (Apple refuses a key's token renewed more
	// often than every 20 minutes). Default nil: this Channel signs its
	// own, as one replica alone may.
	Tokens TokenStore
	// Logger reports a Tokens store out of reach. Default slog.Default().
	Logger *slog.Logger
}

// Defaults, as Config's comments state them.
const (
	defaultConcurrency = 100
	defaultTimeout     = 10 * time.Second
	defaultExpiration  = 24 * time.Hour
)

// Validate reports a setting a user must fix, naming its flag. It does not
// read KeyFile: New does.
func (c Config) Validate() error {
	var errs []error
	if c.Key == nil && c.KeyFile == "" {
		errs = append(errs, errors.New("--apns-key-file is required: the team's .p8 key from the Apple developer account"))
	}
	if !appleID(c.KeyID) {
		errs = append(errs, fmt.Errorf("--apns-key-id %q: want the 10-character Key ID shown beside the .p8 key", c.KeyID))
	}
	if !appleID(c.TeamID) {
		errs = append(errs, fmt.Errorf("--apns-team-id %q: want the 10-character Team ID of the Apple developer account", c.TeamID))
	}
	if c.Topic == "" {
		errs = append(errs, errors.New("--apns-topic is required: the app's bundle id (com.example.app)"))
	}
	if c.Concurrency < 0 || c.Timeout < 0 || c.DefaultExpiration < 0 {
		errs = append(errs, errors.New("Concurrency, Timeout and DefaultExpiration must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("apns: %w", err)
	}
	return nil
}

// appleID reports whether s looks like a Key ID or Team ID: ten letters
// or digits (a stray space from a copy is the usual mistake).
func appleID(s string) bool {
	if len(s) != 10 {
		return false
	}
	for _, r := range s {
		if (r < 'A' || r > 'Z') && (r < 'a' || r > 'z') && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}
