package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/channel/expo/expotest"
	"github.com/spoolcast/spoolcast/channel/webpush"
	"github.com/spoolcast/spoolcast/internal/devauth"
	"github.com/spoolcast/spoolcast/internal/filelock"
	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/migrations"
	"github.com/spoolcast/spoolcast/push"
	"github.com/spoolcast/spoolcast/topics"
)

// The dev stack's own OIDC issuer and audience. Its tokens mean nothing elsewhere.
const (
	devIssuer   = "spoolcast-dev"
	devAudience = "spoolcast"
	devJWKSPath = "/dev/jwks.json"
)

// devCommand is `spoolcast dev`: the whole pipeline in one process for local
// work. It starts a local Postgres (kept under --data-dir/pg) unless
// --database-url is given, migrates it, and runs the relay with its forwarder
// and central, whose user tokens come from a local signing key.
// `spoolcast dev token` mints tokens the running stack accepts.
func devCommand() (*flag.FlagSet, runFunc) {
	var o relayOptions
	var co centralOptions
	var dataDir, tokenUser, tokenService string
	var tokenAdmin bool
	var tokenTTL time.Duration
	fs := newFlagSet("dev", "spoolcast dev [flags]  |  spoolcast dev token --user NAME [--admin]  |  spoolcast dev token --service NAME")
	o.register(fs)
	fs.StringVar(&dataDir, "data-dir", "./data", "where the local Postgres cluster (pg/), the spool and the dev signing keys live")
	fs.StringVar(&co.listen, "central-listen", "127.0.0.1:8080", "address central serves its API on")
	fs.StringVar(&co.opsListen, "central-ops-listen", "127.0.0.1:8081", "address central serves /healthz, /readyz, /metrics and /internal/… on, as a deployment does (empty: on --central-listen)")
	fs.StringVar(&co.minAppVersion, "min-app-version", "", "oldest Spoolcast-App-Version central serves")
	fs.StringVar(&co.push.expoURL, "expo-url", "", "Expo push API base to push through; unset, a fake Expo runs in the dev stack and logs each push it gets")
	fs.StringVar(&tokenUser, "user", "", "token: mint a user token for this user id")
	fs.BoolVar(&tokenAdmin, "admin", false, "token: give the user token the admin role")
	fs.StringVar(&tokenService, "service", "", "token: mint a service token (scope push:emit) for this service")
	fs.DurationVar(&tokenTTL, "token-ttl", 12*time.Hour, "token: how long the token is valid")
	overrideDefault(fs, "producer", "demo", "logical producing service that scopes idempotency keys")
	overrideDefault(fs, "spool", "", "path of the SQLite spool file (default --data-dir/spool.db)")
	if f := fs.Lookup("database-url"); f != nil {
		f.Usage = "Postgres URL to use instead of starting a local cluster under --data-dir/pg (DATABASE_URL is read too)"
	}
	return fs, func(ctx context.Context, args []string) error {
		keyPath := filepath.Join(dataDir, "dev-signing-key.pem")
		secretPath := filepath.Join(dataDir, "dev-service-secret")
		switch {
		case len(args) == 1 && args[0] == "token":
			return printDevToken(keyPath, secretPath, tokenUser, tokenService, tokenAdmin, tokenTTL)
		case len(args) > 0:
			return fmt.Errorf("unknown dev subcommand %q: want `spoolcast dev` or `spoolcast dev token`", strings.Join(args, " "))
		}
		logger, err := o.log.logger(os.Stderr)
		if err != nil {
			return err
		}
		return runDev(ctx, o, co, dataDir, keyPath, secretPath, logger)
	}
}

func overrideDefault(fs *flag.FlagSet, name, value, usage string) {
	if f := fs.Lookup(name); f != nil {
		f.DefValue = value
		_ = f.Value.Set(value)
		f.Usage = usage
	}
}

func runDev(ctx context.Context, o relayOptions, co centralOptions, dataDir, keyPath, secretPath string, logger *slog.Logger) error {
	// One dev stack per data directory: a second one would share its spool
	// and Postgres. Refuse before touching either.
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return err
	}
	defer lock.Close()
	if o.spoolPath == "" {
		o.spoolPath = filepath.Join(dataDir, "spool.db")
	}
	if o.databaseURL == "" {
		o.databaseURL = os.Getenv("DATABASE_URL") // the usual variable, as the tests read it
	}
	if o.databaseURL == "" {
		logger.Info("starting local Postgres", "dir", filepath.Join(dataDir, "pg"))
		cluster, err := pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(dataDir, "pg"), Durable: true})
		if err != nil {
			return fmt.Errorf("start local Postgres: %w", err)
		}
		if cluster.Started {
			defer func() {
				logger.Info("stopping local Postgres")
				if err := cluster.Stop(); err != nil {
					logger.Error("stop local Postgres", "err", err)
				}
			}()
		} else {
			logger.Warn("local Postgres was already running (left by an earlier run); using it, and leaving it running", "dir", filepath.Join(dataDir, "pg"))
		}
		o.databaseURL = cluster.URL
	}
	if _, err := migrations.Up(ctx, o.databaseURL, logger); err != nil {
		return err
	}
	issuer, err := devauth.LoadIssuer(keyPath, devIssuer, devAudience)
	if err != nil {
		return err
	}
	if err := ensureDevSecret(secretPath); err != nil {
		return err
	}
	co.databaseURL = o.databaseURL
	co.oidcIssuer, co.oidcAudience = devIssuer, devAudience
	co.jwksURL = "http://" + co.listen + devJWKSPath
	co.userClaim, co.rolesClaim, co.adminRole = "sub", "roles", "admin"
	co.jwtSecretFile = secretPath
	co.dbMaxConns = 4
	co.maintenanceInterval = time.Hour // keeps everything (no retention), creates partitions ahead
	co.inbox = true
	co.webhooks = webhookFlags{enabled: true, allowPrivate: true} // the rest: defaults
	co.topics = topicFlags{workers: 1, batchSize: topics.DefaultBatchSize, pushRate: topics.DefaultPushRate}
	vapidPath := filepath.Join(dataDir, "vapid.pem")
	if err := ensureVAPIDKey(vapidPath); err != nil {
		return err
	}
	co.push = pushFlags{enabled: true, expoURL: co.push.expoURL, expoRate: expo.DefaultRatePerSecond, expoConcurrency: 6,
		maxAge: time.Hour, receiptInterval: 5 * time.Second,
		vapidKeyFile: vapidPath, vapidSubject: "mailto:dev@spoolcast.invalid", webAllowPrivate: true}
	if co.push.expoURL == "" {
		fakeURL, stopFake, err := startFakeExpo(logger)
		if err != nil {
			return err
		}
		defer stopFake()
		co.push.expoURL = fakeURL
	}
	var stopChannels func()
	if co.channels, stopChannels, err = startFakeChannels(dataDir, logger); err != nil {
		return err
	}
	defer stopChannels()
	c, err := startCentral(ctx, co, logger, map[string]http.Handler{devJWKSPath: issuer.JWKS()})
	if err != nil {
		return err
	}
	r, err := startRelay(ctx, o, logger)
	if err != nil {
		return errors.Join(err, c.shutdown(5*time.Second))
	}
	token, err := issuer.Mint("u_123", nil, 12*time.Hour)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, `
spoolcast dev is running — Ctrl-C stops all of it.
  relay     http://%[1]s   (producer %[2]q, spool %[3]s)
  central   http://%[4]s   (API description at /openapi.yaml)
  postgres  %[5]s
  metrics   http://%[1]s/metrics and http://%[8]s/metrics (central's probes and /internal/… are there too)

Post an event for u_123:
  %[6]s

Read u_123's feed (mint other tokens with: spoolcast dev token --user NAME [--admin]):
  curl -s http://%[4]s/v1/notifications -H 'Authorization: Bearer %[7]s'

Watch u_123's inbox in a browser (the token rides in the link's fragment, never sent to a server):
  http://%[4]s/inbox#token=%[7]s

`, r.addr, o.producer, o.spoolPath, c.addr, o.databaseURL, devSampleCurl(r.addr), token, cmp.Or(c.opsAddr, c.addr))
	timeout := max(o.shutdownTimeout, 5*time.Second)
	err = r.wait(ctx, timeout)
	return errors.Join(err, c.shutdown(timeout))
}

// devSampleCurl is the README tour's first command, byte for byte but the
// line break, so that a newcomer who runs both posts one event twice (a
// duplicate), not two bodies under one key (a 422). make check-tour holds
// them equal.
func devSampleCurl(addr string) string { return sampleCurl(addr) }

// startFakeExpo serves a fake Expo on loopback that logs each push it gets,
// so the dev stack shows the whole path without a real device.
func startFakeExpo(logger *slog.Logger) (url string, stop func(), err error) {
	fake := expotest.New()
	log := logger.With("component", "fake-expo")
	fake.OnPush = func(m expo.Message) {
		log.Info("push delivered to the fake Expo", "to", push.MaskToken(m.To), "title", m.Title, "body", m.Body)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("fake Expo: %w", err)
	}
	srv := &http.Server{Handler: fake, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/--/api/v2/push", func() { _ = srv.Close() }, nil
}

// lockDataDir takes the data directory for this process, or says who holds it.
func lockDataDir(dataDir string) (*os.File, error) {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, err
	}
	f, err := filelock.Acquire(filepath.Join(dataDir, "dev.lock"))
	var held *filelock.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("%s is in use by another spoolcast dev (pid %s); stop it first, or pass another --data-dir", dataDir, held.PID)
	}
	return f, err
}

// ensureDevSecret creates the dev stack's service-token secret if missing.
func ensureDevSecret(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(hex.EncodeToString(b)+"\n"), 0o600)
}

func printDevToken(keyPath, secretPath, user, service string, admin bool, ttl time.Duration) error {
	switch {
	case ttl <= 0:
		// A token that expired as it was minted is refused by the stack with
		// a 401 that does not say why.
		return fmt.Errorf("dev token: --token-ttl %s: must be positive, such as 12h", ttl)
	case user != "" && service != "":
		return errors.New("dev token: give --user or --service, not both")
	case service != "":
		if err := ensureDevSecret(secretPath); err != nil {
			return err
		}
		secret, err := auth.ReadSecretFile(secretPath)
		if err != nil {
			return err
		}
		tok, err := auth.SignServiceToken(secret, service, []string{auth.ScopeEmit}, time.Now(), ttl)
		if err != nil {
			return err
		}
		fmt.Println(tok)
		return nil
	case user == "":
		return errors.New("dev token: --user NAME (or --service NAME) is required")
	}
	issuer, err := devauth.LoadIssuer(keyPath, devIssuer, devAudience)
	if err != nil {
		return err
	}
	var roles []string
	if admin {
		roles = []string{"admin"}
	}
	tok, err := issuer.Mint(user, roles, ttl)
	if err != nil {
		return err
	}
	fmt.Println(tok)
	return nil
}

// ensureVAPIDKey writes a Web Push (VAPID) key at path unless one is there,
// so that browsers subscribed to the dev stack stay subscribed across runs.
func ensureVAPIDKey(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	pem, err := webpush.GenerateVAPIDKeyPEM()
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem, 0o600)
}
