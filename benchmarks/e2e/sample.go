package main

// Samples over a long run (-sample, for the soak): every interval, each
// process's RSS and goroutines and the size of every Postgres table (a
// partitioned table's partitions summed under its name); at the end, the
// latency of the events due in each interval, from the ledger. What should
// stay flat after warm-up does, and what grows with the retained
// notifications grows by so much per event.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// sample is the processes and the database at one moment.
type sample struct {
	at         time.Time
	events     int // events due so far in the rate
	rss        []namedBytes
	goroutines []named64
	tables     map[string]int64
	err        error
}

// sampler takes a sample of ps and the database at url every interval
// until stop closes, and returns them.
func sampler(ctx context.Context, every time.Duration, url string, ps []*proc, t0 time.Time, rate int, stop <-chan struct{}) []sample {
	var out []sample
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return out
		case <-ctx.Done():
			return out
		case now := <-tick.C:
			s := sample{at: now, events: int(now.Sub(t0).Seconds() * float64(rate))}
			for _, p := range ps {
				s.rss = append(s.rss, namedBytes{p.name, procRSS(p.pid())})
				s.goroutines = append(s.goroutines, named64{p.name, gauge(p.ops, "go_goroutines")})
			}
			s.tables, s.err = tableSizes(ctx, url)
			out = append(out, s)
		}
	}
}

// gauge is one unlabelled metric of a process's /metrics; -1 when it does
// not answer.
func gauge(base, name string) float64 { return gauges(base, name)[0] }

// gauges are unlabelled metrics of a process's /metrics, in one read; -1
// for each it does not answer.
func gauges(base string, names ...string) []float64 {
	out := make([]float64, len(names))
	for i := range out {
		out[i] = -1
	}
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		for i, name := range names {
			if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					out[i] = f
				}
			}
		}
	}
	return out
}

// tableSizes is every table's size with its indexes and TOAST, a
// partition's counted under the table it is a partition of.
func tableSizes(ctx context.Context, url string) (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT coalesce((SELECT p.relname::text FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent WHERE i.inhrelid = c.oid), c.relname::text),
		sum(pg_total_relation_size(c.oid))::bigint
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind = 'r' GROUP BY 1`)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for rows.Next() {
		var name string
		var size int64
		if err := rows.Scan(&name, &size); err != nil {
			return nil, err
		}
		out[name] = size
	}
	return out, rows.Err()
}

// printSamples prints a line per sample (the latency of the events due
// since the one before, the processes, the database's total) and then
// each table's growth from the first sample after warm-up to the last.
func printSamples(samples []sample, l *ledger, evs []*event, from time.Time) {
	if len(samples) == 0 {
		return
	}
	fmt.Printf("\nsamples every %s (latency of the events due since the sample before; RSS and goroutines per process; every table with its indexes)\n\n",
		samplesEvery(samples))
	head, rule := "| at | events | POST→frame p50 | p99 | POST→push p50 | p99 |", "|---:|---:|---:|---:|---:|---:|"
	for _, r := range samples[0].rss {
		head += " " + r.name + " RSS | goroutines |"
		rule += "---:|---:|"
	}
	fmt.Println(head + " database |")
	fmt.Println(rule + "---:|")
	prev := samples[0].at.Add(-samplesEvery(samples))
	for _, s := range samples {
		frame, push := latencyDue(l, evs, prev, s.at)
		prev = s.at
		line := fmt.Sprintf("| %s | %d | %s | %s | %s | %s |", s.at.Sub(samples[0].at.Add(-samplesEvery(samples))).Round(time.Second), s.events,
			ms(frame.p50), ms(frame.p99), ms(push.p50), ms(push.p99))
		for i, r := range s.rss {
			line += fmt.Sprintf(" %d MiB | %.0f |", r.b>>20, s.goroutines[i].value)
		}
		var total int64
		for _, b := range s.tables {
			total += b
		}
		if s.err != nil {
			line += " " + s.err.Error() + " |"
		} else {
			line += fmt.Sprintf(" %d MiB |", total>>20)
		}
		fmt.Println(line)
	}
	// Growth from the first sample at or after the warm-up to the last.
	first := samples[0]
	for _, s := range samples {
		if !s.at.Before(from) {
			first = s
			break
		}
	}
	last := samples[len(samples)-1]
	events := last.events - first.events
	var names []string
	for n := range last.tables {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return int(last.tables[b] - last.tables[a]) })
	fmt.Printf("\ntables from %s to %s (%d events): size then and at the end, bytes per event in between\n\n",
		first.at.Sub(samples[0].at.Add(-samplesEvery(samples))).Round(time.Second), last.at.Sub(samples[0].at.Add(-samplesEvery(samples))).Round(time.Second), events)
	fmt.Println("| table | then | at the end | bytes/event |")
	fmt.Println("|---|---:|---:|---:|")
	for _, n := range names {
		then, now := first.tables[n], last.tables[n]
		if now < 1<<20 && then < 1<<20 {
			continue
		}
		per := "–"
		if events > 0 {
			per = fmt.Sprintf("%.0f", float64(now-then)/float64(events))
		}
		fmt.Printf("| %s | %s | %s | %s |\n", n, mib(then), mib(now), per)
	}
}

func samplesEvery(samples []sample) time.Duration {
	if len(samples) < 2 {
		return time.Minute
	}
	return samples[1].at.Sub(samples[0].at).Round(time.Second)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// latencyDue is POST → frame and POST → push of the events due in
// [from, to).
func latencyDue(l *ledger, evs []*event, from, to time.Time) (frame, push quantiles) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var f, p []time.Duration
	for _, e := range evs {
		if !e.accepted() || e.due.Before(from) || !e.due.Before(to) {
			continue
		}
		for i := range e.recipients {
			if x := e.frames[i]; x.n > 0 {
				f = append(f, x.first.Sub(e.due))
			}
			if x := e.pushes[i]; x.n > 0 {
				p = append(p, x.first.Sub(e.due))
			}
		}
	}
	return quantilesOf(f), quantilesOf(p)
}
