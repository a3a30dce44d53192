package central

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/pghistory"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// The reasons a feed read went where it went
// (spoolcast_feed_reads_total{target, reason}).
const (
	// On the replica.
	reasonCurrent     = "current"        // it lags less than MaxReplicaLag; the read carried no write position
	reasonReplayed    = "write_replayed" // it had replayed the write position the read carried
	reasonPrimaryDown = "primary_down"   // it lags more, but the primary does not answer either
	// On the primary.
	reasonNoReplica      = "no_replica"       // no ReadDB is configured
	reasonReplicaDown    = "replica_down"     // it does not answer (or has not been measured yet)
	reasonReplicaLagging = "replica_lagging"  // it lags more than MaxReplicaLag
	reasonUnreplayed     = "unreplayed_write" // it has not replayed the caller's last write (or the position was not one)
	reasonReplicaFailed  = "replica_failed"   // the read failed on it, and was asked again of the primary
)

// The probes, one cheap statement on each server. The primary's write
// position, not its insert position: at rest the two differ by a page
// header when the last record ended a page, which a standby never replays.
// A "replica" out of recovery (promoted, or the primary itself) reports its
// own position: it is as current as a server can be. Both name their
// database system, which a standby shares with its primary.
const (
	primaryProbe = `SELECT pg_current_wal_lsn()::text, ` + pghistory.System
	replicaProbe = `SELECT pg_is_in_recovery(),
		(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text, ` + pghistory.System
)

// errNotACopy: the read replica is another database than the primary.
var errNotACopy = errors.New("the read replica is not a copy of the primary (another database system identifier): check --database-read-url; reads go to the primary")

// maxSamples bounds the primary positions kept while a standby does not
// replay them: an hour of one a second. Past it the newest is overwritten,
// which keeps the oldest, and so the lag, right.
const maxSamples = 3600

// replicaMonitor measures how far the read replica lags behind the primary,
// once an interval, and says where a read may go.
//
// The lag is measured from both ends: each pass reads the primary's WAL
// position, then the replica's replay position; the lag is the age of the
// oldest primary position the replica has not replayed (0 when it has
// replayed them all). now() - pg_last_xact_replay_timestamp() alone,
// measured on the standby, reads an idle primary as a standby falling
// further behind every second, and the standby's own receive and replay
// positions cannot tell a stalled stream from an idle primary.
type replicaMonitor struct {
	svc      startstop.Service
	primary  DB
	replica  ReadDB
	interval time.Duration
	maxLag   time.Duration
	clock    clock.Clock
	log      *slog.Logger
	errLog   *lograte.Limiter
	lag      prometheus.Gauge

	mu        sync.Mutex
	system    int64    // the primary's database system identifier, once read
	samples   []sample // primary positions the replica had not replayed at the last pass, oldest first
	up        bool     // the replica answered the last pass, and no read since failed to reach it
	measured  time.Time
	primaryUp bool
}

// sample is a position the primary had reached by a time.
type sample struct {
	at  time.Time
	pos lsn
}

func newReplicaMonitor(primary DB, replica ReadDB, interval, maxLag time.Duration, clk clock.Clock, lag prometheus.Gauge, log *slog.Logger) *replicaMonitor {
	return &replicaMonitor{
		primary: primary, replica: replica, interval: interval, maxLag: maxLag, clock: clk, lag: lag,
		log: log, errLog: lograte.New(time.Minute),
		// Until the first pass says otherwise, the primary is taken to
		// answer: reads go to it.
		primaryUp: true,
	}
}

// Start runs a pass every interval, the first at once. A pass is two small
// statements, so it does not back off: its purpose is to notice within an
// interval that a replica came back or fell behind.
func (m *replicaMonitor) Start(ctx context.Context) {
	m.svc.Start(ctx, func(ctx context.Context) {
		startstop.Every(ctx, startstop.Schedule{Interval: m.interval, Clock: m.clock}, func(ctx context.Context) bool {
			m.pass(ctx)
			return false
		})
	})
}

// Stop ends the passes; it is safe to call twice.
func (m *replicaMonitor) Stop(ctx context.Context) error { return m.svc.Stop(ctx) }

// pass measures the primary's position, then the replica's, each within its
// own timeout: a primary that hangs (rather than refuses) must not make the
// replica look down too.
func (m *replicaMonitor) pass(parent context.Context) {
	probe := func(db interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, sql string, dest ...any) error {
		ctx, cancel := context.WithTimeout(parent, max(m.interval, 2*time.Second)) // a busy host answers a trivial probe within this
		defer cancel()
		return db.QueryRow(ctx, sql).Scan(dest...)
	}
	asked := m.clock.Now()
	var primaryPos, replicaPos *string
	var primarySys, replicaSys int64
	primaryErr := probe(m.primary, primaryProbe, &primaryPos, &primarySys)
	var inRecovery bool
	replicaErr := probe(m.replica, replicaProbe, &inRecovery, &replicaPos, &replicaSys)
	if parent.Err() != nil {
		return // stopping: what failed says nothing of the servers
	}
	now := m.clock.Now()
	m.mu.Lock()
	if primaryErr == nil {
		m.system = primarySys
	}
	if replicaErr == nil && m.system != 0 && replicaSys != m.system {
		replicaErr = errNotACopy
	}
	m.primaryUp = primaryErr == nil
	if p, err := parseLSNPtr(primaryPos); primaryErr == nil && err == nil {
		m.addSample(sample{at: asked, pos: p})
	}
	m.up = replicaErr == nil
	if replicaErr == nil {
		m.measured = now
		replayed, _ := parseLSNPtr(replicaPos) // NULL: nothing replayed yet
		if !inRecovery {
			m.samples = m.samples[:0]
		}
		m.dropReplayed(replayed)
	}
	lag := m.lagAt(now)
	m.mu.Unlock()
	m.lag.Set(lag.Seconds())
	if primaryErr != nil || replicaErr != nil {
		m.errLog.Do(func(suppressed int64) {
			m.log.Warn("could not measure the read replica's lag", "primary_err", primaryErr, "replica_err", replicaErr, "suppressed", suppressed)
		})
	}
}

func parseLSNPtr(s *string) (lsn, error) {
	if s == nil {
		return 0, errBadLSN
	}
	return parseLSN(*s)
}

// addSample keeps a primary position newer than the last one kept. One
// older than it means another primary (a failover that lost the tail): what
// the old one wrote will never be replayed, so it is forgotten.
func (m *replicaMonitor) addSample(s sample) {
	if n := len(m.samples); n > 0 {
		switch last := m.samples[n-1].pos; {
		case s.pos == last:
			return // the primary has not moved: the older sample says more
		case s.pos < last:
			m.samples = m.samples[:0]
		}
	}
	if len(m.samples) == maxSamples {
		m.samples[maxSamples-1] = s
		return
	}
	m.samples = append(m.samples, s)
}

// dropReplayed forgets the primary positions the replica has replayed.
func (m *replicaMonitor) dropReplayed(replayed lsn) {
	i := 0
	for i < len(m.samples) && m.samples[i].pos <= replayed {
		i++
	}
	m.samples = append(m.samples[:0], m.samples[i:]...)
}

// lagAt is the age at now of the oldest primary position the replica had
// not replayed at the last pass.
func (m *replicaMonitor) lagAt(now time.Time) time.Duration {
	if len(m.samples) == 0 {
		return 0
	}
	return now.Sub(m.samples[0].at)
}

// route says whether a read may go to the replica, and why. A replica not
// measured for longer than MaxReplicaLag (its probes hang) counts as down.
func (m *replicaMonitor) route() (replica bool, reason string) {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case !m.up || now.Sub(m.measured) > m.maxLag+m.interval:
		return false, reasonReplicaDown
	case m.lagAt(now) <= m.maxLag:
		return true, reasonCurrent
	case !m.primaryUp:
		return true, reasonPrimaryDown
	}
	return false, reasonReplicaLagging
}

// unreachable notes that a read could not reach the replica: reads go to
// the primary until a pass reaches it again, rather than each waiting to
// connect to it.
func (m *replicaMonitor) unreachable() {
	m.mu.Lock()
	m.up = false
	m.mu.Unlock()
}

// ReadDB is what central needs of a read replica: a pgxpool.Pool.
type ReadDB interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
