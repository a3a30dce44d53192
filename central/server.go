// Package central is the HTTP API of the shared deployment in front of
// Postgres: the authenticated feed and read state for end users, the internal
// ingress for sibling services, admin views, health and metrics.
//
// The rule it keeps: every user route is scoped to the caller named by a
// verified token, and no route lets an end user create a notification.
package central

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/julienschmidt/httprouter"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spoolcast/spoolcast/apiversion"
	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/inbox"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/internal/ratelimit"
	"github.com/spoolcast/spoolcast/live"
	"github.com/spoolcast/spoolcast/preferences"
	"github.com/spoolcast/spoolcast/push"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/topics"
	"github.com/spoolcast/spoolcast/webhook"
)

// DB is what central needs of Postgres: a pgxpool.Pool.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Ping(ctx context.Context) error
}

// UserAuthorizer checks end users' bearer tokens.
type UserAuthorizer interface {
	Authorize(r *http.Request, role string) (auth.User, error)
	// AuthorizeWebSocket checks the token of a WebSocket handshake, which
	// rides in Sec-WebSocket-Protocol.
	AuthorizeWebSocket(r *http.Request) (auth.User, error)
}

// ServiceAuthorizer checks sibling services' bearer tokens.
type ServiceAuthorizer interface {
	Authorize(r *http.Request, scope string) (auth.ServiceClaims, error)
}

var (
	_ UserAuthorizer    = (*auth.UserVerifier)(nil)
	_ ServiceAuthorizer = (*auth.ServiceVerifier)(nil)
)

// Config configures central's API.
type Config struct {
	// DB is Postgres. Required.
	DB DB
	// Users checks end-user tokens. Required.
	Users UserAuthorizer
	// UserLimit limits each end user's requests to /v1 (the stream's
	// handshakes included); nil limits nothing.
	UserLimit *ratelimit.Limiter
	// FailedAuthLimit limits, per client address, the requests refused for
	// their token: past it they are answered 429 rather than 401, so that a
	// token guesser gets a slower answer than a wrong one; nil limits nothing.
	FailedAuthLimit *ratelimit.Limiter
	// TrustedProxies are the load balancers whose X-Forwarded-For names the
	// client FailedAuthLimit keys by (ratelimit.Proxies.ClientIP); none
	// keys by the connection's peer.
	TrustedProxies ratelimit.Proxies
	// Services checks service tokens on /internal routes. Nil refuses every
	// internal request with 401.
	Services ServiceAuthorizer
	// AdminRole is the role /v1/admin routes require. Default "admin".
	AdminRole string
	// Devices registers push tokens. Default the store over DB.
	Devices *devices.Store
	// Topics keeps topics and their members. Default on DB.
	Topics *topics.Store
	// PushMetrics counts the cancellations of scheduled events; nil: not counted.
	PushMetrics *push.Metrics
	// VAPIDPublicKey is the Web Push key browsers subscribe with, served at
	// /v1/push/vapid-public-key; empty answers it 404.
	VAPIDPublicKey string
	// WebPushAllowPrivate lets web subscriptions name endpoints on
	// loopback, link-local and private addresses (tests, development).
	WebPushAllowPrivate bool
	// Webhooks is the admin API's store of webhook endpoints. Default the
	// store over DB, refusing non-public targets.
	Webhooks *webhook.Store
	// Preferences keeps built-in push preferences. Default the store over DB.
	Preferences *preferences.Builtin
	// PreferencesExternal says preferences live in the product's own API
	// (--prefs-url): /v1/preferences answers 404 saying so.
	PreferencesExternal bool
	// Live serves /v1/stream; nil answers it 404.
	Live *live.Hub
	// SchemaReady, when set, reports whether the database's schema is the
	// one this code needs. Readiness waits for it: a replica that starts
	// before its migration has run must not take traffic.
	SchemaReady func(ctx context.Context) error
	// AllowedOrigins are the browser origins (scheme://host[:port]) that may
	// call the API (CORS) and open /v1/stream; "*" allows any. A handshake
	// without Origin (a native app) or from the server's own host is always
	// allowed.
	AllowedOrigins []string
	// Inbox serves the web inbox at /inbox (package inbox).
	Inbox bool
	// MinAppVersion, when set, answers 426 to apps that send an older Spoolcast-App-Version.
	MinAppVersion apiversion.AppVersion
	// Versions are the API versions served. Default apiversion.Default().
	Versions *apiversion.Registry
	// MaxBody caps an internal ingest body. Default 64 KiB.
	MaxBody int64
	// DBTimeout bounds the Postgres work of one request; past it the request
	// is answered 503 and Postgres is asked to cancel the statement.
	// Default 5s.
	DBTimeout time.Duration
	// WakeUpInterval is the least time between the wake-ups the internal
	// ingress sends after its commits (ingest.Waker). Default
	// ingest.DefaultWakeUpInterval.
	WakeUpInterval time.Duration
	// OpenAPI is the document served at /openapi.yaml.
	OpenAPI []byte
	// Registry serves /metrics and receives central's metrics. Default a new
	// registry with the Go and process collectors.
	Registry *prometheus.Registry
	// Logger receives central's logs. Default slog.Default().
	Logger *slog.Logger
	// Clock tells central's time (receipt times, request durations). Default
	// the wall clock.
	Clock clock.Clock
	// ReadDB, when set, is a read replica of DB: a streaming standby (its
	// URL may name several). Feed pages, unread counts and the admin
	// delivery log read from it while it lags less than MaxReplicaLag and
	// has replayed the caller's last write (replica_reads.go); from DB when
	// it does not. Default none: every read on DB.
	ReadDB ReadDB
	// MaxReplicaLag is the most ReadDB may lag behind DB and serve reads.
	// Default 5s.
	MaxReplicaLag time.Duration
	// ReplicaProbeInterval is how often ReadDB's lag is measured. Default 1s.
	ReplicaProbeInterval time.Duration
	// RecentWriters bounds the users whose last write this replica
	// remembers, for clients that carry back neither the cookie nor the
	// header. Default 100,000.
	RecentWriters int
	// PrepareFeedReads runs feed pages and unread counts, on DB and ReadDB,
	// through this query rewriter (feed.Store.WithPreparedReads), which
	// prepares them on the connections that may hold named statements
	// (pgpool.PrepareWhereAllowed: by the pool's PreparedStatements).
	// Default nil: unnamed statements, which any pooler carries.
	PrepareFeedReads pgx.QueryRewriter
}

// Validate reports the first setting a user must fix.
func (c Config) Validate() error {
	switch {
	case c.DB == nil:
		return errors.New("central: a database is required")
	case c.Users == nil:
		return errors.New("central: a user token verifier is required")
	case c.MaxBody < 0:
		return errors.New("central: max body must not be negative")
	case c.DBTimeout < 0 || c.WakeUpInterval < 0:
		return errors.New("central: database timeout and wake-up interval must not be negative")
	case c.MaxReplicaLag < 0 || c.ReplicaProbeInterval < 0 || c.RecentWriters < 0:
		return errors.New("central: max replica lag, replica probe interval and recent writers must not be negative")
	}
	return nil
}

// Server is central's HTTP API.
type Server struct {
	cfg     Config
	log     *slog.Logger
	feed    *feed.Store
	metrics *metrics
	router  *httprouter.Router
	handler http.Handler
	routes  []Route
	dbLog   *lograte.Limiter // one line per interval while Postgres fails
	authLog *lograte.Limiter // one line per interval for refused tokens
	waker   *ingest.Waker
	// replica measures ReadDB; nil without one.
	replica *replicaMonitor
	// positions are this replica's users' last writes (read-your-writes).
	positions *writePositions
	// tickets open event streams for browsers' EventSources.
	tickets *live.Tickets
	// schemaReady is set once SchemaReady has passed: a schema does not go
	// back, so it is not asked again.
	schemaReady atomic.Bool
}

// Route is one registered route, as the OpenAPI check lists them.
type Route struct {
	Method string
	Path   string // httprouter syntax: /v1/notifications/:id/read
}

// New returns central's API.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.AdminRole = cmp.Or(cfg.AdminRole, "admin")
	if cfg.Webhooks == nil {
		cfg.Webhooks = webhook.NewStore(webhook.StoreConfig{DB: cfg.DB})
	}
	cfg.MaxBody = cmp.Or(cfg.MaxBody, 64<<10)
	cfg.DBTimeout = cmp.Or(cfg.DBTimeout, 5*time.Second)
	if cfg.Devices == nil {
		cfg.Devices = devices.New(cfg.DB, nil)
	}
	if cfg.Preferences == nil {
		cfg.Preferences = preferences.NewBuiltin(cfg.DB, nil, cfg.Logger)
	}
	if cfg.Topics == nil {
		cfg.Topics = topics.NewStore(cfg.DB)
	}
	if cfg.Versions == nil {
		cfg.Versions = apiversion.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = httpapi.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Clock = clock.Or(cfg.Clock)
	cfg.MaxReplicaLag = cmp.Or(cfg.MaxReplicaLag, 5*time.Second)
	cfg.ReplicaProbeInterval = cmp.Or(cfg.ReplicaProbeInterval, time.Second)
	cfg.RecentWriters = cmp.Or(cfg.RecentWriters, 100_000)
	log := cfg.Logger.With("component", "central")
	s := &Server{
		cfg:     cfg,
		log:     log,
		feed:    feed.NewStore(cfg.DB, cfg.Clock),
		metrics: newMetrics(cfg.Registry, cfg.Clock),
		router:  httpapi.NewRouter(log),
		dbLog:   lograte.New(10 * time.Second),
		authLog: lograte.New(10 * time.Second),
		waker:   ingest.NewWaker(cfg.DB, cfg.WakeUpInterval, cfg.Clock, log),
	}
	// A write's position is carried for the lag a replica may have and
	// serve reads, and two measuring intervals: past that, a replica that
	// serves reads has replayed it.
	var liveMetrics *live.Metrics
	if cfg.Live != nil {
		liveMetrics = cfg.Live.Metrics()
	}
	s.tickets = live.NewTickets(cfg.DB, cfg.Clock, liveMetrics)
	s.positions = newWritePositions(cfg.MaxReplicaLag+2*cfg.ReplicaProbeInterval, cfg.RecentWriters, cfg.Clock)
	if cfg.PrepareFeedReads != nil {
		s.feed = s.feed.WithPreparedReads(cfg.PrepareFeedReads)
	}
	s.metrics.initFeedReads(cfg.ReadDB != nil)
	if c, ok := cfg.Users.(tokenCacheStats); ok {
		registerTokenCache(cfg.Registry, c)
	}
	if cfg.ReadDB != nil {
		s.replica = newReplicaMonitor(cfg.DB, cfg.ReadDB, cfg.ReplicaProbeInterval, cfg.MaxReplicaLag, cfg.Clock, s.metrics.replicaLag, log)
		s.replica.Start(context.Background())
	}
	s.routeAll()
	s.handler = s.withCORS(httpapi.Answered(s.router, log))
	return s, nil
}

// Close sends the wake-up the internal ingress still owes and stops
// measuring the read replica. Call it once the HTTP server has stopped.
func (s *Server) Close() {
	s.waker.Stop()
	if s.replica != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.replica.Stop(ctx)
	}
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Routes lists every registered route.
func (s *Server) Routes() []Route { return s.routes }

func (s *Server) routeAll() {
	s.handle(http.MethodGet, "/healthz", httpapi.Healthz)
	s.handle(http.MethodGet, "/readyz", httpapi.Readyz(2*time.Second, s.ready))
	s.handle(http.MethodGet, "/metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}).ServeHTTP)
	s.handle(http.MethodGet, "/openapi.yaml", s.openapi)
	// Not an API route (so not in Routes, which OpenAPI describes): the
	// address opened in a browser, or tried with curl, says where to go.
	s.router.Handler(http.MethodGet, "/", s.metrics.instrument("GET /", http.HandlerFunc(s.root)))
	if s.cfg.Inbox {
		page := inbox.Handler("/inbox").ServeHTTP
		s.handle(http.MethodGet, "/inbox", page)
		s.handle(http.MethodGet, "/inbox/:file", page)
	}

	s.handleUser(http.MethodGet, "/v1/notifications", user, s.listNotifications)
	s.handleUser(http.MethodGet, "/v1/notifications/unread-count", user, s.unreadCount)
	s.handleUser(http.MethodGet, "/v1/notifications/counts", user, s.counts)
	// httprouter cannot hold /v1/notifications/read-all beside
	// /v1/notifications/:id/read, so read-all and archive-all arrive as the
	// :id of the one-segment route below; any other id there is 404.
	s.handleUser(http.MethodPost, "/v1/notifications/:id", user, s.markAll)
	s.handleUser(http.MethodPost, "/v1/notifications/:id/read", user, s.markState("mark read", (*feed.Store).MarkRead))
	s.handleUser(http.MethodPost, "/v1/notifications/:id/unread", user, s.markState("mark unread", (*feed.Store).MarkUnread))
	s.handleUser(http.MethodPost, "/v1/notifications/:id/archive", user, s.markState("archive", (*feed.Store).Archive))
	s.handleUser(http.MethodPost, "/v1/notifications/:id/unarchive", user, s.markState("unarchive", (*feed.Store).Unarchive))
	s.handleUser(http.MethodGet, "/v1/admin/users/:user/notifications", admin, s.adminListNotifications)
	s.handleUser(http.MethodGet, "/v1/admin/deliveries", admin, s.listDeliveries)
	s.handleUser(http.MethodPost, "/v1/admin/webhooks", admin, s.createWebhook)
	s.handleUser(http.MethodGet, "/v1/admin/webhooks", admin, s.listWebhooks)
	s.handleUser(http.MethodGet, "/v1/admin/webhooks/:id", admin, s.getWebhook)
	s.handleUser(http.MethodDelete, "/v1/admin/webhooks/:id", admin, s.deleteWebhook)
	s.handleUser(http.MethodPost, "/v1/admin/webhooks/:id/rotate-secret", admin, s.rotateWebhookSecret)
	s.handleUser(http.MethodPost, "/v1/admin/webhooks/:id/replay", admin, s.replayWebhook)
	s.handleUser(http.MethodGet, "/v1/admin/webhooks/:id/attempts", admin, s.listWebhookAttempts)

	s.handleUser(http.MethodGet, "/v1/devices", user, s.listDevices)
	s.handleUser(http.MethodPut, "/v1/devices", user, s.putDevice)
	s.handleUser(http.MethodDelete, "/v1/devices/:token", user, s.deleteDevice)
	s.handleUser(http.MethodGet, "/v1/push/vapid-public-key", user, s.vapidPublicKey)
	s.handleUser(http.MethodGet, "/v1/preferences", user, s.getPreferences)
	s.handleUser(http.MethodPut, "/v1/preferences", user, s.putPreferences)

	s.routeTopics()
	s.handleService(http.MethodPost, "/internal/v1/events", auth.ScopeEmit, s.ingestEvent)
	// A catch-all, so that cancelEvent reads the key from the escaped path.
	s.handleService(http.MethodDelete, "/internal/v1/events/*key", auth.ScopeEmit, s.cancelEvent)

	// The stream is not wrapped in API versions: its frames cannot be
	// buffered and translated. They follow the latest version's shapes.
	const stream = http.MethodGet + " /v1/stream"
	s.routes = append(s.routes, Route{Method: http.MethodGet, Path: "/v1/stream"})
	s.router.Handler(http.MethodGet, "/v1/stream", s.metrics.instrument(stream, apiversion.RequireApp(s.cfg.MinAppVersion, http.HandlerFunc(s.stream))))
	// What an event stream's app cannot send on its stream.
	s.handleUser(http.MethodPost, "/v1/stream/tickets", user, s.createStreamTicket)
	s.handleUser(http.MethodPost, "/v1/stream/seen", user, s.streamSeen)
}

// ready is nil while Postgres answers as a primary. A read-only answer (a
// standby, or a primary fenced during a failover) fails it, and resets a
// pool that can be (a pgxpool.Pool): its connections all reach a server
// that is no longer the primary, and pass no error that would drop them,
// so the next ones find the new primary (target_session_attrs=read-write).
func (s *Server) ready(ctx context.Context) error {
	var readOnly bool
	err := s.cfg.DB.QueryRow(ctx, pgpool.ReadOnlySQL).Scan(&readOnly)
	if err == nil && readOnly {
		if pool, ok := s.cfg.DB.(interface{ Reset() }); ok {
			pool.Reset()
		}
	}
	if err != nil || readOnly {
		// Without the primary, a replica still serves what it can: feed
		// reads from a current read replica (writes answer 503).
		if s.replica != nil {
			if ok, _ := s.replica.route(); ok {
				return nil
			}
		}
		if err != nil {
			return errors.New("Postgres is not reachable")
		}
		return errors.New("Postgres answers read-only (a standby, or a primary fenced during a failover): waiting for the primary; list every host in --database-url with target_session_attrs=read-write")
	}
	if s.cfg.SchemaReady != nil && !s.schemaReady.Load() {
		if err := s.cfg.SchemaReady(ctx); err != nil {
			return err
		}
		s.schemaReady.Store(true)
	}
	if s.cfg.Live != nil && !s.cfg.Live.Ready() {
		return errors.New("the live stream is not serving: its reader has not read Postgres yet, or the replica is shutting down")
	}
	return nil
}

// root sends a browser to the inbox when central serves it; otherwise it
// answers 404 with where the API is, rather than a bare "no route".
func (s *Server) root(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Inbox {
		http.Redirect(w, r, "/inbox", http.StatusFound)
		return
	}
	problem.Write(w, r, problem.New(http.StatusNotFound, problem.NotFound,
		"nothing is served at /: central's API is under /v1/ (GET /v1/notifications with a user's bearer token), described at /openapi.yaml; the web inbox is at /inbox when central runs with --inbox"))
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) {
	if len(s.cfg.OpenAPI) == 0 {
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.NotFound, "no API description is configured"))
		return
	}
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Content-Length", strconv.Itoa(len(s.cfg.OpenAPI)))
	_, _ = w.Write(s.cfg.OpenAPI)
}
