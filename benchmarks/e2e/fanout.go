package main

// The broadcast (-fanout N): before the rates, topic "everyone" is filled
// with N members who hold no socket and no device (member-00000000 …), so
// that none of its frames or pushes mixes with the direct events' (a frame
// or push of it reaching a benchmark user would count as a stray). In the
// last rate's window one event to the topic is posted to the relay, and
// central's fan-out workers write its N notifications in batches while the
// direct load goes on. What it measures: the direct events' stage
// latencies before the broadcast was posted and while its fan-out ran, by
// their commit; the fan-out's time to complete and its rows a second beside
// the direct load; and, to tell where the time went, each process's CPU
// and a few counters over the two stretches (and with -pg-stats
// Postgres's costliest statements of each, with -pprof the first
// replica's profile of each).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/topics"
)

const (
	fanoutTopic = "everyone"
	fanoutKey   = "fanout-1"
	// fanoutLead is the most of the last rate's window that runs before
	// the broadcast: enough direct events for a p99 (at 200/s, 6,000
	// events and ~12,000 frames); the rest of the window is the fan-out's.
	fanoutLead = 30 * time.Second
	// fanoutRowsPerSecond is what the default window assumes the fan-out
	// writes beside the direct load, on the low side of what this machine
	// did, so that the fan-out ends inside it.
	fanoutRowsPerSecond = 5000
	// fanoutTail is the default window's time after the fan-out's assumed
	// end: room for a slower one, and an "after" stretch when it is not.
	fanoutTail = 30 * time.Second
	// fanoutPoll is how often the fan-out's progress is read, and the
	// first replica's gauges.
	fanoutPoll = 250 * time.Millisecond
	// fanoutWait is how long past the window the fan-out is still waited
	// for, to time it when it outlasted the window.
	fanoutWait = 10 * time.Minute
	// fanoutGrace is the least wait for the direct events' stragglers after
	// a broadcast: direct pushes queued behind its push rows (due at once:
	// the members have no device to pace) wait for them to be claimed.
	fanoutGrace = 5 * time.Minute
	// minBaseline is the fewest direct events a stretch without the
	// fan-out needs to be a baseline: the "after" of a fan-out that ended
	// moments before the window did is not one.
	minBaseline = 1000
	// fanoutProfile is the most each of the two -pprof profiles takes.
	fanoutProfile = 20 * time.Second
)

// fanoutWatched are the counters compared before and during the fan-out:
// the window's, the fan-out's rows, and the push claims.
var fanoutWatched = append([]string{"spoolcast_topic_fanout_members_written_total"}, watched...)

func memberName(i int) string { return fmt.Sprintf("member-%08d", i) }

// defaultFanoutWindow is the last rate's window when -duration is not
// given: the lead, the fan-out at the assumed rate, and the tail.
func defaultFanoutWindow(members int) time.Duration {
	return fanoutLead + time.Duration(members/fanoutRowsPerSecond)*time.Second + fanoutTail
}

// fanoutAt is when, in a window of d from from, the broadcast is posted.
func fanoutAt(from time.Time, d time.Duration) time.Time { return from.Add(min(d/2, fanoutLead)) }

// fillTopic adds n members to the topic, topics.MaxChange a call as the
// API would, then vacuums and checkpoints, so that the fan-out reads an
// index a database in service would have (its visibility map set) and no
// checkpoint of the fill's WAL lands in the measured window.
func fillTopic(ctx context.Context, url string, n int) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := topics.NewStore(pool)
	began := time.Now()
	ids := make([]string, 0, topics.MaxChange)
	for i := 0; i < n; i += topics.MaxChange {
		ids = ids[:0]
		for j := i; j < min(i+topics.MaxChange, n); j++ {
			ids = append(ids, memberName(j))
		}
		if _, err := store.ChangeMembers(ctx, fanoutTopic, ids, nil); err != nil {
			return err
		}
	}
	filled := time.Since(began)
	settled := time.Now()
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE topic_members`); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return err
	}
	fmt.Printf("e2e: topic %q filled with %d members (none of them a benchmark user) in %s, %.0f members/s; vacuumed and checkpointed in %s\n",
		fanoutTopic, n, filled.Round(100*time.Millisecond), float64(n)/filled.Seconds(), time.Since(settled).Round(100*time.Millisecond))
	return nil
}

// fanoutResult is what the broadcast did.
type fanoutResult struct {
	members            int
	postedAt, answered time.Time
	status             int
	err                error // the watch's, when it could not finish
	// From topic_fanouts, Postgres's clock (this machine's): started_at
	// and ended_at, zero while not.
	state           string
	started, ended  time.Time
	written         int64     // at the watch's end
	writtenInWindow int64     // by the window's end
	windowEnd       time.Time // the measured window's end
	windows         []fanoutWindow
	// Before the post and during the fan-out: each stretch's bounds, each
	// process's CPU, the counters a second, the first replica's gauges,
	// and with -pg-stats Postgres's costliest statements.
	stretches  [2][2]time.Time
	cpu        [2][]named
	counters   [2][]named64
	gauges     [2]gaugeStats
	statements [2][]string
}

// gaugeStats are the first replica's gauges sampled over a stretch: the
// share of samples that found the live reader held (committed rows waiting
// behind an older transaction still running) and the longest hold seen,
// and the oldest push waiting in the queue, its most.
type gaugeStats struct {
	samples           int
	heldShare         float64
	heldMax, queueMax float64 // seconds
}

// The gauges sampled.
var sampledGauges = []string{"spoolcast_live_held_seconds", "spoolcast_push_queue_oldest_seconds"}

type gaugeSample struct {
	at     time.Time
	values []float64
}

// sampleGauges samples ops's gauges every fanoutPoll until stop closes.
func sampleGauges(ops string, stop <-chan struct{}) []gaugeSample {
	var out []gaugeSample
	tick := time.NewTicker(fanoutPoll)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return out
		case at := <-tick.C:
			out = append(out, gaugeSample{at, gauges(ops, sampledGauges...)})
		}
	}
}

// statsOf summarizes the samples taken in [from, to).
func statsOf(samples []gaugeSample, from, to time.Time) gaugeStats {
	var g gaugeStats
	held := 0
	for _, s := range samples {
		if s.at.Before(from) || !s.at.Before(to) || s.values[0] < 0 {
			continue
		}
		g.samples++
		if s.values[0] > 0 {
			held++
		}
		g.heldMax, g.queueMax = max(g.heldMax, s.values[0]), max(g.queueMax, s.values[1])
	}
	if g.samples > 0 {
		g.heldShare = float64(held) / float64(g.samples)
	}
	return g
}

// fanoutWindow is one stretch of the window, the direct events committed
// in it: their stage latencies.
type fanoutWindow struct {
	name                                     string
	from, to                                 time.Time
	events                                   int
	commitFrame, toFrame, toPush, commitPush quantiles
}

// snapshot is the processes' CPU and counters at one moment.
type snapshot struct {
	at       time.Time
	cpu      []time.Duration
	counters map[string]float64
}

func takeSnapshot(meters []meter, ps []*proc) snapshot {
	s := snapshot{at: time.Now(), counters: scrapeNames(ps, fanoutWatched)}
	for _, m := range meters {
		s.cpu = append(s.cpu, m.cpu())
	}
	return s
}

// between is the CPU each process spent from a to b.
func between(meters []meter, a, b snapshot) []named {
	var out []named
	for i, m := range meters {
		out = append(out, named{m.name, b.cpu[i] - a.cpu[i]})
	}
	return out
}

// broadcast posts the topic event at postAt, in the window [from, to), and
// watches its fan-out until it completes (or fanoutWait past the window);
// the result comes on the channel. The processes' CPU and counters are
// taken at from, at the post and at the fan-out's end (or the window's,
// if sooner); with -pg-stats, Postgres's statements are read and reset at
// the post and read at that end (the window's reader leaves them alone).
func broadcast(ctx context.Context, cfg config, w *world, meters []meter, from, postAt, to time.Time) <-chan *fanoutResult {
	out := make(chan *fanoutResult, 1)
	go func() {
		r := &fanoutResult{members: cfg.fanout, windowEnd: to}
		defer func() { out <- r }()
		ps := append([]*proc{w.relay}, w.centrals...)
		url := w.cluster.URL
		time.Sleep(time.Until(from))
		stopping, sampled := make(chan struct{}), make(chan []gaugeSample, 1)
		go func() { sampled <- sampleGauges(w.centrals[0].ops, stopping) }()
		stopSampling := sync.OnceFunc(func() { close(stopping) })
		defer stopSampling() // on the way out early
		s0 := takeSnapshot(meters, ps)
		time.Sleep(time.Until(postAt))
		s1 := takeSnapshot(meters, ps)
		if cfg.pgStats {
			r.statements[0] = costliest(ctx, url, s1.at.Sub(s0.at))
			_ = execOnce(ctx, url, `SELECT pg_stat_statements_reset()`)
		}
		client := &http.Client{Timeout: 30 * time.Second}
		r.postedAt = time.Now()
		r.status = post(ctx, client, w.relay.base, fmt.Appendf(nil, `{"idempotency_key":%q,"type":"bench.broadcast","title":"Broadcast","topics":[%q]}`, fanoutKey, fanoutTopic))
		r.answered = time.Now()
		if r.status/100 != 2 {
			r.err = fmt.Errorf("POST of the broadcast: status %d", r.status)
			return
		}
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			r.err = err
			return
		}
		defer conn.Close(context.Background())
		var s2 snapshot
		ended := false // s2 taken
		end := func() {
			s2, ended = takeSnapshot(meters, ps), true
			r.writtenInWindow = r.written
			if cfg.pgStats {
				r.statements[1] = costliest(ctx, url, s2.at.Sub(s1.at))
			}
		}
		for deadline := to.Add(fanoutWait); ctx.Err() == nil; time.Sleep(fanoutPoll) {
			var started, stopped *time.Time
			err := conn.QueryRow(ctx, `SELECT state, started_at, ended_at,
				(SELECT coalesce(sum(written), 0) FROM topic_fanout_ranges r WHERE r.fanout_id = f.id)::int8
				FROM topic_fanouts f WHERE idempotency_key = $1`, fanoutKey).Scan(&r.state, &started, &stopped, &r.written)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) { // no row: the relay has not forwarded it yet
				r.err = err
				break
			}
			if started != nil {
				r.started = *started
			}
			if stopped != nil {
				r.ended = *stopped
			}
			if !ended && (r.state == "completed" || r.state == "cancelled" || time.Now().After(to)) {
				end()
			}
			if r.state == "completed" || r.state == "cancelled" || time.Now().After(deadline) {
				break
			}
		}
		if !ended {
			end()
		}
		r.stretches = [2][2]time.Time{{s0.at, s1.at}, {s1.at, s2.at}}
		r.cpu = [2][]named{between(meters, s0, s1), between(meters, s1, s2)}
		r.counters = [2][]named64{perSecond(s0.counters, s1.counters, s1.at.Sub(s0.at)), perSecond(s1.counters, s2.counters, s2.at.Sub(s1.at))}
		stopSampling()
		samples := <-sampled
		r.gauges = [2]gaugeStats{statsOf(samples, s0.at, s1.at), statsOf(samples, s1.at, s2.at)}
	}()
	return out
}

// fanoutProfiles are the -pprof profiles of the last rate under -fanout:
// the first replica's CPU before the post and from it.
func fanoutProfiles(cfg config, rate int, from, postAt time.Time) []profileSpec {
	secs := min(fanoutProfile, postAt.Sub(from))
	return []profileSpec{
		{postAt.Add(-secs), secs, filepath.Join(cfg.out, fmt.Sprintf("e2e-%d-before-fanout.pprof", rate))},
		{postAt, fanoutProfile, filepath.Join(cfg.out, fmt.Sprintf("e2e-%d-fanout.pprof", rate))},
	}
}

// tally splits the direct events due in the window [from, to) by their
// commit (created_at, as their first frame carried it): before the post,
// from the post to the fan-out's end (or, had it not ended, to the end of
// the window), and after.
func (r *fanoutResult) tally(l *ledger, evs []*event, from, to time.Time) {
	end := to
	if !r.ended.IsZero() && r.ended.Before(to) {
		end = r.ended
	}
	bounds := []struct {
		name     string
		from, to time.Time
	}{
		{"before the broadcast", from, r.postedAt},
		{"during its fan-out (post → completed)", r.postedAt, end},
		{"after it completed", end, to.Add(time.Hour)}, // events due in the window may commit past its end
	}
	if end.Equal(to) {
		bounds[1].name = "during its fan-out (post → the window's end)"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range bounds {
		var commitFrame, toFrame, toPush, commitPush []time.Duration
		n := 0
		for _, e := range evs {
			if !e.accepted() || e.createdAt.IsZero() || e.due.Before(from) || !e.due.Before(to) ||
				e.createdAt.Before(b.from) || !e.createdAt.Before(b.to) {
				continue
			}
			n++
			for i := range e.recipients {
				if f := e.frames[i]; f.n > 0 {
					commitFrame = append(commitFrame, f.first.Sub(e.createdAt))
					toFrame = append(toFrame, f.first.Sub(e.due))
				}
				if p := e.pushes[i]; p.n > 0 {
					commitPush = append(commitPush, p.first.Sub(e.createdAt))
					toPush = append(toPush, p.first.Sub(e.due))
				}
			}
		}
		shown := b.to // the "after" stretch is shown to the window's end
		if shown.After(to) {
			shown = to
		}
		r.windows = append(r.windows, fanoutWindow{name: b.name, from: b.from, to: shown, events: n,
			commitFrame: quantilesOf(commitFrame), toFrame: quantilesOf(toFrame), toPush: quantilesOf(toPush), commitPush: quantilesOf(commitPush)})
	}
}

func (r *fanoutResult) print(rate int) {
	fmt.Printf("\nbroadcast at %d/s: one event to topic %q (%d members, none a benchmark user), posted %s (answered %d in %s)\n",
		rate, fanoutTopic, r.members, r.postedAt.Format("15:04:05.000"), r.status, ms(r.answered.Sub(r.postedAt)))
	if r.err != nil {
		fmt.Println("*** the broadcast: " + r.err.Error() + " ***")
		if r.status/100 != 2 {
			return
		}
	}
	switch {
	case r.started.IsZero():
		fmt.Printf("its fan-out never started (state %q)\n", r.state)
	case r.ended.IsZero():
		fmt.Printf("its fan-out started %s after the post and had not ended %s after the window (state %q, %d rows written, %d by the window's end): give -duration more\n",
			ms(r.started.Sub(r.postedAt)), fanoutWait, r.state, r.written, r.writtenInWindow)
	default:
		took := r.ended.Sub(r.started)
		fmt.Printf("its fan-out: started %s after the post, %s in %s: %d rows, %.0f rows/s; %s from the post to its end\n",
			ms(r.started.Sub(r.postedAt)), r.state, took.Round(100*time.Millisecond), r.written, float64(r.written)/took.Seconds(),
			r.ended.Sub(r.postedAt).Round(100*time.Millisecond))
		if r.ended.After(r.windowEnd) {
			inWindow := r.windowEnd.Sub(r.started)
			fmt.Printf("*** it ended %s after the window: while the direct load ran it wrote %d rows, %.0f rows/s; the rest came without it (give -duration more) ***\n",
				r.ended.Sub(r.windowEnd).Round(100*time.Millisecond), r.writtenInWindow, float64(r.writtenInWindow)/inWindow.Seconds())
		} else {
			fmt.Printf("the direct load ran throughout it; the window went on %s after it\n", r.windowEnd.Sub(r.ended).Round(100*time.Millisecond))
		}
	}
	fmt.Println("\nDirect events due in the window, by their commit (created_at): stage latencies")
	fmt.Println()
	fmt.Println("| committed | for | events | commit → frame p50 | p99 | POST → frame p50 | p99 | POST → push p50 | p99 | commit → push p50 | p99 |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, x := range r.windows {
		if x.events == 0 {
			continue
		}
		fmt.Printf("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", x.name, x.to.Sub(x.from).Round(100*time.Millisecond), x.events,
			ms(x.commitFrame.p50), ms(x.commitFrame.p99), ms(x.toFrame.p50), ms(x.toFrame.p99), ms(x.toPush.p50), ms(x.toPush.p99), ms(x.commitPush.p50), ms(x.commitPush.p99))
	}
	if len(r.windows) == 3 && r.windows[1].events > 0 {
		// The 30 s before the post is a short baseline, and runs of the
		// same code differ in it by 1.5×: when the fan-out ended inside
		// the window, the stretch after it is a second one.
		d := r.windows[1]
		ratio := func(during, base time.Duration) string {
			if base <= 0 {
				return "–"
			}
			return fmt.Sprintf("%.2f×", float64(during)/float64(base))
		}
		within := func(during, base time.Duration) string {
			if during <= 2*base {
				return "within"
			}
			return "NOT within"
		}
		var verdicts []string
		for _, baseline := range []struct {
			name string
			w    fanoutWindow
		}{{"before", r.windows[0]}, {"after", r.windows[2]}} {
			base, b := baseline.name, baseline.w
			if b.events < minBaseline {
				continue
			}
			fmt.Printf("| during ÷ %s | | | %s | %s | %s | %s | %s | %s | %s | %s |\n", base,
				ratio(d.commitFrame.p50, b.commitFrame.p50), ratio(d.commitFrame.p99, b.commitFrame.p99), ratio(d.toFrame.p50, b.toFrame.p50), ratio(d.toFrame.p99, b.toFrame.p99),
				ratio(d.toPush.p50, b.toPush.p50), ratio(d.toPush.p99, b.toPush.p99), ratio(d.commitPush.p50, b.commitPush.p50), ratio(d.commitPush.p99, b.commitPush.p99))
			verdicts = append(verdicts, fmt.Sprintf("commit → frame during the fan-out against %s: p50 %s (%s 2×), p99 %s (%s 2×)", base,
				ratio(d.commitFrame.p50, b.commitFrame.p50), within(d.commitFrame.p50, b.commitFrame.p50),
				ratio(d.commitFrame.p99, b.commitFrame.p99), within(d.commitFrame.p99, b.commitFrame.p99)))
		}
		fmt.Println()
		for _, v := range verdicts {
			fmt.Println(v)
		}
	}
	if len(r.cpu[0]) > 0 {
		fmt.Println("\nBefore the post and from it to the fan-out's end (or the window's): each process's CPU (cores: /proc utime+stime over the stretch);")
		fmt.Printf("the first replica's gauges sampled every %s: the live reader held (committed rows waiting behind a transaction still running), its share of samples and longest, and the oldest push queued\n\n", fanoutPoll)
		head, rule := "| stretch | for |", "|---|---:|"
		for _, c := range r.cpu[0] {
			head += " " + c.name + " |"
			rule += "---:|"
		}
		fmt.Println(head + " all | reader held | longest | oldest push queued |")
		fmt.Println(rule + "---:|---:|---:|---:|")
		for i, name := range []string{"before", "during"} {
			at := r.stretches[i]
			secs := at[1].Sub(at[0]).Seconds()
			line := fmt.Sprintf("| %s | %s |", name, at[1].Sub(at[0]).Round(100*time.Millisecond))
			var all time.Duration
			for _, c := range r.cpu[i] {
				line += fmt.Sprintf(" %.2f |", c.d.Seconds()/secs)
				all += c.d
			}
			g := r.gauges[i]
			fmt.Printf("%s %.2f | %.0f%% of %d | %s | %.1f s |\n", line, all.Seconds()/secs, 100*g.heldShare, g.samples, ms(time.Duration(g.heldMax*float64(time.Second))), g.queueMax)
		}
		fmt.Println()
		for i, name := range []string{"before", "during"} {
			fmt.Printf("counters %s: %v\n", name, r.counters[i])
			for _, st := range r.statements[i] {
				fmt.Println("  " + st)
			}
		}
	}
}
