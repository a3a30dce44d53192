// Command fanout measures a topic fan-out on this machine: one event to a
// topic of a million members written by topics.Fanout instances (replicas)
// sharing it, against the same rows written by one set-based statement, and
// what it does to direct events' latency meanwhile.
//
//	go run ./benchmarks/fanout                    # 1,000,000 members
//	go run ./benchmarks/fanout -members 50000     # a quick check
//
// It starts a durable Postgres cluster of its own, migrates it and fills
// the topic through the topics store, then runs, with a CHECKPOINT and a
// VACUUM ANALYZE between phases so that each starts alike:
//
//  1. the fill of the topic;
//  2. direct events alone (one recipient each, open loop at -direct-rate a
//     second for 10 s): the baseline of their latency and WAL;
//  3. one topic event fanned out by -workers Fanout instances (Workers: 1
//     each, as replicas would), the same direct load alongside;
//  4. the same rows for a second event in ONE statement, with nothing
//     alongside: the raw cost of the writes, without ranges, batches,
//     pacing or progress;
//  5. a maintenance pass (one that creates partitions, i.e. DDL) during a
//     second fan-out, which is then cancelled;
//  6. 10 million members on paper, from the figures measured.
//
// Direct latency is open loop: each event has a due time on a fixed
// schedule and its latency runs from that due time to Ingest's return (its
// commit), so a slow commit delays none of the due times behind it and the
// queueing it causes is counted.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/benchmarks/internal/benchfmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/lifecycle"
	"github.com/spoolcast/spoolcast/migrations"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/topics"
)

const (
	topic    = "everyone"
	producer = "bench"
	// directSenders is how many goroutines send the direct events due: a
	// few, so that one slow commit does not hold the others' due times.
	directSenders = 8
	// baselineFor is how long direct events run alone.
	baselineFor = 10 * time.Second
	// stepPause is how long an instance that found no work (or failed)
	// waits before looking again, standing in for its interval.
	stepPause = 20 * time.Millisecond
	// maxFailures is how many Steps in a row may fail before the run
	// stops: a replica retries a failed batch, but not forever here.
	maxFailures = 50
)

func main() {
	members := flag.Int("members", 1_000_000, "members of the topic")
	workers := flag.Int("workers", 2, "topics.Fanout instances (Workers: 1 each), as replicas")
	batch := flag.Int("batch", topics.DefaultBatchSize, "members a fan-out batch writes")
	rate := flag.Int("direct-rate", 100, "direct events a second offered meanwhile")
	keep := flag.Bool("keep", false, "keep the cluster's directory")
	flag.Parse()
	if *members < 1 || *workers < 1 || *batch < 1 || *rate < 1 {
		fmt.Fprintln(os.Stderr, "fanout: want -members, -workers, -batch and -direct-rate ≥ 1")
		os.Exit(2)
	}
	b := &bench{members: *members, workers: *workers, batch: *batch, rate: *rate}
	if err := b.run(context.Background(), *keep); err != nil {
		fmt.Fprintln(os.Stderr, "fanout:", err)
		os.Exit(1)
	}
}

type bench struct {
	members, workers, batch, rate int
	cluster                       *pgcluster.Cluster
	pool                          *pgxpool.Pool
	store                         *topics.Store
}

func member(i int) string { return fmt.Sprintf("user-%08d", i) }

func (b *bench) run(ctx context.Context, keep bool) error {
	dir, err := os.MkdirTemp("", "spoolcast-fanout-")
	if err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	if keep {
		fmt.Println("fanout: cluster kept in", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	b.cluster, err = pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(dir, "pg"), Durable: true})
	if err != nil {
		return err
	}
	defer b.cluster.Stop()
	if _, err := migrations.Up(ctx, b.cluster.URL, nil); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(b.cluster.URL)
	if err != nil {
		return err
	}
	// Each instance holds two connections while it writes a batch (its
	// transaction, and the pace's statement beside it), the direct senders
	// one each, maintenance two; the rest is for the monitor's polls. None
	// of the figures should include waiting for the pool.
	cfg.MaxConns = int32(2*b.workers + directSenders + 4)
	b.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer b.pool.Close()
	b.store = topics.NewStore(b.pool)

	fmt.Printf("fanout: %s members, %d Fanout instances (Workers: 1 each), batches of %d, %d direct events/s offered; %s\n\n",
		commas(int64(b.members)), b.workers, b.batch, b.rate, b.version(ctx))

	if err := b.fill(ctx); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	base, err := b.baseline(ctx)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	fo, err := b.fanout(ctx, base)
	if err != nil {
		return fmt.Errorf("fan-out: %w", err)
	}
	raw, err := b.raw(ctx, fo)
	if err != nil {
		return fmt.Errorf("raw baseline: %w", err)
	}
	if err := b.maintenance(ctx, base); err != nil {
		return fmt.Errorf("maintenance: %w", err)
	}
	b.onPaper(fo, raw)
	return nil
}

// fill adds the members, topics.MaxChange a request, as the API would.
func (b *bench) fill(ctx context.Context) error {
	fmt.Printf("1. topic %q filled, %s members a request\n", topic, commas(topics.MaxChange))
	lsn, err := b.lsn(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	ids := make([]string, 0, topics.MaxChange)
	for i := 0; i < b.members; i += topics.MaxChange {
		ids = ids[:0]
		for j := i; j < min(i+topics.MaxChange, b.members); j++ {
			ids = append(ids, member(j))
		}
		if _, err := b.store.ChangeMembers(ctx, topic, ids, nil); err != nil {
			return err
		}
		if done := i + len(ids); done == b.members || (done/topics.MaxChange)%max(1, b.members/topics.MaxChange/5) == 0 {
			fmt.Printf("   %s members in %s\n", commas(int64(done)), time.Since(start).Round(100*time.Millisecond))
		}
	}
	took := time.Since(start)
	wal, err := b.walSince(ctx, lsn)
	if err != nil {
		return err
	}
	fmt.Printf("   filled in %s: %s members/s, %.0f bytes of WAL a member\n", took.Round(100*time.Millisecond),
		commas(int64(float64(b.members)/took.Seconds())), float64(wal)/float64(b.members))
	// Every member has a phone, so that the fan-out queues push work for
	// each, as the raw statement does (a member without a device gets none).
	start = time.Now()
	if _, err := b.pool.Exec(ctx, `INSERT INTO devices (token, user_id, platform)
		SELECT 'ExponentPushToken[' || user_id || ']', user_id, 'ios' FROM topic_members WHERE topic = $1`, topic); err != nil {
		return err
	}
	fmt.Printf("   a phone registered for each member in %s\n\n", time.Since(start).Round(100*time.Millisecond))
	return b.settle(ctx)
}

type baseline struct {
	lat          summary
	walPerDirect float64
}

// baseline offers direct events alone, for their latency and WAL.
func (b *bench) baseline(ctx context.Context) (baseline, error) {
	fmt.Printf("2. direct events alone: %d/s for %s, open loop, one recipient each\n", b.rate, baselineFor)
	lsn, err := b.lsn(ctx)
	if err != nil {
		return baseline{}, err
	}
	load := b.offerDirect(ctx, "base")
	time.Sleep(baselineFor)
	res := load.stop()
	wal, err := b.walSince(ctx, lsn)
	if err != nil {
		return baseline{}, err
	}
	if err := res.check(); err != nil {
		return baseline{}, err
	}
	base := baseline{lat: res.summary(), walPerDirect: float64(wal) / float64(res.sent)}
	fmt.Printf("   %d events: latency %s; %.0f bytes of WAL an event\n\n", res.sent, base.lat, base.walPerDirect)
	return base, b.settle(ctx)
}

type fanoutResult struct {
	took       time.Duration // accepted → completed, by Postgres's clock
	walPer     float64       // adjusted for the direct events alongside
	rowsPerSec float64
	// The rows a second of the first and the last tenth of the members.
	firstRate, lastRate float64
}

// fanout ingests a topic event and has the instances write it while direct
// events are offered alongside.
func (b *bench) fanout(ctx context.Context, base baseline) (fanoutResult, error) {
	fmt.Printf("3. one topic event to %s members: %d instances writing, %d direct events/s alongside\n",
		commas(int64(b.members)), b.workers, b.rate)
	lsn, err := b.lsn(ctx)
	if err != nil {
		return fanoutResult{}, err
	}
	checkpoints, images, err := b.walCounters(ctx)
	if err != nil {
		return fanoutResult{}, err
	}
	cpu := b.cluster.CPU()
	if err := b.ingestTopicEvent(ctx, "bench-1"); err != nil {
		return fanoutResult{}, err
	}
	load := b.offerDirect(ctx, "during")
	run := b.startFanouts(ctx)
	var rates []float64
	st, err := b.waitFor(ctx, "bench-1", run, func(st topics.FanoutStatus) bool { return st.State == topics.StateCompleted }, &rates)
	direct := load.stop()
	steps, stepErr := run.stop()
	if err != nil {
		return fanoutResult{}, err
	}
	if stepErr != nil {
		return fanoutResult{}, stepErr
	}
	if err := direct.check(); err != nil {
		return fanoutResult{}, err
	}
	cpu = b.cluster.CPU() - cpu
	wal, err := b.walSince(ctx, lsn)
	if err != nil {
		return fanoutResult{}, err
	}
	note, err := b.walNote(ctx, checkpoints, images, wal)
	if err != nil {
		return fanoutResult{}, err
	}
	took := st.EndedAt.Sub(st.AcceptedAt)
	res := fanoutResult{took: took, rowsPerSec: float64(b.members) / took.Seconds()}
	if len(rates) > 0 {
		res.firstRate, res.lastRate = rates[0], rates[len(rates)-1]
	}

	var written, twice, queued int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM notifications WHERE idempotency_key = 'bench-1'`).Scan(&written); err != nil {
		return res, err
	}
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT user_id FROM notifications
			WHERE idempotency_key = 'bench-1' GROUP BY 1 HAVING count(*) > 1) d`).Scan(&twice); err != nil {
		return res, err
	}
	// No dispatcher runs: every notification's push work is still queued.
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM push_queue q JOIN notifications n
			ON n.id = q.notification_id AND n.created_at = q.notification_created_at
			WHERE n.idempotency_key = 'bench-1'`).Scan(&queued); err != nil {
		return res, err
	}
	fmt.Printf("   completed in %s (accepted → completed; split into %d ranges); %s rows/s\n",
		took.Round(100*time.Millisecond), st.Ranges, commas(int64(res.rowsPerSec)))
	fmt.Printf("   written %s (want %s) %s, users reached twice %d %s, push work queued %s %s\n",
		commas(written), commas(int64(b.members)), ok(written == int64(b.members)), twice, ok(twice == 0),
		commas(queued), ok(queued == int64(b.members)))
	split, batches := steps.times()
	fmt.Printf("   Steps that found work, per instance: %v (a batch each, and one the split)\n", steps.counts)
	fmt.Printf("   split into ranges in %s; a batch (its Step) %s\n", round(split), batches)
	directWAL := base.walPerDirect * float64(direct.sent)
	res.walPer = (float64(wal) - directWAL) / float64(b.members)
	fmt.Printf("   WAL: %.0f bytes a member raw; %.0f adjusted (less %d direct events × %.0f bytes = %s MiB); %s MiB in all: %s\n",
		float64(wal)/float64(b.members), res.walPer, direct.sent, base.walPerDirect, mib(int64(directWAL)), mib(wal), note)
	fmt.Printf("   Postgres CPU: %.1f µs a member (%.0f%% of one core over the fan-out)\n",
		float64(cpu.Microseconds())/float64(b.members), 100*cpu.Seconds()/took.Seconds())
	d := direct.summary()
	fmt.Printf("   direct events alongside: %d, latency %s\n", direct.sent, d)
	fmt.Printf("   direct latency against alone: p50 ×%.1f, p99 ×%.1f, max ×%.1f\n",
		ratio(d.p50, base.lat.p50), ratio(d.p99, base.lat.p99), ratio(d.max, base.lat.max))
	if err := b.sizes(ctx); err != nil {
		return res, err
	}
	fmt.Println()
	return res, b.settle(ctx)
}

// rawSQL writes what the fan-out's batches write, for every member at
// once: a key each, claimed ON CONFLICT DO NOTHING, then a notification
// and push work for the keys claimed. It keeps batchSQL's orders (claims
// by key, ids by user) so that the indexes are written alike; it has no
// ranges, no pace and no progress. $1 producer, $2 key, $3 request hash,
// $4 type, $5 category, $6 title, $7 body, $8 data, $9 priority, $10 topic.
const rawSQL = `WITH m AS MATERIALIZED (
    SELECT user_id FROM topic_members WHERE topic = $10::text AND subscribed_at <= now() ORDER BY user_id
),
keyed AS (
    SELECT m.user_id, octet_length($1::text) || ':' || $1::text || ':' ||
           octet_length($2::text) || ':' || $2::text || ':' || m.user_id AS key
    FROM m
),
claimed AS (
    INSERT INTO idempotency_keys (key, request_hash, claimed_at)
    SELECT key, $3::bytea, now() FROM keyed ORDER BY key
    ON CONFLICT DO NOTHING
    RETURNING key
),
new AS MATERIALIZED (
    SELECT nextval('notification_ids') AS id, k.user_id, k.key
    FROM keyed k JOIN claimed c ON c.key = k.key
    ORDER BY k.user_id
),
inserted AS (
    INSERT INTO notifications (id, user_id, received_at, type, category, title, body, data, producer, idempotency_key, notification_key, run_id, topic)
    SELECT id, user_id, NULL::timestamptz, $4::text, $5::text, $6::text, $7::text, $8::jsonb, $1::text, $2::text, key, NULL::text, $10::text
    FROM new ORDER BY id
),
queued AS (
    INSERT INTO push_queue (notification_id, notification_created_at, user_id, category, priority, digest_key, digest_window, due_at)
    SELECT id, now(), user_id, $5::text, $9::text, NULL::text, NULL::interval, now() FROM new
)
SELECT count(*) FROM new`

type rawResult struct {
	rowsPerSec float64
	walPer     float64
}

// raw writes the same rows for a second event in one statement, with
// nothing alongside: the fastest these writes go on this machine.
func (b *bench) raw(ctx context.Context, fo fanoutResult) (rawResult, error) {
	fmt.Printf("4. raw baseline: the same rows for event \"raw-1\" in ONE statement, nothing alongside\n")
	ev, err := topicEvent("raw-1")
	if err != nil {
		return rawResult{}, err
	}
	data := "{}"
	if len(ev.Data) > 0 {
		data = string(ev.Data)
	}
	lsn, err := b.lsn(ctx)
	if err != nil {
		return rawResult{}, err
	}
	checkpoints, images, err := b.walCounters(ctx)
	if err != nil {
		return rawResult{}, err
	}
	cpu := b.cluster.CPU()
	start := time.Now()
	var n int64
	if err := b.pool.QueryRow(ctx, rawSQL, producer, ev.IdempotencyKey, ev.Hash(), ev.Type, ev.Category, ev.Title, ev.Body, data,
		event.PriorityNormal, topic).Scan(&n); err != nil {
		return rawResult{}, err
	}
	took := time.Since(start)
	cpu = b.cluster.CPU() - cpu
	wal, err := b.walSince(ctx, lsn)
	if err != nil {
		return rawResult{}, err
	}
	note, err := b.walNote(ctx, checkpoints, images, wal)
	if err != nil {
		return rawResult{}, err
	}
	if n != int64(b.members) {
		return rawResult{}, fmt.Errorf("the statement wrote %d rows; want %d", n, b.members)
	}
	res := rawResult{rowsPerSec: float64(n) / took.Seconds(), walPer: float64(wal) / float64(n)}
	fmt.Printf("   %s rows in %s: %s rows/s; Postgres CPU %.1f µs a member\n",
		commas(n), took.Round(100*time.Millisecond), commas(int64(res.rowsPerSec)), float64(cpu.Microseconds())/float64(n))
	fmt.Printf("   WAL: %.0f bytes a member; %s MiB in all: %s\n", res.walPer, mib(wal), note)
	r := fo.rowsPerSec / res.rowsPerSec
	verdict := "MET"
	if r < 0.5 {
		verdict = "NOT MET"
	}
	fmt.Printf("   fan-out ÷ raw: %s ÷ %s rows/s = %.2f (target ≥ 0.5: %s)\n\n",
		commas(int64(fo.rowsPerSec)), commas(int64(res.rowsPerSec)), r, verdict)
	return res, b.settle(ctx)
}

// maintenance runs a pass that does DDL (partitions further ahead than
// the migration made) while a second fan-out writes, then cancels that
// fan-out.
func (b *bench) maintenance(ctx context.Context, base baseline) error {
	fmt.Printf("5. maintenance pass during a fan-out (event \"bench-2\", same topic), direct events alongside\n")
	if err := b.ingestTopicEvent(ctx, "bench-2"); err != nil {
		return err
	}
	load := b.offerDirect(ctx, "maint")
	run := b.startFanouts(ctx)
	// Under way: a few batches written, so the pass meets batches in flight.
	if _, err := b.waitFor(ctx, "bench-2", run, func(st topics.FanoutStatus) bool {
		return st.State == topics.StateCompleted || st.Written >= int64(min(3*b.batch, b.members))
	}, nil); err != nil {
		load.stop()
		run.stop()
		return err
	}
	// Its log would say what the report below says, amid it.
	rep, err := lifecycle.Run(ctx, lifecycle.Config{DB: b.pool, KeyWindow: 7 * 24 * time.Hour, Retention: 0, WeeksAhead: 8,
		LockTimeout: lifecycle.DefaultLockTimeout, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		load.stop()
		run.stop()
		return err
	}
	cancelled, err := ingest.Cancel(ctx, b.pool, producer, "bench-2", time.Now())
	direct := load.stop()
	steps, stepErr := run.stop()
	if err != nil {
		return err
	}
	if stepErr != nil {
		return stepErr
	}
	if err := direct.check(); err != nil {
		return err
	}
	created := "none"
	if len(rep.Created) > 0 {
		created = fmt.Sprintf("%d (%s … %s)", len(rep.Created), rep.Created[0], rep.Created[len(rep.Created)-1])
	}
	fmt.Printf("   pass took %s (ran: %v); partitions created: %s; analyzed %v; lock timeouts %d %s\n",
		rep.Took.Round(time.Millisecond), rep.Ran, created, rep.Analyzed, len(rep.LockTimeouts), ok(len(rep.LockTimeouts) == 0))
	split, batches := steps.times()
	fmt.Printf("   cancel: %s, %s members reached before it; Steps per instance %v; split %s, a batch %s\n",
		cancelled.Outcome, commas(cancelled.Reached), steps.counts, round(split), batches)
	d := direct.summary()
	fmt.Printf("   direct events alongside: %d, latency %s (p99 ×%.1f of alone)\n\n", direct.sent, d, ratio(d.p99, base.lat.p99))
	return nil
}

// onPaper scales the measured per-member figures to 10 million members.
func (b *bench) onPaper(fo fanoutResult, raw rawResult) {
	const ten = 10_000_000
	per := fo.took.Seconds() / float64(b.members)
	seconds := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)).Round(time.Second) }
	fmt.Printf("6. 10M on paper (from %s members)\n", commas(int64(b.members)))
	fmt.Printf("   fan-out: %.1f µs a member × 10M = %s (raw statement: %s)\n", per*1e6, seconds(per*ten), seconds(ten/raw.rowsPerSec))
	fmt.Printf("   WAL: %.0f bytes a member × 10M = %.1f GiB (raw statement: %.1f GiB)\n",
		fo.walPer, fo.walPer*ten/(1<<30), raw.walPer*ten/(1<<30))
	// The scaling is linear only if a member costs the same wherever it is
	// in the topic: a rate that falls with progress says it does not.
	if fo.firstRate > 0 && fo.lastRate < 0.75*fo.firstRate {
		fmt.Printf("   CAUTION: the fan-out's rate fell from %s rows/s (first tenth) to %s (last tenth): a batch costs more the further\n"+
			"   into the topic it is, so 10M members would take longer than this line says\n", commas(int64(fo.firstRate)), commas(int64(fo.lastRate)))
	}
}

// ingestTopicEvent ingests the benchmark's topic event under key, as the
// API would.
func (b *bench) ingestTopicEvent(ctx context.Context, key string) error {
	ev, err := topicEvent(key)
	if err != nil {
		return err
	}
	res, err := ingest.Ingest(ctx, b.pool, []ingest.Item{{Producer: producer, Event: ev}})
	if err != nil {
		return err
	}
	if res[0].Outcome != event.Accepted || !res[0].Fanouts {
		return fmt.Errorf("ingest %s: %+v; want accepted with a fan-out", key, res[0])
	}
	return nil
}

func topicEvent(key string) (event.Event, error) {
	body, err := json.Marshal(map[string]any{"idempotency_key": key, "type": "launch", "title": "Launch", "topics": []string{topic}})
	if err != nil {
		return event.Event{}, err
	}
	return event.Decode(body, "")
}

// waitFor polls the fan-out of key until done says so; it gives up if an
// instance failed for good. With rates, it prints the progress every tenth
// of the members and appends each tenth's rows a second to rates.
func (b *bench) waitFor(ctx context.Context, key string, run *fanouts, done func(topics.FanoutStatus) bool, rates *[]float64) (topics.FanoutStatus, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	var shown, lastWritten int64
	last := start
	for {
		select {
		case <-run.failed:
			return topics.FanoutStatus{}, run.err()
		case <-tick.C:
		}
		list, _, err := b.store.Fanouts(ctx, topics.FanoutFilter{IdempotencyKey: key})
		if err != nil {
			return topics.FanoutStatus{}, err
		}
		if len(list) != 1 {
			return topics.FanoutStatus{}, fmt.Errorf("%d fan-outs of %s; want one", len(list), key)
		}
		st := list[0]
		if rates != nil && st.Written*10/int64(b.members) > shown {
			shown = st.Written * 10 / int64(b.members)
			now := time.Now()
			rate := float64(st.Written-lastWritten) / now.Sub(last).Seconds()
			*rates = append(*rates, rate)
			fmt.Printf("   %s written at %s (%s rows/s since the last line)\n", commas(st.Written), now.Sub(start).Round(100*time.Millisecond),
				commas(int64(rate)))
			last, lastWritten = now, st.Written
		}
		if done(st) {
			return st, nil
		}
	}
}

// fanouts are the instances writing, each in a goroutine of its own,
// stepping until stopped.
type fanouts struct {
	stopping chan struct{}
	failed   chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	counts   []int
	steps    []step
	failure  error
	failOnce sync.Once
}

// startFanouts starts the instances: each Steps, and sleeps a moment when
// it found nothing (another instance holds the split, or every range) or
// failed, as its interval would have it look again.
func (b *bench) startFanouts(ctx context.Context) *fanouts {
	run := &fanouts{stopping: make(chan struct{}), failed: make(chan struct{}), counts: make([]int, b.workers)}
	for i := range b.workers {
		f, err := topics.NewFanout(topics.FanoutConfig{DB: b.pool, Workers: 1, BatchSize: b.batch, PushRate: topics.DefaultPushRate})
		if err != nil {
			run.fail(err)
			break
		}
		run.wg.Add(1)
		go func() {
			defer run.wg.Done()
			failures := 0
			for {
				select {
				case <-run.stopping:
					return
				case <-run.failed:
					return
				default:
				}
				t := time.Now()
				did, err := f.Step(ctx)
				if err != nil {
					if failures++; failures >= maxFailures {
						run.fail(fmt.Errorf("instance %d: %d Steps in a row failed, the last: %w", i, failures, err))
						return
					}
					time.Sleep(stepPause)
					continue
				}
				failures = 0
				if !did {
					time.Sleep(stepPause)
					continue
				}
				took := time.Since(t)
				run.mu.Lock()
				run.counts[i]++
				run.steps = append(run.steps, step{start: t, took: took})
				run.mu.Unlock()
			}
		}()
	}
	return run
}

func (r *fanouts) fail(err error) {
	r.failOnce.Do(func() {
		r.mu.Lock()
		r.failure = err
		r.mu.Unlock()
		close(r.failed)
	})
}

func (r *fanouts) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failure
}

// stop stops the instances after their Steps in flight.
func (r *fanouts) stop() (*fanouts, error) {
	close(r.stopping)
	r.wg.Wait()
	return r, r.err()
}

// step is a Step that found work.
type step struct {
	start time.Time
	took  time.Duration
}

// times are how long the split took and the batches: the first Step to
// find work is the split, which holds the fan-out while the others find
// nothing. (The last batch completes the fan-out in its Step.)
func (r *fanouts) times() (split time.Duration, batches summary) {
	if len(r.steps) == 0 {
		return 0, summary{}
	}
	steps := slices.SortedFunc(slices.Values(r.steps), func(a, b step) int { return a.start.Compare(b.start) })
	var ds []time.Duration
	for _, s := range steps[1:] {
		ds = append(ds, s.took)
	}
	return steps[0].took, summarize(ds)
}

// directLoad offers direct events open loop.
type directLoad struct {
	stopping chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	lat      []time.Duration
	sent     int
	failures int
	firstErr error
}

// offerDirect offers direct events to random members at b.rate a second
// until stopped: a scheduler queues each at its due time, and the senders
// send them as they come. A due time never waits for a sender; a late
// sender's wait is part of the latency.
func (b *bench) offerDirect(ctx context.Context, tag string) *directLoad {
	d := &directLoad{stopping: make(chan struct{})}
	due := make(chan time.Time, 1<<16)
	interval := time.Second / time.Duration(b.rate)
	start := time.Now()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer close(due)
		for i := 0; ; i++ {
			at := start.Add(time.Duration(i) * interval)
			t := time.NewTimer(time.Until(at))
			select {
			case <-d.stopping:
				t.Stop()
				return
			case <-t.C:
			}
			select {
			case due <- at:
			case <-d.stopping:
				return
			}
		}
	}()
	var seq sync.Mutex
	n := 0
	for range directSenders {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			for at := range due {
				seq.Lock()
				n++
				key := fmt.Sprintf("direct-%s-%d", tag, n)
				seq.Unlock()
				err := sendDirect(ctx, b.pool, key, member(rand.IntN(b.members)))
				lat := time.Since(at)
				d.mu.Lock()
				d.sent++
				if err != nil {
					d.failures++
					if d.firstErr == nil {
						d.firstErr = err
					}
				} else {
					d.lat = append(d.lat, lat)
				}
				d.mu.Unlock()
			}
		}()
	}
	return d
}

// sendDirect ingests one direct event to user, one event a call, as the
// API's ingress does for a request of one event.
func sendDirect(ctx context.Context, pool *pgxpool.Pool, key, user string) error {
	body, err := json.Marshal(map[string]any{"idempotency_key": key, "type": "direct", "title": "Hello", "recipients": []string{user}})
	if err != nil {
		return err
	}
	ev, err := event.Decode(body, "")
	if err != nil {
		return err
	}
	res, err := ingest.Ingest(ctx, pool, []ingest.Item{{Producer: producer, Event: ev}})
	if err != nil {
		return err
	}
	if res[0].Outcome != event.Accepted || res[0].Created != 1 {
		return fmt.Errorf("direct event %s: %+v; want accepted, one created", key, res[0])
	}
	return nil
}

// stop stops offering; the events already due are still sent.
func (d *directLoad) stop() *directLoad {
	close(d.stopping)
	d.wg.Wait()
	return d
}

func (d *directLoad) check() error {
	switch {
	case d.failures > 0:
		return fmt.Errorf("%d of %d direct events failed, the first: %w", d.failures, d.sent, d.firstErr)
	case d.sent == 0:
		return errors.New("no direct event was sent")
	}
	return nil
}

func (d *directLoad) summary() summary { return summarize(d.lat) }

type summary struct{ p50, p99, max time.Duration }

func summarize(ds []time.Duration) summary {
	if len(ds) == 0 {
		return summary{}
	}
	s := slices.Sorted(slices.Values(ds))
	at := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return summary{p50: at(.5), p99: at(.99), max: s[len(s)-1]}
}

func (s summary) String() string {
	return fmt.Sprintf("p50 %s, p99 %s, max %s", round(s.p50), round(s.p99), round(s.max))
}

// round rounds d for reading.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	default:
		return d.Round(10 * time.Microsecond)
	}
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// settle makes the next phase start as this one did: no dirty pages of
// this phase left for a checkpoint in the next to write, fresh statistics
// and visibility, nothing for autovacuum to catch up on. (A phase's own
// WAL still triggers checkpoints past max_wal_size: see walNote.)
func (b *bench) settle(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return err
	}
	_, err := b.pool.Exec(ctx, `VACUUM ANALYZE`)
	return err
}

// sizes prints the tables' size a row after the fan-out, for sizing disks.
func (b *bench) sizes(ctx context.Context) error {
	var parts []string
	for _, t := range []string{"notifications", "push_queue", "idempotency_keys"} {
		var size, rows int64
		// A partitioned table's own size is 0: sum its partitions. (A
		// plain table has no partition tree: its own size.)
		if err := b.pool.QueryRow(ctx, `SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree($1::regclass)),
				pg_total_relation_size($1::regclass))::int8`, t).Scan(&size); err != nil {
			return err
		}
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+t).Scan(&rows); err != nil {
			return err
		}
		parts = append(parts, fmt.Sprintf("%s %.0f B", t, float64(size)/float64(max(rows, 1))))
	}
	fmt.Printf("   on disk a row, with indexes: %s\n", strings.Join(parts, ", "))
	return nil
}

func (b *bench) lsn(ctx context.Context) (string, error) {
	var lsn string
	err := b.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn)
	return lsn, err
}

// walSince is the WAL written since lsn, by everything (autovacuum and
// checkpoints' full-page images included).
func (b *bench) walSince(ctx context.Context, lsn string) (int64, error) {
	var n int64
	err := b.pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::int8`, lsn).Scan(&n)
	return n, err
}

// walCounters are the checkpoints so far and the full-page images written
// to the WAL: a checkpoint in a phase makes the next change of every page
// write the whole page. The images are counted as backends report them,
// which may lag by seconds.
func (b *bench) walCounters(ctx context.Context) (checkpoints, images int64, err error) {
	if err := b.pool.QueryRow(ctx, `SELECT wal_fpi FROM pg_stat_wal`).Scan(&images); err != nil {
		return 0, 0, err
	}
	err = b.pool.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).Scan(&checkpoints)
	if err != nil { // Postgres 17 moved them
		err = b.pool.QueryRow(ctx, `SELECT num_timed + num_requested FROM pg_stat_checkpointer`).Scan(&checkpoints)
	}
	return checkpoints, images, err
}

// walNote says how many checkpoints and full-page images a phase's WAL
// holds, since the marks taken at its start.
func (b *bench) walNote(ctx context.Context, checkpoints, images, wal int64) (string, error) {
	c, i, err := b.walCounters(ctx)
	if err != nil {
		return "", err
	}
	c, i = c-checkpoints, i-images
	return fmt.Sprintf("%d checkpoints, ≈%s full-page images (at most %.0f%% of the WAL)", c, commas(i),
		100*float64(i*8192)/float64(max(wal, 1))), nil
}

func (b *bench) version(ctx context.Context) string {
	var v string
	if err := b.pool.QueryRow(ctx, `SHOW server_version`).Scan(&v); err != nil {
		return "Postgres"
	}
	return "Postgres " + v
}

func ok(good bool) string {
	if good {
		return "✓"
	}
	return "✗"
}

func mib(n int64) string { return fmt.Sprintf("%.0f", float64(n)/(1<<20)) }

// commas writes n with thousands separators.
func commas(n int64) string { return benchfmt.Commas(n) }
