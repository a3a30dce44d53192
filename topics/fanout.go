package topics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/startstop"
	"github.com/spoolcast/spoolcast/internal/weekly"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// Defaults of FanoutConfig.
const (
	DefaultBatchSize = 1000
	DefaultBatchTime = 25 * time.Millisecond
	// MinBatch is the fewest members a batch shrinks to.
	MinBatch         = 50
	DefaultRangeSize = 50_000
	// DefaultPushRate is the topic pushes per second a deployment sends to
	// Expo: below Expo's 600 per project, so direct pushes keep room.
	DefaultPushRate = 500
)

// FanoutConfig configures a Fanout.
type FanoutConfig struct {
	// DB is Postgres: a pgxpool.Pool. Required.
	DB DB
	// Written is called after a batch that created notifications
	// committed: the caller wakes the live readers and the dispatchers (an
	// ingest.Waker). Optional.
	Written func()
	// Workers is how many batches this replica writes at once. Default 1.
	Workers int
	// WatchOnly runs no workers, only the gauges (a replica with
	// --topic-fanout-workers 0): the alerts see fan-outs that no replica
	// writes.
	WatchOnly bool
	// BatchSize is the most members one transaction writes. Default 1000.
	BatchSize int
	// BatchTime is how long a batch's transaction should take at most: a
	// batch halves (down to MinBatch members) while one takes longer and
	// doubles back while one takes under half of it. Every transaction
	// in flight holds the live stream back (it sends in commit order), so
	// this bounds what a fan-out adds to direct notifications' commit →
	// frame. Default 25ms.
	BatchTime time.Duration
	// RangeSize is the members per range a fan-out is split into when it
	// starts: replicas share a fan-out range by range. Default 50,000.
	RangeSize int
	// PushRate paces topic pushes to Expo devices, for the whole
	// deployment: each batch's pushes are due one device's share of a
	// second apart, after the batches before it. Negative: no pacing.
	// Default DefaultPushRate.
	PushRate int
	// Interval is how often an idle worker looks for work: a fan-out
	// starts within it of its due time. Default 1s. (Ingest's wake-ups
	// come at every commit; a worker woken by each would spend more on
	// looking than broadcasts are worth.)
	Interval time.Duration
	// Clock says what is due (with Postgres's): default the wall clock.
	Clock   clock.Clock
	Metrics *Metrics
	Logger  *slog.Logger
}

// Fanout writes topic events' members' notifications: Start runs its
// workers; Step is one unit of work, for tests.
type Fanout struct {
	cfg     FanoutConfig
	log     *slog.Logger
	failLog *lograte.Limiter
	svc     startstop.Service
	// batch is the members the next batch writes: BatchSize, or less
	// while batches take longer than BatchTime.
	batch atomic.Int64
}

// NewFanout returns a Fanout.
func NewFanout(cfg FanoutConfig) (*Fanout, error) {
	if cfg.DB == nil {
		return nil, errors.New("topics: a database is required")
	}
	if cfg.Workers < 0 || cfg.BatchSize < 0 || cfg.RangeSize < 0 || cfg.Interval < 0 || cfg.BatchTime < 0 {
		return nil, errors.New("topics: workers, batch size, range size and interval must not be negative")
	}
	cfg.Workers = cmp.Or(cfg.Workers, 1)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	cfg.BatchTime = cmp.Or(cfg.BatchTime, DefaultBatchTime)
	cfg.RangeSize = cmp.Or(cfg.RangeSize, DefaultRangeSize)
	cfg.PushRate = cmp.Or(cfg.PushRate, DefaultPushRate)
	cfg.Interval = cmp.Or(cfg.Interval, time.Second)
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	f := &Fanout{cfg: cfg, log: cfg.Logger.With("component", "topics"), failLog: lograte.New(10 * time.Second)}
	f.batch.Store(int64(cfg.BatchSize))
	return f, nil
}

// Start runs the workers in the background. Stop stops them: a batch is one
// transaction, so stopping mid-fan-out leaves its progress at the last
// commit, where any replica resumes it.
func (f *Fanout) Start(ctx context.Context) { f.svc.Start(ctx, f.loops()...) }

// loops are what Start runs: the gauges, and the workers unless WatchOnly.
func (f *Fanout) loops() []func(context.Context) {
	loops := []func(context.Context){f.gauges}
	if !f.cfg.WatchOnly {
		for range f.cfg.Workers {
			loops = append(loops, f.loop)
		}
	}
	return loops
}

// Stop stops the workers and waits for their batches in flight.
func (f *Fanout) Stop(ctx context.Context) error { return f.svc.Stop(ctx) }

func (f *Fanout) loop(ctx context.Context) {
	startstop.Every(ctx, startstop.Schedule{Interval: f.cfg.Interval, Clock: f.cfg.Clock}, func(ctx context.Context) bool {
		did, err := f.Step(ctx)
		if err != nil && ctx.Err() == nil {
			f.failLog.Do(func(suppressed int64) {
				f.log.Error("write a topic fan-out; trying again", "err", err, "suppressed", suppressed)
			})
		}
		return did && err == nil
	})
}

// Step does one unit of work and reports whether it found any: it starts a
// due fan-out (splitting its members into ranges), or writes one batch of
// a running one's range, or completes a fan-out whose ranges are done.
func (f *Fanout) Step(ctx context.Context) (bool, error) {
	if did, err := f.startOne(ctx); did || err != nil {
		return did, err
	}
	if did, err := f.writeBatch(ctx); did || err != nil {
		return did, err
	}
	n, err := f.completeDone(ctx, 0)
	return n > 0, err
}

// Drain steps until no work is left: for tests and the benchmark.
func (f *Fanout) Drain(ctx context.Context) error {
	for {
		did, err := f.Step(ctx)
		if err != nil || !did {
			return err
		}
	}
}

// startOne starts the first due pending fan-out no other worker holds: it
// splits its members (subscribed by the event's acceptance) into ranges of
// about RangeSize in user order and marks it running, in one transaction.
// A cancellation takes the fan-out's row lock too, so it finds the fan-out
// pending or running, never between.
func (f *Fanout) startOne(ctx context.Context) (bool, error) {
	var started bool
	err := pgx.BeginFunc(ctx, f.cfg.DB, func(tx pgx.Tx) error {
		var id int64
		var topic string
		var accepted time.Time
		err := tx.QueryRow(ctx, `SELECT id, topic, accepted_at FROM topic_fanouts
			WHERE state = 'pending' AND due_at <= greatest(now(), $1)
			ORDER BY due_at, id LIMIT 1 FOR UPDATE SKIP LOCKED`, f.cfg.Clock.Now()).Scan(&id, &topic, &accepted)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		// Every RangeSize-th member is a range's last; the index on
		// (topic, user_id) is read once, in order.
		if _, err := tx.Exec(ctx, `WITH m AS (
				SELECT user_id, row_number() OVER (ORDER BY user_id) AS n FROM topic_members
				WHERE topic = $2 AND subscribed_at <= $3
			),
			his AS (
				SELECT user_id AS hi, n FROM m WHERE n % $4 = 0
				UNION ALL SELECT NULL, (SELECT count(*) FROM m)
			),
			ranges AS (
				SELECT coalesce(lag(hi) OVER w, '') AS lo, hi, n - coalesce(lag(n) OVER w, 0) AS members
				FROM his WINDOW w AS (ORDER BY n, hi NULLS LAST)
			)
			INSERT INTO topic_fanout_ranges (fanout_id, lo, hi, after, members)
			SELECT $1, lo, hi, lo, members FROM ranges`, id, topic, accepted, f.cfg.RangeSize); err != nil {
			return fmt.Errorf("split fan-out %d: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE topic_fanouts SET state = 'running', started_at = now() WHERE id = $1`, id); err != nil {
			return err
		}
		started = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("start a topic fan-out: %w", err)
	}
	if started {
		f.cfg.Metrics.started.Inc()
	}
	return started, nil
}

// batchSQL writes one batch of a range: the next members after the range's
// progress, in user order, subscribed by the event's acceptance and still
// members now; a notification key each, claimed ON CONFLICT DO NOTHING, so
// a member who has the event already (a recipient, a member of another of
// its topics, a batch written before a crash) is skipped; their
// notifications and push work; and the range's progress, all in one
// statement. Push work is queued only for members with an enabled device:
// a broadcast's members without one would each cost the dispatcher a
// queue row and a "no enabled device" row in the delivery log, ahead of
// direct pushes. $4 is when the batch's first paced push is due, $5 the
// seconds between two paced pushes (NULL: no pacing); a member with n Expo
// devices takes n turns (browsers' pushes go to many services, unpaced). The range's topic, progress, end and acceptance come as
// values ($6–$9; the %s is the range's end), never joined: so the members
// are read from an index at the range's progress, not scanned from the
// topic's first member at every batch (which made a batch's cost grow with
// the fan-out's progress).
const batchSQL = `WITH f AS (SELECT * FROM topic_fanouts WHERE id = $1),
m AS MATERIALIZED (
    SELECT tm.user_id FROM topic_members tm
    WHERE tm.topic = $6 AND tm.user_id > $7 AND %s AND tm.subscribed_at <= $9
    ORDER BY tm.user_id LIMIT $3
),
keyed AS (
    SELECT m.user_id, octet_length(f.producer) || ':' || f.producer || ':' ||
           octet_length(f.idempotency_key) || ':' || f.idempotency_key || ':' || m.user_id AS key
    FROM m, f
),
claimed AS (
    INSERT INTO idempotency_keys (key, request_hash, claimed_at)
    SELECT k.key, f.hash, now() FROM keyed k, f ORDER BY k.key
    ON CONFLICT DO NOTHING
    RETURNING key
),
new AS MATERIALIZED (
    SELECT nextval('notification_ids') AS id, k.user_id, k.key
    FROM keyed k JOIN claimed c ON c.key = k.key
    ORDER BY k.user_id
),
paced AS (
    SELECT n.id, n.user_id, d.devices,
           CASE WHEN d.expo > 0 AND $5::float8 IS NOT NULL
                THEN $4::timestamptz + interval '1 second' * $5::float8 * (sum(d.expo) OVER (ORDER BY n.user_id) - d.expo)
                ELSE now() END AS due_at
    FROM new n
    CROSS JOIN LATERAL (SELECT count(*) AS devices, count(*) FILTER (WHERE provider = 'expo') AS expo
                        FROM devices WHERE user_id = n.user_id AND enabled) d
),
inserted AS (
    INSERT INTO notifications (id, user_id, received_at, type, category, title, body, data, producer, idempotency_key, notification_key, run_id, topic)
    SELECT n.id, n.user_id, f.received_at, f.type, f.category, f.title, f.body, f.data, f.producer, f.idempotency_key, n.key, f.run_id, f.topic
    FROM new n, f ORDER BY n.id
),
queued AS (
    INSERT INTO push_queue (notification_id, notification_created_at, user_id, category, priority, digest_key, digest_window, due_at, broadcast)
    SELECT p.id, now(), p.user_id, f.category, f.priority, f.digest_key, f.digest_window, greatest(p.due_at, now()), true
    FROM paced p, f WHERE p.devices > 0
),
progress AS (
    UPDATE topic_fanout_ranges r SET
        after = coalesce((SELECT max(user_id) FROM m), r.after),
        done = (SELECT count(*) FROM m) < $3,
        written = r.written + (SELECT count(*) FROM new),
        skipped = r.skipped + (SELECT count(*) FROM m) - (SELECT count(*) FROM new),
        updated_at = now()
    WHERE r.fanout_id = $1 AND r.lo = $2
    RETURNING r.done
)
SELECT (SELECT count(*) FROM m), (SELECT count(*) FROM new), (SELECT done FROM progress)`

// The batch statement for a bounded range and for the last, open one: each
// range end is an index bound in every plan, generic or custom (an "$8 IS
// NULL OR …" would bound nothing in a generic plan, and the last batch of
// each range would read the rest of the topic).
var (
	batchBoundedSQL = fmt.Sprintf(batchSQL, "tm.user_id <= $8")
	batchOpenSQL    = fmt.Sprintf(batchSQL, "$8::text IS NULL")
)

// writeBatch writes one batch of the first open range no other worker
// holds. The range's row lock keeps other workers off it until the batch
// commits; the event's lock, taken shared, keeps a cancellation off the
// event until then, so a cancellation counts every batch it did not stop.
func (f *Fanout) writeBatch(ctx context.Context) (bool, error) {
	var found bool
	var members, written int
	var done bool
	var fanout int64
	size := int(f.batch.Load())
	began := time.Now()
	run := func() error {
		found, members, written, done = false, 0, 0, false
		return pgx.BeginFunc(ctx, f.cfg.DB, func(tx pgx.Tx) error {
			var lo, topic, after string
			var hi *string
			var accepted time.Time
			err := tx.QueryRow(ctx, `SELECT r.fanout_id, r.lo, fo.topic, r.after, r.hi, fo.accepted_at
				FROM topic_fanout_ranges r JOIN topic_fanouts fo ON fo.id = r.fanout_id
				WHERE NOT r.done AND fo.state = 'running'
				ORDER BY r.fanout_id, r.lo LIMIT 1 FOR UPDATE OF r SKIP LOCKED`).Scan(&fanout, &lo, &topic, &after, &hi, &accepted)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			if err != nil {
				return err
			}
			found = true
			var locked bool
			if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock_shared($2, `+ingest.EventLockKey+`) FROM topic_fanouts WHERE id = $1`,
				fanout, ingest.EventLockClass).Scan(&locked); err != nil {
				return err
			}
			if !locked {
				// A cancellation holds the event: it decides first, and
				// this worker looks again at its next interval.
				found = false
				return nil
			}
			// After the lock, this statement's snapshot sees a
			// cancellation that committed before it.
			var running bool
			if err := tx.QueryRow(ctx, `SELECT state = 'running' FROM topic_fanouts WHERE id = $1`, fanout).Scan(&running); err != nil {
				return err
			}
			if !running {
				return nil
			}
			stmt, turnsStmt := batchBoundedSQL, turnsBoundedSQL
			if hi == nil {
				stmt, turnsStmt = batchOpenSQL, turnsOpenSQL
			}
			var paceStart *time.Time
			var paceStep *float64
			if f.cfg.PushRate > 0 {
				var turns int
				if err := tx.QueryRow(ctx, turnsStmt, topic, after, hi, accepted, size).Scan(&turns); err != nil {
					return err
				}
				if paceStart, paceStep, err = f.pace(ctx, turns); err != nil {
					return err
				}
			}
			return tx.QueryRow(ctx, stmt, fanout, lo, size, paceStart, paceStep, topic, after, hi, accepted).Scan(&members, &written, &done)
		})
	}
	err := run()
	if weekly.NoPartition(err) {
		if _, err = weekly.Ensure(ctx, f.cfg.DB, "notifications", time.Time{}); err == nil {
			err = run()
		}
	}
	if err != nil {
		return false, fmt.Errorf("write a topic fan-out batch: %w", err)
	}
	if members > 0 {
		f.resize(size, members, time.Since(began))
	}
	if written > 0 {
		f.cfg.Metrics.written.Add(float64(written))
		if f.cfg.Written != nil {
			f.cfg.Written()
		}
	}
	if skipped := members - written; skipped > 0 {
		f.cfg.Metrics.skipped.Add(float64(skipped))
	}
	if done {
		if _, err := f.completeDone(ctx, fanout); err != nil {
			return true, err
		}
	}
	return found, nil
}

// completeSQL completes the running fan-outs without an open range (fanout
// $1, or any with $1 = 0): their state, and one topic.fanout.completed
// webhook each to every endpoint that takes it, in one statement. The row
// lock of the update makes it once: of two workers finishing a fan-out's
// last ranges, the later one to commit completes it, the other finds it
// completed.
const completeSQL = `WITH done AS (
    UPDATE topic_fanouts fo SET state = 'completed', ended_at = now()
    WHERE fo.state = 'running' AND ($1 = 0 OR fo.id = $1)
      AND NOT EXISTS (SELECT 1 FROM topic_fanout_ranges r WHERE r.fanout_id = fo.id AND NOT r.done)
    RETURNING fo.*
),
counted AS (
    SELECT d.*, c.written, c.skipped FROM done d,
    LATERAL (SELECT coalesce(sum(written), 0)::int8 AS written, coalesce(sum(skipped), 0)::int8 AS skipped
             FROM topic_fanout_ranges WHERE fanout_id = d.id) c
),
hooks AS (
    INSERT INTO webhook_deliveries (endpoint_id, type, payload)
    SELECT e.id, 'topic.fanout.completed', spoolcast_webhook_body('topic.fanout.completed', c.ended_at, jsonb_build_object(
        'topic', c.topic, 'producer', c.producer, 'idempotency_key', c.idempotency_key,
        'written', c.written, 'skipped', c.skipped, 'accepted_at', spoolcast_rfc3339(c.accepted_at),
        'started_at', spoolcast_rfc3339(c.started_at), 'completed_at', spoolcast_rfc3339(c.ended_at)))
    FROM counted c JOIN webhook_endpoints e ON e.enabled AND 'topic.fanout.completed' = ANY (e.events)
    ORDER BY c.id
)
SELECT coalesce(array_agg(extract(epoch FROM ended_at - greatest(due_at, created_at))), '{}') FROM counted`

// completeDone completes fanout (or, with 0, every running fan-out whose
// ranges are all done: one a worker finished but crashed before
// completing) and reports how many it completed.
func (f *Fanout) completeDone(ctx context.Context, fanout int64) (int, error) {
	var took []float64
	if err := f.cfg.DB.QueryRow(ctx, completeSQL, fanout).Scan(&took); err != nil {
		return 0, fmt.Errorf("complete topic fan-outs: %w", err)
	}
	for _, s := range took {
		f.cfg.Metrics.completed.Observe(s)
	}
	return len(took), nil
}

// turnsSQL counts the Expo devices of the members a batch will read: the
// turns it reserves, so that the pace advances by the pushes a batch makes,
// not by its members (most of a broadcast's may have no phone). A member
// who turns out to have the event already leaves a turn unused: a gap,
// never a burst. Bounded and open variants, as for batchSQL.
const turnsSQL = `SELECT count(*) FROM (
    SELECT tm.user_id FROM topic_members tm
    WHERE tm.topic = $1 AND tm.user_id > $2 AND %s AND tm.subscribed_at <= $4
    ORDER BY tm.user_id LIMIT $5
) m JOIN devices d ON d.user_id = m.user_id AND d.enabled AND d.provider = 'expo'`

var (
	turnsBoundedSQL = fmt.Sprintf(turnsSQL, "tm.user_id <= $3")
	turnsOpenSQL    = fmt.Sprintf(turnsSQL, "$3::text IS NULL")
)

// pace reserves a batch's turns (its Expo pushes), in a statement of its
// own on another connection, so that batches of other fan-outs never wait
// on the pace's row while this one writes: turns a failed batch leaves
// unused are a gap in the pace, never a burst. nil, nil: none to pace.
func (f *Fanout) pace(ctx context.Context, turns int) (*time.Time, *float64, error) {
	if f.cfg.PushRate <= 0 || turns == 0 {
		return nil, nil, nil
	}
	step := 1 / float64(f.cfg.PushRate)
	var start time.Time
	if err := f.cfg.DB.QueryRow(ctx, `UPDATE topic_push_pace SET next_at = greatest(next_at, now()) + interval '1 second' * ($1::float8 * $2)
		RETURNING next_at - interval '1 second' * ($1::float8 * $2)`, step, turns).Scan(&start); err != nil {
		return nil, nil, fmt.Errorf("pace topic pushes: %w", err)
	}
	return &start, &step, nil
}

// resize sets the next batch's size from how long this one (size members
// asked, members written or skipped) took.
func (f *Fanout) resize(size, members int, took time.Duration) {
	switch {
	case took > f.cfg.BatchTime && size > MinBatch:
		f.batch.Store(int64(max(MinBatch, size/2)))
	case took < f.cfg.BatchTime/2 && members == size && size < f.cfg.BatchSize:
		f.batch.Store(int64(min(f.cfg.BatchSize, size*2)))
	}
}
