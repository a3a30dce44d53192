package live

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// DB is what the live stream needs of Postgres: a pgxpool.Pool. It may reach
// Postgres through PgBouncer in transaction mode: no query keeps session state.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a replica's live stream.
type Config struct {
	// DB is Postgres. Required. Its connections may hold ResumeStatements
	// prepared (pgpool.Config.Prepare).
	DB DB
	// ReaderDB is the live reader's own connection to the same database: a
	// wave of resumes (thousands of sockets reconnecting at once) queues on
	// DB, never in front of the reads that feed every open socket. It may
	// hold ReaderStatements prepared, with generic plans (every statement
	// with arguments the reader runs is one of them). Default DB.
	ReaderDB DB
	// ResumeConns bounds the connections of DB that the stream's
	// handshakes and resumes hold at once (a fresh socket's starting
	// point, a cursor's check, a resume's pages): a wave of reconnections
	// (thousands of apps whose replica died) waits for these, and leaves
	// the rest of DB's connections to what shares them (push dispatch, the
	// feed, the API). 0: no bound.
	ResumeConns int
	// Wake receives a value after ingest commits (the LISTEN connection's
	// subscription); each makes the reader read at once. Nil: the reader polls.
	Wake <-chan struct{}
	// PollInterval is how often the reader reads without a wake-up: the
	// longest a lost wake-up delays a frame. Default 500ms.
	PollInterval time.Duration
	// PingInterval is how often each socket is pinged. A socket that sends
	// nothing (not even the pong) for two intervals is dropped. Default 30s.
	PingInterval time.Duration
	// WriteTimeout bounds one write to a socket; past it the socket is
	// closed as too slow. Default 10s.
	WriteTimeout time.Duration
	// QueueFrames and QueueBytes bound what waits to be written to one
	// socket, and the live frames held for it while it resumes; a socket
	// past either is closed as too slow (1013) and its app resumes from its
	// cursor. Defaults 1024 frames, 1 MiB: a burst for one user fits; only
	// a socket that stops reading reaches them.
	QueueFrames int
	QueueBytes  int
	// MaxSocketsPerUser caps one user's sockets on this replica: the next
	// handshake is refused 429 before the upgrade. 0: 16.
	MaxSocketsPerUser int
	// MaxSockets caps this replica's sockets: past it a handshake is
	// refused 503, so that the load balancer tries another replica. 0: no
	// cap.
	MaxSockets int
	// Presence records in Postgres which users hold a socket here, for
	// --push-suppress-if-seen. Off: nothing is written. (Seen messages
	// move the users' seen positions either way: seen.go.)
	Presence bool
	// Replica names this replica in the presence rows. Default host-pid-time.
	Replica string
	// Metrics receives the stream's metrics. Default: not exported.
	Metrics *Metrics
	// Logger receives the stream's logs. Default slog.Default().
	Logger *slog.Logger

	// txSlack is how far reads look back from their lower bound (txSlack);
	// tests shorten it to hold the horizon past it.
	txSlack time.Duration
	// Clock tells the hub's time: the reader's waits and backoff, the ping
	// interval, socket read and write deadlines, and the lag and held
	// metrics. Deadlines are set on real connections, so a fake clock should
	// stand near the wall clock's time. Default the wall clock.
	Clock clock.Clock
}

// Validate reports the first setting a user must fix.
func (c Config) Validate() error {
	switch {
	case c.DB == nil:
		return errors.New("live: a database is required")
	case c.PollInterval < 0 || c.PingInterval < 0 || c.WriteTimeout < 0:
		return errors.New("live: poll interval, ping interval and write timeout must not be negative")
	case c.QueueFrames < 0 || c.QueueBytes < 0:
		return errors.New("live: queue bounds must not be negative")
	case c.ResumeConns < 0:
		return errors.New("live: resume connections must not be negative")
	}
	return nil
}

// Hub holds this replica's sockets by user and feeds them what the reader
// reads.
type Hub struct {
	cfg     Config
	log     *slog.Logger
	metrics *Metrics

	mu      sync.RWMutex
	users   map[string][]*socket
	stopped bool
	// total counts the sockets registered; admitting counts, in all and by
	// user, the handshakes admitted and not registered yet.
	total, admittingTotal int
	admitting             map[string]int

	svc     startstop.Service // the reader, the pinger and the resumes
	reader  reader
	ready   chan struct{}           // closed once the reader knows where to start
	state   atomic.Pointer[dbState] // what the reader last saw of the database, to check cursors by
	serving context.Context         // the loops' context, for resumes; set before ready is closed
	sockets sync.WaitGroup          // each socket until its connection is closed
	// presence is nil unless Config.Presence.
	presence *presence
	// seenBatch gathers the seen messages until the next write.
	seenBatch seenBatch
	// resumeTurns holds a token for each of DB's connections the
	// handshakes and resumes may use at once (Config.ResumeConns); nil: no
	// bound.
	resumeTurns chan struct{}
}

// New returns a hub; Start begins reading.
func New(cfg Config) (*Hub, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.PollInterval = cmp.Or(cfg.PollInterval, 500*time.Millisecond)
	cfg.PingInterval = cmp.Or(cfg.PingInterval, 30*time.Second)
	cfg.WriteTimeout = cmp.Or(cfg.WriteTimeout, 10*time.Second)
	cfg.QueueFrames = cmp.Or(cfg.QueueFrames, 1024)
	cfg.QueueBytes = cmp.Or(cfg.QueueBytes, 1<<20)
	cfg.MaxSocketsPerUser = cmp.Or(cfg.MaxSocketsPerUser, 16)
	cfg.txSlack = cmp.Or(cfg.txSlack, txSlack)
	if cfg.ReaderDB == nil {
		cfg.ReaderDB = cfg.DB
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Clock = clock.Or(cfg.Clock)
	cfg.Metrics.setClock(cfg.Clock)
	h := &Hub{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "live"),
		metrics:   cfg.Metrics,
		users:     map[string][]*socket{},
		admitting: map[string]int{},
		ready:     make(chan struct{}),
	}
	if cfg.ResumeConns > 0 {
		h.resumeTurns = make(chan struct{}, cfg.ResumeConns)
	}
	h.reader.hub = h
	if cfg.Presence {
		h.presence = newPresence(cfg.Replica)
	}
	return h, nil
}

// Start reads in the background and pings sockets; only the first call
// does, and none after Shutdown. Sockets are served once the reader has its
// starting position.
func (h *Hub) Start(ctx context.Context) {
	loops := []func(context.Context){h.reader.run, h.pingLoop, h.seenLoop}
	if h.presence != nil {
		loops = append(loops, h.presenceLoop)
	}
	h.svc.Start(ctx, loops...)
}

// Ready reports whether the hub serves sockets: started, its reader
// positioned, not shut down.
func (h *Hub) Ready() bool {
	select {
	case <-h.ready:
	default:
		return false
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	return !h.stopped
}

// Shutdown stops reading and closes every socket with 1001 (going away), so
// apps reconnect to another replica at once; it waits for the close frames
// to be written until ctx ends, then drops what is left. Safe to call twice,
// and before Start.
func (h *Hub) Shutdown(ctx context.Context) error {
	// No socket registers after this, and every socket registered is
	// closing before the loops stop: a resume cut short by the stop finds
	// its socket closed with 1001, not with an error.
	h.mu.Lock()
	h.stopped = true
	var all []*socket
	for _, ss := range h.users {
		all = append(all, ss...)
	}
	h.mu.Unlock()
	for _, s := range all {
		s.close(ws.StatusGoingAway, "server shutting down; reconnect")
	}
	err := h.svc.Stop(ctx)
	if !startstop.Wait(ctx, &h.sockets) {
		for _, s := range all {
			s.drop()
		}
		err = ctx.Err()
	}
	return err
}

// deadline is d from now on the hub's clock: a socket's read or write deadline.
func (h *Hub) deadline(d time.Duration) time.Time { return h.cfg.Clock.Now().Add(d) }

// add registers s under its user; false once the hub is shut down.
func (h *Hub) add(s *socket) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return false
	}
	h.users[s.user] = append(h.users[s.user], s)
	if h.presence != nil && len(h.users[s.user]) == 1 {
		h.presence.opened(s.user)
	}
	h.total++
	h.sockets.Add(1)
	h.metrics.connections.Inc()
	if s.transport == transportSSE {
		h.metrics.sse.Inc()
	}
	return true
}

// Why a handshake is not admitted (admit).
var (
	errUserSockets    = errors.New("this user holds the most sockets a replica serves one user")
	errReplicaSockets = errors.New("this replica holds the most sockets it serves")
)

// admit reserves a place for one more socket of user, counting the sockets
// registered and the handshakes admitted before it: errUserSockets past
// MaxSocketsPerUser, errReplicaSockets past MaxSockets. The returned
// function gives the place back once the socket is registered, or not.
func (h *Hub) admit(user string) (release func(), err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case len(h.users[user])+h.admitting[user] >= h.cfg.MaxSocketsPerUser:
		h.metrics.refused.WithLabelValues("user").Inc()
		return nil, errUserSockets
	case h.cfg.MaxSockets > 0 && h.total+h.admittingTotal >= h.cfg.MaxSockets:
		h.metrics.refused.WithLabelValues("replica").Inc()
		return nil, errReplicaSockets
	}
	h.admitting[user]++
	h.admittingTotal++
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.admitting[user]--; h.admitting[user] == 0 {
			delete(h.admitting, user)
		}
		h.admittingTotal--
	}, nil
}

// remove unregisters s; called once, when its connection is closed.
func (h *Hub) remove(s *socket) {
	h.mu.Lock()
	ss := h.users[s.user]
	for i, o := range ss {
		if o == s {
			ss = append(ss[:i], ss[i+1:]...)
			break
		}
	}
	if len(ss) == 0 {
		delete(h.users, s.user)
		if h.presence != nil {
			h.presence.closed(s.user)
		}
	} else {
		h.users[s.user] = ss
	}
	h.total--
	h.mu.Unlock()
	h.metrics.connections.Dec()
	if s.transport == transportSSE {
		h.metrics.sse.Dec()
	}
	h.sockets.Done()
}

// connected reports whether user has a socket here.
func (h *Hub) connected(user string) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.users[user]) > 0
}

// deliver offers a live frame to every socket of user.
func (h *Hub) deliver(user string, f frame) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, s := range h.users[user] {
		s.offer(f)
	}
}

// closeUser closes every socket of user with code.
func (h *Hub) closeUser(user string, code ws.StatusCode, reason string) {
	h.mu.RLock()
	ss := slices.Clone(h.users[user])
	h.mu.RUnlock()
	for _, s := range ss {
		s.close(code, reason)
	}
}

// pingLoop pings every socket each interval, spread over the interval so
// that the writes do not all wake at once: each pass pings one slice.
func (h *Hub) pingLoop(ctx context.Context) {
	const slices = 16
	ping := frame{kind: kindPing, bytes: wsFrame(ws.OpPing, nil)}
	var turn uint32
	schedule := startstop.Schedule{Interval: h.cfg.PingInterval / slices, Clock: h.cfg.Clock, Delay: true}
	startstop.Every(ctx, schedule, func(context.Context) bool {
		h.mu.RLock()
		for _, ss := range h.users {
			for _, s := range ss {
				if s.slot%slices == turn {
					s.enqueue(ping)
				}
			}
		}
		h.mu.RUnlock()
		turn = (turn + 1) % slices
		return false
	})
}

// seen records what the reader last saw of the database.
func (h *Hub) seen(st dbState) { h.state.Store(&st) }

// closeAll closes every socket with code: after a change of the database's
// history, each app resumes and learns whether its cursor still holds.
func (h *Hub) closeAll(code ws.StatusCode, reason string) {
	h.mu.RLock()
	var all []*socket
	for _, ss := range h.users {
		all = append(all, ss...)
	}
	h.mu.RUnlock()
	for _, s := range all {
		s.close(code, reason)
	}
}

// Metrics returns the hub's metrics.
func (h *Hub) Metrics() *Metrics { return h.metrics }
