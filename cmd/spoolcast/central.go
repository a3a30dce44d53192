package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/apiversion"
	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/central"
	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/docs"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/pglisten"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/internal/ratelimit"
	"github.com/spoolcast/spoolcast/lifecycle"
	"github.com/spoolcast/spoolcast/live"
	"github.com/spoolcast/spoolcast/migrations"
	"github.com/spoolcast/spoolcast/preferences"
	"github.com/spoolcast/spoolcast/push"
	"github.com/spoolcast/spoolcast/schedule"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/topics"
	"github.com/spoolcast/spoolcast/webhook"
)

// centralOptions are central's flags.
type centralOptions struct {
	listen              string
	opsListen           string
	pprof               bool
	timeouts            httpTimeouts
	rateLimitUser       ratelimit.Rate
	rateLimitIP         ratelimit.Rate
	trustedProxies      ratelimit.Proxies
	databaseURL         string
	databaseReadURL     string
	maxReplicaLag       time.Duration
	oidcIssuer          string
	oidcAudience        string
	jwksURL             string
	userClaim           string
	rolesClaim          string
	adminRole           string
	jwtSecretFile       string
	minAppVersion       string
	dbMaxConns          int
	dbConnectTimeout    time.Duration
	dbStatementTimeout  time.Duration
	maintenanceInterval time.Duration
	wakeUpInterval      time.Duration
	directURL           string
	prepared            pgpool.PreparedStatements
	tokenCacheSize      int
	inbox               bool
	lifecycle           lifecycleFlags
	live                liveFlags
	push                pushFlags
	channels            channelFlags
	webhooks            webhookFlags
	topics              topicFlags
	shutdownTimeout     time.Duration
	log                 logFlags
}

func (o *centralOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to serve the API on")
	fs.StringVar(&o.opsListen, "ops-listen", "", "address serving only /healthz, /readyz, /metrics and /internal/… (and /debug/pprof/ with --pprof), for probes, scrapers and in-cluster producers; --listen then serves only the public API (/v1, /inbox, /openapi.yaml). Unset, --listen serves everything")
	fs.BoolVar(&o.pprof, "pprof", false, "serve Go's profiler at /debug/pprof/ on --ops-listen (never on the public address)")
	o.timeouts.register(fs)
	fs.TextVar(&o.rateLimitUser, "rate-limit-user", ratelimit.Rate{N: 20, Per: time.Second}, "requests each end user may make to /v1 on this replica (20/s, 100/m, 5/h; bursts of twice that; 0 or off: no limit); past it 429 with Retry-After and the RateLimit fields")
	fs.TextVar(&o.rateLimitIP, "rate-limit-ip", ratelimit.Rate{N: 10, Per: time.Second}, "requests with a missing or bad token each client address may make on this replica before they are answered 429 instead of 401 (0 or off: no limit). The address is the connection's, or with --trusted-proxies the one they forwarded")
	fs.TextVar(&o.trustedProxies, "trusted-proxies", ratelimit.Proxies(nil), "comma-separated CIDR prefixes or addresses of the load balancers in front of central (10.0.0.0/8,192.0.2.7; may be given more than once): a request from one is keyed for --rate-limit-ip by the rightmost X-Forwarded-For address that is not one of them. Unset, X-Forwarded-For is ignored, and behind a proxy every client shares the proxy's address")
	fs.StringVar(&o.oidcIssuer, "oidc-issuer", "", "issuer (iss) of end users' OIDC tokens (required)")
	fs.StringVar(&o.oidcAudience, "oidc-audience", "", "audience (aud) end users' tokens must carry (required)")
	fs.StringVar(&o.jwksURL, "jwks-url", "", "URL of the issuer's JWKS (required)")
	fs.StringVar(&o.userClaim, "user-claim", "sub", "token claim holding the user id (Microsoft Entra: oid)")
	fs.StringVar(&o.rolesClaim, "roles-claim", "roles", "token claim holding the user's roles")
	fs.StringVar(&o.adminRole, "admin-role", "admin", "role that /v1/admin routes require")
	fs.StringVar(&o.minAppVersion, "min-app-version", "", "oldest Spoolcast-App-Version served; older apps get 426 (empty serves all)")
	fs.StringVar(&o.databaseURL, "database-url", "", "Postgres URL (required)")
	fs.StringVar(&o.databaseReadURL, "database-read-url", "", "Postgres URL of a read replica (a streaming standby; several hosts in libpq's syntax, e.g. postgres://u@r1,r2/db?target_session_attrs=prefer-standby): feed pages, unread counts and the admin delivery log read from it while it is current and has replayed the caller's last write; unset, every read goes to --database-url")
	fs.DurationVar(&o.maxReplicaLag, "max-replica-lag", 5*time.Second, "the most --database-read-url may lag behind the primary and serve reads (measured every second); a replica further behind, or down, sends reads to the primary, and a write's read-your-writes window is this plus 2s")
	fs.StringVar(&o.jwtSecretFile, "service-jwt-secret-file", "", "file holding the HS256 secret of service tokens for /internal routes (unset: they answer 401)")
	fs.IntVar(&o.dbMaxConns, "db-max-conns", 10, "Postgres connections central may open (to --database-url, and as many again to --database-read-url); the live stream's handshakes and resumes hold at most half of them at once (one, with 1), so that a reconnect wave leaves the rest to push dispatch, the feed and the API")
	fs.DurationVar(&o.dbConnectTimeout, "db-connect-timeout", 5*time.Second, "longest wait to open a Postgres connection")
	fs.DurationVar(&o.dbStatementTimeout, "db-statement-timeout", 5*time.Second, "longest a request waits on Postgres; past it the request gets 503 + Retry-After and the statement is cancelled")
	fs.DurationVar(&o.maintenanceInterval, "maintenance-interval", time.Hour, "how often central runs a maintenance pass (one replica at a time); 0 leaves it to `spoolcast maintain`")
	fs.DurationVar(&o.wakeUpInterval, "wake-up-interval", ingest.DefaultWakeUpInterval, "least time between the wake-ups (NOTIFY) /internal/v1/events sends after its commits")
	fs.StringVar(&o.directURL, "direct-database-url", "", "Postgres URL for the LISTEN connection that wakes the live stream and the push dispatcher, direct (not through PgBouncer in transaction mode); default --database-url")
	fs.TextVar(&o.prepared, "database-prepared-statements", pgpool.PreparedAuto, "whether hot statements run as named prepared statements, planned once per connection instead of at every run (the live stream's read at every wake-up and each resume, feed pages and unread counts): auto prepares them on connections straight to Postgres and not through a pooler (known by its cancel key); on prepares them everywhere (for PgBouncer 1.21 or later with max_prepared_statements > 0, or session mode); off nowhere. PgBouncer's transaction mode before 1.21 loses named statements between transactions; every other statement always runs unnamed")
	fs.IntVar(&o.tokenCacheSize, "token-cache-size", auth.DefaultCachedTokens, "verified user tokens kept per replica, by their SHA-256 until they expire, so that a token is verified once rather than at every request; dropped when the issuer's JWKS drops or changes a key; negative keeps none")
	fs.BoolVar(&o.inbox, "inbox", false, "serve the web inbox at /inbox: a page showing a user's feed and live arrivals, signed in with their token")
	o.lifecycle.register(fs)
	o.live.register(fs)
	o.push.register(fs)
	o.channels.register(fs)
	o.webhooks.register(fs)
	o.topics.register(fs)
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long a graceful shutdown waits for requests in flight")
	o.log.register(fs)
}

func centralCommand() (*flag.FlagSet, runFunc) {
	var o centralOptions
	fs := newFlagSet("central", "spoolcast central --database-url URL --oidc-issuer ISS --oidc-audience AUD --jwks-url URL [flags]")
	o.register(fs)
	return fs, func(ctx context.Context, _ []string) error {
		logger, err := o.log.logger(os.Stderr)
		if err != nil {
			return err
		}
		c, err := startCentral(ctx, o, logger, nil)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "\ncentral ready on http://%s\n\n", c.addr)
		return c.wait(ctx, o.shutdownTimeout)
	}
}

// runningCentral is a started central API.
type runningCentral struct {
	addr        string
	opsAddr     string // "" without --ops-listen
	log         *slog.Logger
	http        *httpService
	ops         *httpService // nil without --ops-listen
	pool        *pgxpool.Pool
	readPool    *pgxpool.Pool // nil without --database-read-url
	readerPool  *pgxpool.Pool // the live reader's own connection
	verifier    *auth.UserVerifier
	maintenance *lifecycle.Scheduler // nil with --maintenance-interval 0
	push        *pushWorkers         // nil with --push=false
	channels    []channel.Channel    // APNs and FCM, as set up
	firer       *schedule.Firer      // scheduled notifications and digest windows
	firerWaker  *ingest.Waker        // wakes the readers after the firer's commits
	fanout      *topics.Fanout       // its gauges only, with --topic-fanout-workers 0
	fanoutWaker *ingest.Waker        // wakes the readers after the fan-out's commits
	webhooks    *webhook.Deliverer   // nil with --webhooks=false
	listener    *pglisten.Listener
	live        *live.Hub
	api         *central.Server
	// listenersClosed is closed when a shutdown has closed the HTTP
	// listeners: sockets closed after that reconnect to another replica.
	listenersClosed chan struct{}
}

// validate reports the first flag a user must fix.
func (o centralOptions) validate() error {
	switch {
	case o.databaseURL == "":
		return errors.New("--database-url is required")
	case o.dbMaxConns < 1:
		return fmt.Errorf("--db-max-conns %d: want at least 1", o.dbMaxConns)
	case o.dbConnectTimeout < 0 || o.dbStatementTimeout < 0 || o.shutdownTimeout < 0 || o.maintenanceInterval < 0 || o.wakeUpInterval < 0:
		return errors.New("--db-connect-timeout, --db-statement-timeout, --maintenance-interval, --shutdown-timeout and --wake-up-interval must not be negative")
	case o.maxReplicaLag < 0:
		return fmt.Errorf("--max-replica-lag %s: must not be negative (0 is the default, 5s)", o.maxReplicaLag)
	case o.maintenanceInterval > 0 && o.dbMaxConns < 2:
		return errors.New("--db-max-conns must be at least 2 while central runs maintenance (--maintenance-interval): a pass holds one connection for its lock")
	case 2*o.topics.workers > o.dbMaxConns:
		return fmt.Errorf("--topic-fanout-workers %d: each holds up to two of --db-max-conns %d while it writes a batch; at most %d", o.topics.workers, o.dbMaxConns, o.dbMaxConns/2)
	case o.pprof && o.opsListen == "":
		return errors.New("--pprof needs --ops-listen: the profiler is never served on the public address")
	}
	if err := o.timeouts.validate(); err != nil {
		return err
	}
	if err := o.push.validate(); err != nil {
		return err
	}
	if err := o.channels.validate(); err != nil {
		return err
	}
	if err := o.live.validate(); err != nil {
		return err
	}
	if err := o.topics.validate(); err != nil {
		return err
	}
	return o.lifecycle.config().Validate()
}

// startCentral serves central's API. extra, when set, serves the paths it
// claims before central does (the dev stack's JWKS).
func startCentral(ctx context.Context, o centralOptions, logger *slog.Logger, extra map[string]http.Handler) (*runningCentral, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	var minApp apiversion.AppVersion
	if o.minAppVersion != "" {
		v, err := apiversion.ParseAppVersion(o.minAppVersion)
		if err != nil {
			return nil, fmt.Errorf("--min-app-version: %w", err)
		}
		minApp = v
	}
	var services *auth.ServiceVerifier
	if o.jwtSecretFile != "" {
		secret, err := auth.ReadSecretFile(o.jwtSecretFile)
		if err != nil {
			return nil, err
		}
		if services, err = auth.NewServiceVerifier(secret); err != nil {
			return nil, err
		}
	}
	// Serve first: in the dev stack the JWKS is served on this listener, and
	// the verifier fetches it before central's routes exist.
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	var opsLn net.Listener
	if o.opsListen != "" {
		if opsLn, err = net.Listen("tcp", o.opsListen); err != nil {
			ln.Close()
			return nil, fmt.Errorf("--ops-listen: %w", err)
		}
	}
	var apiHandler atomic.Pointer[http.Handler]
	mux := http.NewServeMux()
	for path, h := range extra {
		mux.Handle(path, h)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if h := apiHandler.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		w.Header().Set("Retry-After", "1")
		problem.Write(w, r, problem.New(http.StatusServiceUnavailable, problem.Starting, "central is starting; retry in a moment"))
	})
	var public http.Handler = mux
	if opsLn != nil {
		public = onlyPublic(mux, extra)
	}
	c := &runningCentral{
		addr:            ln.Addr().String(),
		log:             logger.With("component", "central"),
		http:            serveHTTPWith(ln, public, logger, o.timeouts),
		listenersClosed: make(chan struct{}),
	}
	c.http.server.RegisterOnShutdown(func() { close(c.listenersClosed) })
	if opsLn != nil {
		var ops http.Handler = onlyOps(mux)
		if o.pprof {
			ops = withProfiler(ops)
		}
		c.ops, c.opsAddr = serveHTTPWith(opsLn, ops, logger, o.timeouts), opsLn.Addr().String()
		c.log.Info("serving probes, metrics and /internal", "addr", c.opsAddr, "pprof", o.pprof)
	}
	fail := func(err error) (*runningCentral, error) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // no grace: nothing was served yet
		_ = c.http.stop(ctx)
		if c.ops != nil {
			_ = c.ops.stop(ctx)
		}
		if c.verifier != nil {
			c.verifier.Close()
		}
		if c.pool != nil {
			c.pool.Close()
		}
		if c.readPool != nil {
			c.readPool.Close()
		}
		closeChannels(c.channels)
		if c.readerPool != nil {
			c.readerPool.Close()
		}
		return nil, err
	}
	users, err := auth.NewUserVerifier(auth.UserVerifierConfig{
		JWKSURL: o.jwksURL, Issuer: o.oidcIssuer, Audience: o.oidcAudience,
		UserClaim: o.userClaim, RolesClaim: o.rolesClaim, CachedTokens: o.tokenCacheSize, Logger: logger,
	})
	if err != nil {
		return fail(err)
	}
	c.verifier = users
	if c.pool, err = pgpool.New(ctx, pgpool.Config{URL: o.databaseURL, MaxConns: o.dbMaxConns, ConnectTimeout: o.dbConnectTimeout,
		Prepare: live.ResumeStatements(), PrepareOnFirstRun: true, PreparedStatements: o.prepared}); err != nil {
		return fail(fmt.Errorf("--database-url: %w", err))
	}
	var readDB central.ReadDB // a nil *pgxpool.Pool would not be a nil ReadDB
	if o.databaseReadURL != "" {
		// Feed pages read their refresh cursor (live.Now) where they read.
		if c.readPool, err = pgpool.New(ctx, pgpool.Config{URL: o.databaseReadURL, MaxConns: o.dbMaxConns, ConnectTimeout: o.dbConnectTimeout,
			Prepare: live.ResumeStatements(), PrepareOnFirstRun: true, PreparedStatements: o.prepared}); err != nil {
			return fail(fmt.Errorf("--database-read-url: %w", err))
		}
		readDB = c.readPool
	}
	reg := httpapi.NewRegistry()
	pushMetrics := push.NewMetrics(reg)
	prefsMetrics := preferences.NewMetrics(reg)
	deviceStore := devices.New(c.pool, devices.NewMetrics(reg))
	deviceStore.MaxEnabledPerUser = o.push.maxDevices
	// Built on every replica, pushing or not: registrations check tokens
	// against them.
	if c.channels, err = o.channels.channels(c.pool, logger); err != nil {
		return fail(err)
	}
	deviceStore.Channels = c.channels
	var prefs preferences.Source
	var builtin *preferences.Builtin
	if o.push.prefsURL != "" {
		if prefs, err = externalPreferences(o, prefsMetrics, logger); err != nil {
			return fail(err)
		}
	} else {
		builtin = preferences.NewBuiltin(c.pool, prefsMetrics, logger)
		prefs = builtin
	}
	direct := cmp.Or(o.directURL, o.databaseURL)
	c.listener = pglisten.New(direct, ingest.NotifyChannel, nil, logger)
	// The live reader's one connection, direct like LISTEN's: a wave of
	// resumes on the pool (or in PgBouncer's queue) never delays the reads
	// every open socket waits on. Its statements are all the reader's, so it
	// may plan them once for good.
	if c.readerPool, err = pgpool.New(ctx, pgpool.Config{URL: direct, MaxConns: 1, ConnectTimeout: o.dbConnectTimeout,
		Prepare: live.ReaderStatements(), PreparedStatements: o.prepared, GenericPlans: true}); err != nil {
		return fail(err)
	}
	if c.live, err = live.New(live.Config{
		// Half the pool at most for handshakes and resumes: a reconnect
		// wave once held all of it, and pushes waited seconds behind it.
		DB: c.pool, ReaderDB: c.readerPool, ResumeConns: max(1, o.dbMaxConns/2),
		Wake: c.listener.Subscribe(), PollInterval: o.live.pollInterval, PingInterval: o.live.pingInterval,
		QueueBytes: int(o.live.queueBytes), MaxSocketsPerUser: o.live.maxPerUser, MaxSockets: o.live.maxSockets,
		Presence: o.push.suppressIfSeen > 0,
		Metrics:  live.NewMetrics(reg), Logger: logger,
	}); err != nil {
		return fail(err)
	}
	// A nil *ServiceVerifier in the interface would not be nil: /internal
	// would answer 500, not 401, without --service-jwt-secret-file.
	var serviceAuth central.ServiceAuthorizer
	if services != nil {
		serviceAuth = services
	}
	userLimit, err := ratelimit.New(ratelimit.Config{Name: "user", Rate: o.rateLimitUser})
	if err != nil {
		return fail(fmt.Errorf("--rate-limit-user: %w", err))
	}
	ipLimit, err := ratelimit.New(ratelimit.Config{Name: "ip", Rate: o.rateLimitIP})
	if err != nil {
		return fail(fmt.Errorf("--rate-limit-ip: %w", err))
	}
	webPush, vapidPublic, err := o.push.webPush()
	if err != nil {
		return fail(err)
	}
	api, err := central.New(central.Config{
		VAPIDPublicKey: vapidPublic, WebPushAllowPrivate: o.push.webAllowPrivate,
		UserLimit: userLimit, FailedAuthLimit: ipLimit, TrustedProxies: o.trustedProxies,
		DB: c.pool, ReadDB: readDB, MaxReplicaLag: o.maxReplicaLag, DBTimeout: o.dbStatementTimeout, Users: users, Services: serviceAuth, AdminRole: o.adminRole,
		Devices: deviceStore, PushMetrics: pushMetrics, Preferences: builtin, PreferencesExternal: builtin == nil,
		Webhooks: webhook.NewStore(webhook.StoreConfig{DB: c.pool, AllowPrivate: o.webhooks.allowPrivate}),
		Live:     c.live, SchemaReady: schemaReady(c.pool), AllowedOrigins: o.live.allowedOrigins, WakeUpInterval: o.wakeUpInterval, Inbox: o.inbox,
		MinAppVersion: minApp, OpenAPI: docs.OpenAPI, Registry: reg, Logger: logger,
		PrepareFeedReads: pgpool.PrepareWhereAllowed, // by each pool's --database-prepared-statements
	})
	if err != nil {
		return fail(err)
	}
	c.api = api
	bg := context.WithoutCancel(ctx)
	if o.push.enabled {
		if c.push, err = startPush(ctx, o, c.pool, c.listener.Subscribe(), pushMetrics, prefs, deviceStore, webPush, c.channels, logger); err != nil {
			return fail(err)
		}
	}

	// Due work fires in every replica, pushing or not: a scheduled
	// notification is the feed's before it is push's.
	c.firerWaker = ingest.NewWaker(c.pool, o.wakeUpInterval, nil, logger)
	if c.firer, err = schedule.New(schedule.Config{DB: c.pool, Fired: c.firerWaker.Committed, Metrics: schedule.NewMetrics(reg), Logger: logger}); err != nil {
		return fail(err)
	}

	if c.webhooks, err = o.webhooks.deliverer(c.pool, reg, logger); err != nil {
		return fail(err)
	}

	// Topic fan-outs, shared by every replica that runs workers.
	c.fanoutWaker = ingest.NewWaker(c.pool, o.wakeUpInterval, nil, logger)
	// A replica with --topic-fanout-workers 0 writes none, but still
	// exports the gauges: with 0 everywhere, the stall alert says so.
	{
		cfg := o.topics.config()
		cfg.DB, cfg.Written, cfg.Metrics, cfg.Logger = c.pool, c.fanoutWaker.Committed, topics.NewMetrics(reg), logger
		cfg.WatchOnly = o.topics.workers == 0
		if c.fanout, err = topics.NewFanout(cfg); err != nil {
			return fail(err)
		}
	}

	{
		cfg := o.lifecycle.config()
		cfg.DB, cfg.Metrics, cfg.Logger = c.pool, lifecycle.NewMetrics(reg), logger
		if o.maintenanceInterval > 0 {
			c.maintenance, err = lifecycle.NewScheduler(cfg, o.maintenanceInterval)
		} else {
			// Passes run elsewhere (a `spoolcast maintain` CronJob): still
			// export the partitions present, which the alerts watch.
			c.maintenance, err = lifecycle.NewWatcher(cfg, time.Minute)
		}
		if err != nil {
			return fail(err)
		}
		c.maintenance.Start(context.WithoutCancel(ctx))
	}
	c.listener.Start(bg)
	c.live.Start(bg)
	c.firer.Start(bg)
	if c.fanout != nil {
		c.fanout.Start(bg)
	}
	if c.webhooks != nil {
		c.webhooks.Start(bg)
	}
	var h http.Handler = api
	apiHandler.Store(&h)
	c.log.Info("central listening", "addr", c.addr, "issuer", o.oidcIssuer, "internal_ingress", services != nil)
	return c, nil
}

func (c *runningCentral) wait(ctx context.Context, timeout time.Duration) error {
	err := c.http.wait(ctx)
	return errors.Join(err, c.shutdown(timeout))
}

func (c *runningCentral) shutdown(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// Push stops claiming at once and finishes its sends in flight alongside
	// the requests' drain, not after it: what it has not sent goes back to
	// the queue for the other replicas (a rolling deploy fails no push).
	pushStopped := make(chan error, 1)
	if c.push != nil {
		go func() { pushStopped <- c.push.stop(ctx) }()
	} else {
		pushStopped <- nil
	}
	// Webhook attempts in flight end (their own timeout bounds them) and are
	// recorded alongside the drain too.
	webhooksStopped := make(chan error, 1)
	if c.webhooks != nil {
		go func() { webhooksStopped <- c.webhooks.Stop(ctx) }()
	} else {
		webhooksStopped <- nil
	}
	stopped := make(chan error, 1)
	go func() { stopped <- c.http.stop(ctx) }()
	// Stream sockets are not requests the HTTP server waits for: once it has
	// stopped accepting, they are closed with 1001 and their apps reconnect
	// to another replica.
	select {
	case <-c.listenersClosed:
	case <-ctx.Done():
	}
	err := c.live.Shutdown(ctx)
	err = errors.Join(err, <-stopped)
	c.api.Close()
	err = errors.Join(err, <-pushStopped) // before the listener that wakes it and the pool it writes with
	closeChannels(c.channels)
	err = errors.Join(err, <-webhooksStopped)
	err = errors.Join(err, c.firer.Stop(ctx))
	c.firerWaker.Stop()
	if c.fanout != nil { // its batch in flight commits or rolls back; any replica resumes after it
		err = errors.Join(err, c.fanout.Stop(ctx))
	}
	c.fanoutWaker.Stop()
	err = errors.Join(err, c.listener.Stop(ctx))
	if c.maintenance != nil {
		err = errors.Join(err, c.maintenance.Stop(ctx))
	}
	if c.ops != nil { // the probes answered 503 to the end
		err = errors.Join(err, c.ops.stop(ctx))
	}
	c.verifier.Close()
	c.pool.Close()
	if c.readPool != nil {
		c.readPool.Close()
	}
	c.readerPool.Close()
	if err != nil {
		return fmt.Errorf("central shutdown: %w", err)
	}
	c.log.Info("central stopped cleanly")
	return nil
}

// schemaReady says whether the database holds every migration this binary
// carries.
func schemaReady(db migrations.Querier) func(context.Context) error {
	latest := migrations.Latest()
	return func(ctx context.Context) error {
		applied, err := migrations.Applied(ctx, db)
		if err != nil {
			return errors.New("cannot read the schema version from Postgres")
		}
		if applied < latest {
			return fmt.Errorf("the schema is at migration %d and this version needs %d: run spoolcast migrate up", applied, latest)
		}
		return nil
	}
}

// onlyPublic serves, of central's routes, the public API: / (which sends a
// newcomer to the inbox, or says where the API is), /v1/…, the inbox, the
// OpenAPI document (and the dev stack's extra paths); everything else is on
// --ops-listen.
func onlyPublic(h http.Handler, extra map[string]http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if p == "/" || strings.HasPrefix(p, "/v1/") || p == "/inbox" || strings.HasPrefix(p, "/inbox/") || p == "/openapi.yaml" || extra[p] != nil {
			h.ServeHTTP(w, r)
			return
		}
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.NotFound, "not on central's public address: /healthz, /readyz, /metrics and /internal/… are served on --ops-listen"))
	})
}

// onlyOps serves, of central's routes, the probes, the metrics and the
// internal ingress.
func onlyOps(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if p == "/healthz" || p == "/readyz" || p == "/metrics" || strings.HasPrefix(p, "/internal/") {
			h.ServeHTTP(w, r)
			return
		}
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.NotFound, "not on central's ops address: the public API (/v1, /inbox, /openapi.yaml) is served on --listen"))
	})
}
