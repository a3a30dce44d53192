package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/relay"
	"github.com/spoolcast/spoolcast/spool"
	"github.com/spoolcast/spoolcast/sync/forward"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// relayOptions are the relay's flags.
type relayOptions struct {
	listen          string
	opsListen       string
	spoolPath       string
	producer        string
	maxBody         byteSize
	spoolMaxBytes   byteSize
	syncMode        string
	keyTTL          time.Duration
	deadTTL         time.Duration
	refeedWindow    time.Duration
	refeedMaxBytes  byteSize
	jwtSecretFile   string
	shutdownTimeout time.Duration
	databaseURL     string
	batchSize       int
	batchMaxRows    int
	batchMaxBytes   byteSize
	maxBackoff      time.Duration
	dbMaxConns      int
	wakeUpInterval  time.Duration
	pprof           bool
	log             logFlags
}

func (o *relayOptions) register(fs *flag.FlagSet) {
	o.maxBody = 64 << 10
	o.spoolMaxBytes = 1 << 30
	o.batchMaxBytes = 4 << 20
	o.refeedMaxBytes = 64 << 20
	fs.StringVar(&o.listen, "listen", "127.0.0.1:7070", "address to serve producers on; a non-loopback address needs --service-jwt-secret-file")
	fs.StringVar(&o.opsListen, "ops-listen", "", "extra address serving only /healthz, /readyz and /metrics, for probes and scrapers when --listen is loopback (e.g. 0.0.0.0:7071)")
	fs.StringVar(&o.spoolPath, "spool", "./data/spool.db", "path of the SQLite spool file (created if missing)")
	fs.StringVar(&o.producer, "producer", "", "logical producing service that scopes idempotency keys, the same on every replica (required)")
	fs.Var(&o.maxBody, "max-body", "largest request body accepted (413 above it)")
	fs.Var(&o.spoolMaxBytes, "spool-max-bytes", "payload bytes of events awaiting Postgres the spool may hold; past it new events get 503 + Retry-After (forwarded keys and dead rows do not count)")
	fs.StringVar(&o.syncMode, "sync", "full", "SQLite synchronous mode: full (survives power loss) or normal (survives a crash of the relay)")
	fs.DurationVar(&o.keyTTL, "key-ttl", 24*time.Hour, "how long forwarded keys are kept to answer retries as duplicates")
	fs.DurationVar(&o.deadTTL, "dead-ttl", 7*24*time.Hour, "how long dead rows (refused by Postgres, or in conflict there) are kept for inspection and requeue")
	fs.DurationVar(&o.refeedWindow, "refeed-window", 10*time.Minute, "how long a forwarded event keeps its payload in the spool, to be forwarded again if Postgres fails over to a standby that had not received it (asynchronous replication); 0 keeps none")
	fs.Var(&o.refeedMaxBytes, "refeed-max-bytes", "most payload bytes kept for --refeed-window; past it the oldest go first. Count it in the spool volume's size, beside --spool-max-bytes")
	fs.StringVar(&o.jwtSecretFile, "service-jwt-secret-file", "", "file holding the HS256 secret of service tokens; when set, every event needs a bearer token with scope push:emit")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long a graceful shutdown waits for requests in flight and the final forward")
	fs.StringVar(&o.databaseURL, "database-url", "", "Postgres URL to forward the spool to; without it the relay only spools")
	fs.IntVar(&o.batchSize, "batch-size", 500, "most events forwarded in one Postgres transaction")
	fs.IntVar(&o.batchMaxRows, "batch-max-rows", 5000, "most notifications (recipients summed over events) in one Postgres transaction; an event with more goes alone")
	fs.Var(&o.batchMaxBytes, "batch-max-bytes", "most event bytes in one Postgres transaction; an event with more goes alone")
	fs.DurationVar(&o.maxBackoff, "max-backoff", 5*time.Second, "longest wait between forwarding retries while Postgres is unreachable")
	fs.IntVar(&o.dbMaxConns, "db-max-conns", 2, "Postgres connections the forwarder may open; each carries one batch in flight")
	fs.DurationVar(&o.wakeUpInterval, "wake-up-interval", ingest.DefaultWakeUpInterval, "least time between the wake-ups (NOTIFY) the forwarder sends after its commits: the longest central's live stream and push wait for a hint")
	fs.BoolVar(&o.pprof, "pprof", false, "serve Go's profiler at /debug/pprof/ on --ops-listen (never on the ingest address)")
	o.log.register(fs)
}

func relayCommand() (*flag.FlagSet, runFunc) {
	var o relayOptions
	fs := newFlagSet("relay", "spoolcast relay --producer NAME [flags]")
	o.register(fs)
	return fs, func(ctx context.Context, _ []string) error {
		logger, err := o.log.logger(os.Stderr)
		if err != nil {
			return err
		}
		tuneGC()
		r, err := startRelay(ctx, o, logger)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "\nrelay ready on http://%s — try:\n  %s\n\n", r.addr, sampleCurl(r.addr))
		return r.wait(ctx, o.shutdownTimeout)
	}
}

// runningRelay is a started relay: its spool, server and forwarder.
type runningRelay struct {
	addr      string
	opsAddr   string // "" without --ops-listen
	log       *slog.Logger
	spool     *spool.Spool
	handler   *relay.Server
	http      *httpService
	ops       *httpService // nil without --ops-listen
	forwarder *forward.Forwarder
	pool      *pgxpool.Pool
}

// validate reports the first flag a user must fix.
func (o relayOptions) validate() error {
	switch {
	case o.producer == "":
		return errors.New("--producer is required: name the logical service this relay serves (for example --producer billing); it scopes idempotency keys and must be the same on every replica")
	case o.maxBody < 1:
		return errors.New("--max-body must be at least 1 byte")
	case o.spoolMaxBytes < o.maxBody:
		return fmt.Errorf("--spool-max-bytes %s is below --max-body %s: not even one event would fit", formatBytes(int64(o.spoolMaxBytes)), formatBytes(int64(o.maxBody)))
	case o.refeedWindow < 0:
		return errors.New("--refeed-window must not be negative (0 keeps no payload once forwarded)")
	case o.keyTTL < 0 || o.deadTTL < 0 || o.shutdownTimeout < 0 || o.maxBackoff < 0 || o.wakeUpInterval < 0:
		return errors.New("--key-ttl, --dead-ttl, --shutdown-timeout, --max-backoff and --wake-up-interval must not be negative")
	case o.batchSize < 1 || o.batchMaxRows < 1 || o.batchMaxBytes < 1:
		return errors.New("--batch-size, --batch-max-rows and --batch-max-bytes must be at least 1")
	case o.dbMaxConns < 1:
		return fmt.Errorf("--db-max-conns %d: want at least 1", o.dbMaxConns)
	case o.pprof && o.opsListen == "":
		return errors.New("--pprof needs --ops-listen: the profiler is never served on the ingest address")
	}
	return nil
}

func startRelay(ctx context.Context, o relayOptions, logger *slog.Logger) (*runningRelay, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	var verifier *auth.ServiceVerifier
	if o.jwtSecretFile != "" {
		secret, err := auth.ReadSecretFile(o.jwtSecretFile)
		if err != nil {
			return nil, err
		}
		if verifier, err = auth.NewServiceVerifier(secret); err != nil {
			return nil, err
		}
	} else if !isLoopback(o.listen) {
		return nil, fmt.Errorf("--listen %s is not a loopback address: set --service-jwt-secret-file so that callers must authenticate, or listen on 127.0.0.1", o.listen)
	}
	reg := httpapi.NewRegistry()
	spoolMetrics := relay.NewSpoolMetrics(reg, logger)
	sp, err := spool.Open(ctx, spool.Config{
		Path:           o.spoolPath,
		Sync:           spool.SyncMode(o.syncMode),
		MaxBytes:       int64(o.spoolMaxBytes),
		KeyTTL:         o.keyTTL,
		DeadTTL:        o.deadTTL,
		Logger:         logger,
		OnCommit:       spoolMetrics.ObserveCommit,
		RefeedWindow:   o.refeedWindow,
		RefeedMaxBytes: int64(o.refeedMaxBytes),
	})
	if err != nil {
		return nil, err
	}
	spoolMetrics.SetSpool(sp, int64(o.spoolMaxBytes))
	handler, err := relay.New(relay.Config{
		Producer: o.producer,
		Spool:    sp,
		MaxBody:  int64(o.maxBody),
		Verifier: verifier,
		Registry: reg,
		Logger:   logger,
	})
	if err != nil {
		sp.Close(ctx)
		return nil, err
	}
	var pool *pgxpool.Pool
	var forwarder *forward.Forwarder
	if o.databaseURL != "" {
		if pool, forwarder, err = newForwarder(o, sp, reg, logger); err != nil {
			sp.Close(ctx)
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", o.listen)
	var opsLn net.Listener
	if err == nil && o.opsListen != "" {
		if opsLn, err = net.Listen("tcp", o.opsListen); err != nil {
			ln.Close()
			err = fmt.Errorf("--ops-listen: %w", err)
		}
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		sp.Close(ctx)
		return nil, fmt.Errorf("listen: %w", err)
	}
	r := &runningRelay{
		addr:      ln.Addr().String(),
		log:       logger.With("component", "relay"),
		spool:     sp,
		handler:   handler,
		http:      serveHTTP(ln, handler, logger),
		forwarder: forwarder,
		pool:      pool,
	}
	if opsLn != nil {
		var ops http.Handler = handler.Ops()
		if o.pprof {
			ops = withProfiler(ops)
		}
		r.ops, r.opsAddr = serveHTTP(opsLn, ops, logger), opsLn.Addr().String()
		r.log.Info("serving health and metrics", "addr", opsLn.Addr().String(), "pprof", o.pprof)
	}
	r.log.Info("relay listening", "addr", r.addr, "producer", o.producer, "spool", o.spoolPath, "sync", o.syncMode, "auth", verifier != nil)
	if forwarder != nil {
		forwarder.Start(context.WithoutCancel(ctx))
		r.log.Info("forwarding the spool to Postgres", "batch_size", o.batchSize, "max_conns", o.dbMaxConns)
	} else {
		r.log.Warn("no --database-url: the relay only spools; accepted events wait in the spool until a relay with --database-url forwards them")
	}
	return r, nil
}

// wait serves until ctx is cancelled, then shuts down. A server that stops on
// its own is an error, and the spool is still closed cleanly.
func (r *runningRelay) wait(ctx context.Context, timeout time.Duration) error {
	err := r.http.wait(ctx)
	return errors.Join(err, r.shutdown(timeout))
}

// spoolCloseReserve is the part of the shutdown budget kept for closing the
// spool (commit what is queued, checkpoint the WAL), whatever came before.
const spoolCloseReserve = 2 * time.Second

// shutdown stops accepting, answers what is in flight, forwards what it can,
// then closes the spool, all within timeout.
func (r *runningRelay) shutdown(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	r.log.Info("relay shutting down")
	r.handler.Drain() // probes see 503 from now on, on the ops listener until the end
	errShutdown := r.http.stop(ctx)
	if r.forwarder != nil {
		// The final forward may use what is left, but the spool's reserve, so
		// that a hanging Postgres cannot eat the time the spool needs.
		fctx, fcancel := context.WithDeadline(context.Background(), deadline.Add(-spoolCloseReserve))
		if err := r.forwarder.Stop(fctx); err != nil {
			// Not a failed shutdown: what is left waits safely in the spool.
			r.log.Warn("some events were not forwarded before shutdown; they stay in the spool for the next start", "err", err)
		}
		fcancel()
		r.pool.Close()
	}
	sctx, scancel := context.WithDeadline(context.Background(), later(deadline, time.Now().Add(spoolCloseReserve)))
	defer scancel()
	errSpool := r.spool.Close(sctx)
	if r.ops != nil {
		errShutdown = errors.Join(errShutdown, r.ops.stop(sctx))
	}
	if err := errors.Join(errShutdown, errSpool); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	r.log.Info("relay stopped cleanly")
	return nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// faultEnv names a test-only fault to inject; see docs/operations.md.
const faultEnv = "SPOOLCAST_TEST_FAULT"

func newForwarder(o relayOptions, sp *spool.Spool, reg prometheus.Registerer, logger *slog.Logger) (*pgxpool.Pool, *forward.Forwarder, error) {
	pool, err := pgpool.New(context.Background(), pgpool.Config{URL: o.databaseURL, MaxConns: o.dbMaxConns})
	if err != nil {
		return nil, nil, fmt.Errorf("--database-url: %w", err)
	}
	if err := checkKeyWindow(pool, o.keyTTL, logger); err != nil {
		pool.Close()
		return nil, nil, err
	}
	fcfg := forward.Config{
		Spool:           sp,
		DB:              pool,
		BatchSize:       o.batchSize,
		BatchRecipients: o.batchMaxRows,
		BatchBytes:      int64(o.batchMaxBytes),
		Workers:         o.dbMaxConns, // one batch in flight per connection
		MaxBackoff:      o.maxBackoff,
		WakeUpInterval:  o.wakeUpInterval,
		Metrics:         forward.NewMetrics(reg),
		Logger:          logger,
	}
	if os.Getenv(faultEnv) == "exit-after-ingest" {
		fcfg.AfterIngest = func() {
			logger.Error("test fault: exiting after the Postgres commit, before the spool acknowledgement")
			os.Exit(97)
		}
	}
	f, err := forward.New(fcfg)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, f, nil
}

// checkKeyWindow refuses a --key-ttl that is not shorter than the key window
// central's maintenance recorded in Postgres: past the window a retry the
// relay still answers as a duplicate could be forwarded as a new event. When
// Postgres cannot tell yet (unreachable, or no pass has run), the relay starts.
func checkKeyWindow(pool *pgxpool.Pool, keyTTL time.Duration, logger *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var recorded string
	if err := pool.QueryRow(ctx, `SELECT value FROM spoolcast_settings WHERE name = 'key_window'`).Scan(&recorded); err != nil {
		logger.Debug("central's key window is not known yet; --key-ttl is not checked against it", "err", err)
		return nil
	}
	window, err := time.ParseDuration(recorded)
	if err != nil || keyTTL < window {
		return nil
	}
	return fmt.Errorf("--key-ttl %s is not shorter than central's key window %s (its --key-window): retries after the window would make second notifications; lower --key-ttl", keyTTL, window)
}

func isLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// sampleCurl is the README tour's first command (see devSampleCurl).
func sampleCurl(addr string) string {
	return fmt.Sprintf(`curl -si http://%s/v1/events -H 'Content-Type: application/json' -d '{"idempotency_key":"demo:1","type":"demo.hello","recipients":["u_123"],"title":"Hello"}'`, addr)
}

// withProfiler serves Go's profiler under /debug/pprof/ beside h.
func withProfiler(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/", h)
	return mux
}

// relayGCPercent is the relay's GOGC unless the environment sets one: its
// live heap is small (tens of MB at the worst legal input), so letting it grow
// 4× between collections costs little memory and saves CPU on every event.
// Set GOMEMLIMIT to bound it below the container's limit.
const relayGCPercent = 300

func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(relayGCPercent)
	}
}
