package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/channel/webpush"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/internal/egress"
	"github.com/spoolcast/spoolcast/preferences"
	"github.com/spoolcast/spoolcast/push"
	"github.com/spoolcast/spoolcast/push/policy"
)

// expoProject is an Expo project's full name: @owner/slug.
var expoProject = regexp.MustCompile(`^@[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$`)

// pushFlags are central's push settings.
type pushFlags struct {
	enabled         bool
	expoURL         string
	expoTokenFile   string
	expoExperience  string
	expoRate        int
	expoConcurrency int
	maxAge          time.Duration
	prefsURL        string
	prefsCacheTTL   time.Duration
	prefsTimeout    time.Duration
	receiptInterval time.Duration
	interrupted     time.Duration // 0 is push's default, 10m
	maxDevices      int           // enabled push devices per user; 0 is devices.DefaultMaxEnabledPerUser
	throttle        policy.Throttle
	suppressIfSeen  time.Duration
	vapidKeyFile    string
	vapidSubject    string
	webAllowPrivate bool
	webConcurrency  int           // 0 is push.DefaultWebConcurrency
	webTTL          time.Duration // 0 is push.DefaultWebTTL
	clearOnRead     bool
}

func (p *pushFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&p.enabled, "push", true, "run the push dispatcher and receipt reconciler in this replica (replicas share the work)")
	fs.StringVar(&p.expoURL, "expo-url", expo.DefaultURL, "base of Expo's push API; /send and /getReceipts are appended")
	fs.StringVar(&p.expoTokenFile, "expo-access-token-file", "", "file holding an Expo access token, for projects with enhanced push security")
	fs.StringVar(&p.expoExperience, "expo-experience", "", "this app's Expo project, @owner/slug (the app config's owner and slug): when a send mixes tokens of several projects, Expo refuses it whole (PUSH_TOO_MANY_EXPERIENCE_IDS); the messages to this project's tokens are sent again and the others' tokens disabled (another_project). Unset, the project of most of the send's tokens is taken for this app's")
	fs.IntVar(&p.expoRate, "expo-rate", expo.DefaultRatePerSecond, "most push messages sent per second by this replica (Expo allows 600/s per project; 0 is no cap)")
	fs.IntVar(&p.expoConcurrency, "expo-concurrency", 6, "most Expo requests in flight from this replica")
	fs.DurationVar(&p.maxAge, "push-max-age", time.Hour, "oldest notification still pushed; older ones (after a long stop of every dispatcher) are recorded skipped")
	fs.StringVar(&p.prefsURL, "prefs-url", "", "the product API's preference endpoint: GET <url>/<user id> with a prefs:read service token (see docs/api.md); unset, preferences are built in (/v1/preferences)")
	fs.DurationVar(&p.prefsCacheTTL, "prefs-cache-ttl", time.Minute, "how long an answer of --prefs-url is kept per user (failures never are)")
	fs.DurationVar(&p.prefsTimeout, "prefs-timeout", 300*time.Millisecond, "longest wait for --prefs-url; past it the notification is pushed anyway (fail open)")
	fs.DurationVar(&p.receiptInterval, "receipt-interval", 30*time.Second, "how often push receipts are fetched")
	fs.DurationVar(&p.interrupted, "push-interrupted-after", 10*time.Minute, "how long a dispatch written but never answered (its replica killed mid-send) stays queued before it ends failed (interrupted); never resent, as Expo may have taken it. At least 3m: a live replica records a send's outcome within its 2-minute lease")
	fs.Func("push-throttle", "most pushes per user and category in a fixed window, as N/DURATION (such as 5/1h); pushes past it are not sent and show in the delivery log as throttled. Critical notifications pass it. Default off", func(v string) error {
		t, err := policy.ParseThrottle(v)
		p.throttle = t
		return err
	})
	fs.DurationVar(&p.suppressIfSeen, "push-suppress-if-seen", 0, "hold the push of a user with an open stream this long; if the notification is read, or the app sends {\"type\":\"seen\",\"cursor\":…} for it, meanwhile, the push is not sent (suppressed). Every replica records its stream users in Postgres while set. Critical notifications are not held. 0: off")
	fs.StringVar(&p.vapidKeyFile, "vapid-key-file", "", "PEM file of the EC P-256 private key Web Push messages are signed with (VAPID, RFC 8292), as `openssl ecparam -name prime256v1 -genkey -noout` writes it; every replica must have the same one, since browsers subscribe to its public key. Unset, browsers cannot subscribe (GET /v1/push/vapid-public-key answers 404)")
	fs.StringVar(&p.vapidSubject, "vapid-subject", "", "how push services reach you about your Web Push traffic, a mailto: or https: URL (required with --vapid-key-file)")
	fs.BoolVar(&p.webAllowPrivate, "webpush-allow-private", false, "let browsers' subscriptions name push endpoints on loopback, link-local and private addresses (tests, development; `spoolcast dev` sets it). Off, they are refused when registered and when dialled")
	fs.IntVar(&p.webConcurrency, "webpush-concurrency", push.DefaultWebConcurrency, "most Web Push requests in flight from this replica, twice as many started or waiting; one push service takes at most three quarters of each and one user at most an eighth, so that a push service that stalls, or a user's subscriptions on origins they control, leave the rest to the others")
	fs.DurationVar(&p.webTTL, "webpush-ttl", push.DefaultWebTTL, "how long a push service keeps a message for a browser that is offline (the TTL header)")
	fs.BoolVar(&p.clearOnRead, "push-clear-on-read", true, "when a notification is read or archived (one by one, or by read-all or archive-all), send each of the user's phones that got its push a silent message naming it ({\"type\":\"clear\",\"ids\":[…]}: Expo data-only with _contentAvailable, an APNs background push, an FCM data message), so that its banner comes down on every phone (browsers get none: a push that shows nothing costs the site; an open inbox page closes their banners); at most one a second per device, once per notification and device, for pushes of the last 3 days. On by default: a banner left on a phone for something read on the laptop is what users report. Off, nothing is sent and the clears are recorded skipped")
	fs.IntVar(&p.maxDevices, "max-devices-per-user", devices.DefaultMaxEnabledPerUser, "most enabled push devices a user keeps; registering one more disables the user's least recently seen (disabled_reason replaced)")
}

func (p *pushFlags) validate() error {
	switch {
	case p.expoRate < 0 || p.expoConcurrency < 1:
		return errors.New("--expo-rate must not be negative and --expo-concurrency must be at least 1")
	case p.expoExperience != "" && !expoProject.MatchString(p.expoExperience):
		return fmt.Errorf("--expo-experience %q: want @owner/slug, as Expo names a project", p.expoExperience)
	case p.suppressIfSeen < 0 || p.suppressIfSeen > time.Hour:
		return fmt.Errorf("--push-suppress-if-seen %s: from 0 (off) to 1h", p.suppressIfSeen)
	case p.maxAge < 0 || p.prefsCacheTTL < 0 || p.prefsTimeout < 0 || p.receiptInterval < 0:
		return errors.New("--push-max-age, --prefs-cache-ttl, --prefs-timeout and --receipt-interval must not be negative")
	case p.interrupted != 0 && p.interrupted < 3*time.Minute:
		// 0 is the default: spoolcast dev leaves it unset.
		return fmt.Errorf("--push-interrupted-after %s: must be at least 3m, past the dispatcher's 2-minute lease and a send", p.interrupted)
	case p.vapidKeyFile != "" && p.vapidSubject == "":
		return errors.New("--vapid-key-file needs --vapid-subject: a mailto: or https: URL push services can reach you at")
	case p.webConcurrency < 0 || p.webTTL < 0:
		return errors.New("--webpush-concurrency and --webpush-ttl must not be negative")
	case p.maxDevices < 0:
		// 0 is the default, not "no device": spoolcast dev leaves it unset.
		return fmt.Errorf("--max-devices-per-user %d: must be at least 1 (0 is the default, %d)", p.maxDevices, devices.DefaultMaxEnabledPerUser)
	}
	return nil
}

// webPush returns the Web Push sender and the public key browsers subscribe
// with; both empty without --vapid-key-file.
func (p *pushFlags) webPush() (*webpush.Sender, string, error) {
	if p.vapidKeyFile == "" {
		return nil, "", nil
	}
	key, err := webpush.LoadVAPIDKeyFile(p.vapidKeyFile)
	if err != nil {
		return nil, "", fmt.Errorf("--vapid-key-file: %w", err)
	}
	// Each request is bounded by the dispatcher (push.DefaultWebTimeout).
	client := egress.Client(push.DefaultWebTimeout, p.webAllowPrivate, cmp.Or(p.webConcurrency, push.DefaultWebConcurrency))
	sender, err := webpush.NewSender(key, p.vapidSubject, client)
	if err != nil {
		return nil, "", fmt.Errorf("--vapid-subject: %w", err)
	}
	return sender, key.PublicKey(), nil
}

// pushWorkers are the push parts of a running central.
type pushWorkers struct {
	dispatcher *push.Dispatcher
	receipts   *push.ReceiptReconciler
}

// startPush starts the dispatcher, woken by wake after ingest commits, and
// the receipt reconciler.
func startPush(ctx context.Context, o centralOptions, pool *pgxpool.Pool, wake <-chan struct{}, metrics *push.Metrics, prefs preferences.Source, deviceStore *devices.Store, web *webpush.Sender, channels []channel.Channel, logger *slog.Logger) (*pushWorkers, error) {
	p := o.push
	var accessToken string
	if p.expoTokenFile != "" {
		b, err := os.ReadFile(p.expoTokenFile)
		if err != nil {
			return nil, fmt.Errorf("--expo-access-token-file: %w", err)
		}
		accessToken = strings.TrimSpace(string(b))
	}
	rate := p.expoRate
	if rate == 0 {
		rate = -1 // no cap
	}
	client, err := expo.New(expo.Config{
		URL: p.expoURL, AccessToken: accessToken, RatePerSecond: rate, MaxConcurrent: p.expoConcurrency,
		OnRequest: func(endpoint string, took time.Duration, _ error) { metrics.ObserveRequest(endpoint, took.Seconds()) },
	})
	if err != nil {
		return nil, err
	}
	w := &pushWorkers{}
	if w.dispatcher, err = push.NewDispatcher(push.DispatcherConfig{
		DB: pool, Sender: client, ExpoExperience: p.expoExperience, Preferences: prefs, Devices: deviceStore, Wake: wake,
		MaxAge: p.maxAge, Throttle: p.throttle, SuppressIfSeen: p.suppressIfSeen, Metrics: metrics, Logger: logger,
		WebPush: web, WebConcurrency: p.webConcurrency, WebTTL: p.webTTL, ClearOnRead: p.clearOnRead, Channels: channels,
	}); err != nil {
		return nil, err
	}
	if w.receipts, err = push.NewReceiptReconciler(push.ReceiptReconcilerConfig{
		DB: pool, Receipter: client, Devices: deviceStore, Interval: p.receiptInterval, MaxAge: p.maxAge, Interrupted: p.interrupted, Metrics: metrics, Logger: logger,
	}); err != nil {
		return nil, err
	}
	bg := context.WithoutCancel(ctx)
	w.dispatcher.Start(bg)
	w.receipts.Start(bg)
	return w, nil
}

// stop stops the dispatcher gracefully (see push.Dispatcher.Stop) and the
// receipt reconciler, together.
func (w *pushWorkers) stop(ctx context.Context) error {
	receipts := make(chan error, 1)
	go func() { receipts <- w.receipts.Stop(ctx) }()
	return errors.Join(w.dispatcher.Stop(ctx), <-receipts)
}

// externalPreferences is the --prefs-url source, asking with central's own
// prefs:read service token, minted from the service secret and renewed
// before it expires.
func externalPreferences(o centralOptions, metrics *preferences.Metrics, logger *slog.Logger) (*preferences.External, error) {
	if o.jwtSecretFile == "" {
		return nil, errors.New("--prefs-url needs --service-jwt-secret-file: central signs its prefs:read token with it")
	}
	secret, err := auth.ReadSecretFile(o.jwtSecretFile)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var token string
	var expires time.Time
	source := func() (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if time.Until(expires) > time.Minute {
			return token, nil
		}
		t, err := auth.SignServiceToken(secret, "spoolcast-central", []string{auth.ScopePrefsRead}, time.Now(), 10*time.Minute)
		if err != nil {
			return "", err
		}
		token, expires = t, time.Now().Add(10*time.Minute)
		return token, nil
	}
	return preferences.NewExternal(preferences.ExternalConfig{
		URL: o.push.prefsURL, Token: source, CacheTTL: o.push.prefsCacheTTL, Timeout: o.push.prefsTimeout,
		Metrics: metrics, Logger: logger,
	})
}
