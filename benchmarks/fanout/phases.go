package main

// The phases of the run, each measured and printed: the fill, direct events
// alone, the fan-out, the raw statement, maintenance, and 10M on paper.

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/lifecycle"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/topics"
)

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
