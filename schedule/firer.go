package schedule

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/startstop"
	"github.com/spoolcast/spoolcast/internal/weekly"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// DB is what the firer needs of Postgres: a pgxpool.Pool.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a Firer.
type Config struct {
	// DB is Postgres. Required.
	DB DB
	// Fired is called after a step that created notifications or queued
	// pushes committed: the caller wakes the live readers and dispatchers
	// (an ingest.Waker). Optional.
	Fired func()
	// Wake makes a pass run at once (ingest committed a scheduled event).
	Wake <-chan struct{}
	// Interval is how often due work is looked for. Default 1s.
	Interval time.Duration
	// BatchSize is how many of the first due rows one statement looks at:
	// it moves every row of their events, so up to an event's recipients
	// (1,000) more than this. Default 2000.
	BatchSize int
	// Clock says what is due. Default the wall clock.
	Clock clock.Clock
	// Metrics: default not exported. Logger: default slog.Default().
	Metrics *Metrics
	Logger  *slog.Logger
}

// Firer fires due work; Start runs it.
type Firer struct {
	cfg     Config
	log     *slog.Logger
	failLog *lograte.Limiter
	svc     startstop.Service
}

// gaugesInterval is how often the due-work gauges are refreshed.
const gaugesInterval = 15 * time.Second

// New returns a firer.
func New(cfg Config) (*Firer, error) {
	if cfg.DB == nil {
		return nil, errors.New("schedule: a database is required")
	}
	if cfg.Interval < 0 || cfg.BatchSize < 0 {
		return nil, errors.New("schedule: interval and batch size must not be negative")
	}
	cfg.Interval = cmp.Or(cfg.Interval, time.Second)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 2000)
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Firer{cfg: cfg, log: cfg.Logger.With("component", "schedule"), failLog: lograte.New(10 * time.Second)}, nil
}

// Start runs the firer in the background. Stop stops it: a step is one
// statement, so stopping mid-pass leaves nothing half done.
func (f *Firer) Start(ctx context.Context) {
	f.svc.Start(ctx, f.loop, f.gauges)
}

// Stop stops the firer and waits for its pass in flight.
func (f *Firer) Stop(ctx context.Context) error { return f.svc.Stop(ctx) }

func (f *Firer) loop(ctx context.Context) {
	startstop.Every(ctx, startstop.Schedule{Interval: f.cfg.Interval, Wake: f.cfg.Wake, Clock: f.cfg.Clock}, func(ctx context.Context) bool {
		more, err := f.pass(ctx)
		if err != nil && ctx.Err() == nil {
			f.failLog.Do(func(suppressed int64) {
				f.log.Error("fire due work; trying again", "err", err, "suppressed", suppressed)
			})
		}
		return more && err == nil
	})
}

// Pass fires one batch of each kind of due work and reports how many rows
// it moved. Tests call it directly, on their clock.
func (f *Firer) Pass(ctx context.Context) (scheduled, digests int, err error) {
	now := f.cfg.Clock.Now()
	scheduled, err = f.fireScheduled(ctx, now)
	if err != nil {
		return scheduled, 0, err
	}
	digests, err = f.fireDigests(ctx, now)
	return scheduled, digests, err
}

// pass is one Pass; more means a batch was full and more may be due.
func (f *Firer) pass(ctx context.Context) (more bool, err error) {
	s, d, err := f.Pass(ctx)
	return s >= f.cfg.BatchSize || d == f.cfg.BatchSize, err
}

// fireScheduled moves the scheduled notifications due at now into the feed
// and the push queue, in one statement: the notification exists, with its
// push work, exactly when its scheduled row is gone. It moves whole events:
// the events of the first due rows (up to the batch), each only if its lock
// (ingest.EventLockClass) is free, and then every row of each, so an event is
// never split across statements, passes or replicas, nor between the firer
// and a cancellation (which takes the same lock, and marks every row). A row
// a cancellation marked after this statement's snapshot is skipped by the
// delete's re-check of cancelled_at. created_at is Postgres's time of the
// move, so it appears at the top of the feed as if ingested then, and its
// transaction id puts it in the live stream's commit order like any other.
func (f *Firer) fireScheduled(ctx context.Context, now time.Time) (int, error) {
	var moved, created int
	var lateness float64
	run := func() error {
		return f.cfg.DB.QueryRow(ctx, `WITH events AS MATERIALIZED (
				SELECT DISTINCT producer, idempotency_key FROM (
					SELECT producer, idempotency_key FROM scheduled_notifications
					WHERE send_at <= greatest(now(), $1) AND cancelled_at IS NULL
					ORDER BY send_at, id LIMIT $2) first_due
			),
			-- Materialized, so that each lock is tried once per event, and
			-- held to the end of the statement's transaction.
			locked AS MATERIALIZED (
				SELECT producer, idempotency_key FROM events
				WHERE pg_try_advisory_xact_lock($3, `+ingest.EventLockKey+`)
			),
			due AS (
				DELETE FROM scheduled_notifications s USING locked l
				WHERE s.producer = l.producer AND s.idempotency_key = l.idempotency_key AND s.cancelled_at IS NULL
				RETURNING s.*
			),
			inserted AS (
				INSERT INTO notifications (id, user_id, received_at, type, category, title, body, data, producer, idempotency_key, notification_key, run_id)
				SELECT id, user_id, received_at, type, category, title, body, data, producer, idempotency_key, notification_key, run_id
				FROM due
				ORDER BY send_at, id
				RETURNING id, created_at, user_id, category
			),
			queued AS (
				INSERT INTO push_queue (notification_id, notification_created_at, user_id, category, priority, digest_key, digest_window)
				SELECT n.id, n.created_at, n.user_id, n.category, d.priority, d.digest_key, d.digest_window
				FROM inserted n JOIN due d ON d.id = n.id
			)
			SELECT (SELECT count(*) FROM due), (SELECT count(*) FROM inserted),
			       coalesce((SELECT extract(epoch FROM greatest(now(), $1) - min(send_at)) FROM due), 0)`,
			now, f.cfg.BatchSize, ingest.EventLockClass).Scan(&moved, &created, &lateness)
	}
	err := run()
	if weekly.NoPartition(err) {
		if _, err = weekly.Ensure(ctx, f.cfg.DB, "notifications", time.Time{}); err == nil {
			err = run()
		}
	}
	if err != nil {
		return 0, fmt.Errorf("fire scheduled notifications: %w", err)
	}
	f.count(KindScheduled, created, lateness)
	return moved, nil
}

// fireDigests queues the one push of each digest whose window closed by
// now, as a push of its latest notification that says how many it gathers;
// the digest's row goes in the same statement, so its push is queued once.
func (f *Firer) fireDigests(ctx context.Context, now time.Time) (int, error) {
	var moved int
	var lateness float64
	err := f.cfg.DB.QueryRow(ctx, `WITH due AS (
			DELETE FROM push_digests d USING (
				SELECT user_id, digest_key FROM push_digests WHERE window_end <= greatest(now(), $1)
				ORDER BY window_end LIMIT $2 FOR UPDATE SKIP LOCKED) t
			WHERE d.user_id = t.user_id AND d.digest_key = t.digest_key
			RETURNING d.*
		),
		queued AS (
			INSERT INTO push_queue (notification_id, notification_created_at, user_id, category, priority, digest_key, digest_count, broadcast)
			SELECT notification_id, notification_created_at, user_id, category, priority, digest_key, count, broadcast FROM due
			ON CONFLICT (notification_id) DO NOTHING
		)
		SELECT count(*), coalesce(extract(epoch FROM greatest(now(), $1) - min(window_end)), 0) FROM due`,
		now, f.cfg.BatchSize).Scan(&moved, &lateness)
	if err != nil {
		return 0, fmt.Errorf("fire digests: %w", err)
	}
	f.count(KindDigest, moved, lateness)
	return moved, nil
}

// count records n rows of kind fired, the oldest lateness seconds after its
// time, and wakes the readers and dispatchers.
func (f *Firer) count(kind string, n int, lateness float64) {
	if n == 0 {
		return
	}
	f.cfg.Metrics.fired.WithLabelValues(kind).Add(float64(n))
	f.cfg.Metrics.lateness.WithLabelValues(kind).Observe(max(0, lateness))
	if f.cfg.Fired != nil {
		f.cfg.Fired()
	}
}

// gauges refreshes the due-work gauges: what waits, and how late the
// oldest due row is (0 when nothing due waits).
func (f *Firer) gauges(ctx context.Context) {
	startstop.Every(ctx, startstop.Schedule{Interval: gaugesInterval, Clock: f.cfg.Clock}, func(ctx context.Context) bool {
		_ = f.refreshGauges(ctx)
		return false
	})
}

// refreshGauges reads the due-work gauges now.
func (f *Firer) refreshGauges(ctx context.Context) error {
	var scheduled, digests int64
	var schedLate, digestLate float64
	err := f.cfg.DB.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM scheduled_notifications),
			(SELECT count(*) FROM push_digests),
			coalesce((SELECT extract(epoch FROM greatest(now(), $1) - send_at) FROM scheduled_notifications
			          WHERE send_at <= greatest(now(), $1) ORDER BY send_at, id LIMIT 1), 0),
			coalesce((SELECT extract(epoch FROM greatest(now(), $1) - window_end) FROM push_digests
			          WHERE window_end <= greatest(now(), $1) ORDER BY window_end LIMIT 1), 0)`,
		f.cfg.Clock.Now()).Scan(&scheduled, &digests, &schedLate, &digestLate)
	if err != nil {
		return err
	}
	f.cfg.Metrics.queued.WithLabelValues(KindScheduled).Set(float64(scheduled))
	f.cfg.Metrics.queued.WithLabelValues(KindDigest).Set(float64(digests))
	f.cfg.Metrics.overdue.WithLabelValues(KindScheduled).Set(max(0, schedLate))
	f.cfg.Metrics.overdue.WithLabelValues(KindDigest).Set(max(0, digestLate))
	return nil
}
