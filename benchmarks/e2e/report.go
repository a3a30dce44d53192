package main

// What a rate measured, and its tables, CSV and plot.

import (
	"encoding/csv"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// result is one rate's run.
type result struct {
	rate, sockets int
	duration      time.Duration
	load          string // the load average at the window's end
	// Over the rate's whole schedule, warm-up included.
	sent, accepted, failed                         int
	frames, missingFrames, dupFrames               int
	pushes, missingPushes, dupPushes               int
	lag                                            generatorLag
	dropped                                        int64
	waited                                         time.Duration
	posted                                         int     // requests due in the measured window
	achieved                                       float64 // 2xx answers a second in the window
	toFrame, toPush                                quantiles
	accept, forward, commitFrame, toPushFromCommit quantiles
	cpu                                            []named
	rss                                            []namedBytes
	counters                                       []named64 // per second over the window
	statements                                     []string  // -pg-stats: the costliest statements of the window
	disk                                           diskWork  // over the window
	missingExamples                                []string
	wave                                           *waveResult
	fanout                                         *fanoutResult
	samples                                        []sample
	ledger                                         *ledger
	evs                                            []*event
	from                                           time.Time
}

type named struct {
	name string
	d    time.Duration
}

type namedBytes struct {
	name string
	b    int64
}

// quantiles of a sample; n is its size.
type quantiles struct {
	n                  int
	p50, p99, p999, mx time.Duration
}

func quantilesOf(s []time.Duration) quantiles {
	if len(s) == 0 {
		return quantiles{}
	}
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return quantiles{n: len(s), p50: q(.50), p99: q(.99), p999: q(.999), mx: s[len(s)-1]}
}

// tally counts what arrived of evs, and times what was due in [from, to).
func (r *result) tally(l *ledger, evs []*event, from, to time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var toFrame, toPush, accept, forward, commitFrame, commitPush []time.Duration
	inWindow := 0
	for _, e := range evs {
		r.sent++
		measured := !e.due.Before(from) && e.due.Before(to)
		if measured {
			r.posted++
		}
		if !e.accepted() {
			r.failed++
			continue
		}
		r.accepted++
		if !e.answered.Before(from) && e.answered.Before(to) {
			inWindow++
		}
		if measured {
			accept = append(accept, e.answered.Sub(e.due))
			if !e.createdAt.IsZero() {
				forward = append(forward, e.createdAt.Sub(e.answered))
			}
		}
		for i := range e.recipients {
			f, p := e.frames[i], e.pushes[i]
			r.frames++
			r.pushes++
			switch {
			case f.n == 0:
				r.missingFrames++
				if len(r.missingExamples) < 5 {
					r.missingExamples = append(r.missingExamples, fmt.Sprintf("#%d to %s (due %s, answered %s, created %s)",
						e.seq, userName(e.recipients[i]), e.due.Format("15:04:05.000"), e.answered.Format("15:04:05.000"), e.createdAt.Format("15:04:05.000")))
				}
			case f.n > 1:
				r.dupFrames += f.n - 1
			}
			switch {
			case p.n == 0:
				r.missingPushes++
			case p.n > 1:
				r.dupPushes += p.n - 1
			}
			if !measured {
				continue
			}
			if f.n > 0 {
				toFrame = append(toFrame, f.first.Sub(e.due))
				if !e.createdAt.IsZero() {
					commitFrame = append(commitFrame, f.first.Sub(e.createdAt))
				}
			}
			if p.n > 0 {
				toPush = append(toPush, p.first.Sub(e.due))
				if !e.createdAt.IsZero() {
					commitPush = append(commitPush, p.first.Sub(e.createdAt))
				}
			}
		}
	}
	r.achieved = float64(inWindow) / r.duration.Seconds()
	r.toFrame, r.toPush = quantilesOf(toFrame), quantilesOf(toPush)
	r.accept, r.forward, r.commitFrame, r.toPushFromCommit = quantilesOf(accept), quantilesOf(forward), quantilesOf(commitFrame), quantilesOf(commitPush)
}

// clean: nothing failed, missing or duplicated. Pushes are at most once
// across a crash: under -wave, the pushes the killed replica held when it
// died end failed, outcome unknown (they may have left), and are reported,
// not counted as missing; none is sent twice.
func (r result) clean() bool {
	missingPushes := r.missingPushes
	if r.wave != nil {
		missingPushes -= atMostOnce(r.wave.pushEnds)
	}
	return r.failed == 0 && r.missingFrames == 0 && r.dupFrames == 0 && missingPushes == 0 && r.dupPushes == 0
}

// print is the rate's line as it finishes.
func (r result) print() {
	fmt.Printf("\nrate %d/s: %d sent (%d in the window), %d accepted, %d failed; achieved %.0f/s; POST→frame p50 %s p99 %s, POST→push p50 %s p99 %s; "+
		"frames %d (missing %d, duplicated %d), pushes %d (missing %d, duplicated %d); generator late >%s: %d (max %s); stragglers waited %s; load %s\n",
		r.rate, r.sent, r.posted, r.accepted, r.failed, r.achieved, ms(r.toFrame.p50), ms(r.toFrame.p99), ms(r.toPush.p50), ms(r.toPush.p99),
		r.frames, r.missingFrames, r.dupFrames, r.pushes, r.missingPushes, r.dupPushes, lateBy, r.lag.late, ms(r.lag.max), r.waited.Round(100*time.Millisecond), r.load)
	if len(r.counters) > 0 {
		fmt.Printf("  counters over the window: %v\n", r.counters)
	}
	for _, st := range r.statements {
		fmt.Println("  " + st)
	}
	if !r.clean() {
		fmt.Printf("  *** rate %d/s: %d failed POSTs, %d frames missing, %d duplicated, %d pushes missing, %d duplicated ***\n",
			r.rate, r.failed, r.missingFrames, r.dupFrames, r.missingPushes, r.dupPushes)
		for _, x := range r.missingExamples {
			fmt.Println("  frame missing: " + x)
		}
	}
}

// ms formats a duration in milliseconds, to the precision it deserves.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case a >= 10:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.2f ms", v)
	}
}

// perEvent is CPU per event posted in the window, in µs.
func (r result) perEvent(d time.Duration) string {
	if r.posted == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", float64(d.Microseconds())/float64(r.posted))
}

// report prints the tables and returns the exit code: 1 when anything was
// missing, duplicated or failed.
func report(cfg config, rs []result, strays int, dropped int64) int {
	measured := cfg.duration.String()
	if cfg.lastDuration != cfg.duration {
		measured += fmt.Sprintf(" (the last rate %s, for the broadcast)", cfg.lastDuration)
	}
	fmt.Printf("\nopen loop, %s measured per rate after %s of warm-up; %d sockets (half WebSocket, half SSE) on %d replica(s); latency from when each POST was due\n\n",
		measured, cfg.warmup, cfg.sockets, cfg.replicas)
	fmt.Println("| offered/s | achieved/s | POST→frame p50 | p99 | p99.9 | max | POST→push p50 | p99 | p99.9 | max | frames (missing, dup) | pushes (missing, dup) | generator late |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|")
	for _, r := range rs {
		fmt.Printf("| %d | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %d (%d, %d) | %d (%d, %d) | %d |\n", r.rate, r.achieved,
			ms(r.toFrame.p50), ms(r.toFrame.p99), ms(r.toFrame.p999), ms(r.toFrame.mx),
			ms(r.toPush.p50), ms(r.toPush.p99), ms(r.toPush.p999), ms(r.toPush.mx),
			r.frames, r.missingFrames, r.dupFrames, r.pushes, r.missingPushes, r.dupPushes, r.lag.late)
	}
	fmt.Println("\nStages: accept = due → 202; forward = 202 → created_at (the ingest transaction's start, from the frame); commit → frame = created_at → frame; commit → push = created_at → push request")
	fmt.Println()
	fmt.Println("| offered/s | accept p50 | p99 | forward p50 | p99 | commit → frame p50 | p99 | commit → push p50 | p99 |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		fmt.Printf("| %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.rate, ms(r.accept.p50), ms(r.accept.p99), ms(r.forward.p50), ms(r.forward.p99),
			ms(r.commitFrame.p50), ms(r.commitFrame.p99), ms(r.toPushFromCommit.p50), ms(r.toPushFromCommit.p99))
	}
	if len(rs) > 0 {
		fmt.Println("\nCPU per event posted in the window (µs; /proc utime+stime, the benchmark's own from rusage), and RSS at the window's end")
		fmt.Println()
		head, rule := "| offered/s |", "|---:|"
		for _, c := range rs[0].cpu {
			head += " " + c.name + " |"
			rule += "---:|"
		}
		head += " all |"
		rule += "---:|"
		for _, m := range rs[0].rss {
			head += " " + m.name + " RSS |"
			rule += "---:|"
		}
		fmt.Println(head + " load average |")
		fmt.Println(rule + "---|")
		for _, r := range rs {
			line := fmt.Sprintf("| %d |", r.rate)
			var all time.Duration
			for _, c := range r.cpu {
				line += " " + r.perEvent(c.d) + " |"
				all += c.d
			}
			line += " " + r.perEvent(all) + " |"
			for _, m := range r.rss {
				line += fmt.Sprintf(" %d MiB |", m.b>>20)
			}
			fmt.Println(line + " " + r.load + " |")
		}
	}
	fmt.Println("\nWhat reached the disk in the window: Postgres's WAL and its flushes (fsyncs), its data pages written (8 KiB each), and the relay's writes (the spool)")
	fmt.Println()
	fmt.Println("| offered/s | WAL bytes/event | WAL flushes/s | data pages/s | relay bytes/event |")
	fmt.Println("|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		if r.posted == 0 {
			continue
		}
		secs := r.duration.Seconds()
		fmt.Printf("| %d | %.0f | %.0f | %.0f | %.0f |\n", r.rate, float64(r.disk.walBytes)/float64(r.posted), float64(r.disk.walSyncs)/secs,
			float64(r.disk.pageWrites)/secs, float64(r.disk.relayBytes)/float64(r.posted))
	}
	for _, r := range rs {
		if r.wave != nil {
			r.wave.print(r.rate)
		}
		if r.fanout != nil {
			r.fanout.print(r.rate)
		}
		if len(r.samples) > 0 {
			fmt.Printf("\nrate %d/s:", r.rate)
			printSamples(r.samples, r.ledger, r.evs, r.from)
		}
	}
	code := 0
	for _, r := range rs {
		if !r.clean() {
			code = 1
		}
	}
	for _, r := range rs {
		if r.fanout != nil && r.fanout.err != nil {
			code = 1
		}
	}
	if dropped > 0 {
		fmt.Printf("\n*** %d streams ended during the run: their frames after that are missing ***\n", dropped)
		code = 1
	}
	if strays > 0 {
		fmt.Printf("\n*** %d frames or pushes named no event or recipient the generator sent ***\n", strays)
		code = 1
	}
	if code == 0 {
		fmt.Println("\nnothing missing, nothing duplicated, no failed POST")
	}
	return code
}

func writeCSV(cfg config, rs []result) error {
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(cfg.out, "e2e.csv"))
	if err != nil {
		return err
	}
	defer f.Close()
	w := csv.NewWriter(f)
	head := []string{"offered_per_s", "achieved_per_s", "sockets", "replicas", "posted",
		"frame_p50_ms", "frame_p99_ms", "frame_p999_ms", "frame_max_ms", "push_p50_ms", "push_p99_ms", "push_p999_ms", "push_max_ms",
		"accept_p50_ms", "accept_p99_ms", "forward_p50_ms", "forward_p99_ms", "commit_frame_p50_ms", "commit_frame_p99_ms", "commit_push_p50_ms", "commit_push_p99_ms",
		"frames", "frames_missing", "frames_dup", "pushes", "pushes_missing", "pushes_dup", "failed_posts", "generator_late"}
	if len(rs) > 0 {
		for _, c := range rs[0].cpu {
			head = append(head, "cpu_us_per_event_"+strings.ToLower(c.name))
		}
		for _, m := range rs[0].rss {
			head = append(head, "rss_mib_"+m.name)
		}
	}
	_ = w.Write(head)
	msf := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
	}
	for _, r := range rs {
		row := []string{strconv.Itoa(r.rate), strconv.FormatFloat(r.achieved, 'f', 1, 64), strconv.Itoa(r.sockets), strconv.Itoa(cfg.replicas), strconv.Itoa(r.posted),
			msf(r.toFrame.p50), msf(r.toFrame.p99), msf(r.toFrame.p999), msf(r.toFrame.mx), msf(r.toPush.p50), msf(r.toPush.p99), msf(r.toPush.p999), msf(r.toPush.mx),
			msf(r.accept.p50), msf(r.accept.p99), msf(r.forward.p50), msf(r.forward.p99), msf(r.commitFrame.p50), msf(r.commitFrame.p99),
			msf(r.toPushFromCommit.p50), msf(r.toPushFromCommit.p99),
			strconv.Itoa(r.frames), strconv.Itoa(r.missingFrames), strconv.Itoa(r.dupFrames), strconv.Itoa(r.pushes), strconv.Itoa(r.missingPushes), strconv.Itoa(r.dupPushes),
			strconv.Itoa(r.failed), strconv.Itoa(r.lag.late)}
		for _, c := range r.cpu {
			row = append(row, r.perEvent(c.d))
		}
		for _, m := range r.rss {
			row = append(row, strconv.FormatInt(m.b>>20, 10))
		}
		_ = w.Write(row)
	}
	w.Flush()
	return w.Error()
}

// writeSVG draws p50 (solid) and p99 (dashed) of POST → frame and POST →
// push against the offered rate, by hand: the module has no plotting
// library (benchmarks/peers, a module of its own, uses gonum).
func writeSVG(cfg config, rs []result) error {
	const (
		width, height          = 720, 420
		left, right, top, foot = 70, 190, 40, 50
	)
	plotW, plotH := float64(width-left-right), float64(height-top-foot)
	maxRate, maxMS := 0.0, 0.0
	for _, r := range rs {
		maxRate = max(maxRate, float64(r.rate))
		maxMS = max(maxMS, msOf(r.toFrame.p99), msOf(r.toPush.p99))
	}
	maxRate *= 1.05
	yMax := niceCeil(maxMS * 1.1)
	x := func(rate int) float64 { return float64(left) + float64(rate)/maxRate*plotW }
	y := func(v float64) float64 { return float64(top) + plotH - v/yMax*plotH }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">POST (due) → frame and → push request: %d sockets, %d replica(s), %s per rate</text>`+"\n", left, cfg.sockets, cfg.replicas, cfg.duration)
	for i := 0; i <= 5; i++ {
		v := yMax * float64(i) / 5
		fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n",
			left, float64(left)+plotW, y(v), y(v), left-6, y(v)+4, math.Round(v*10)/10)
	}
	for _, r := range rs {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%.1f" stroke="#eee"/><text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n",
			x(r.rate), x(r.rate), top, float64(top)+plotH, x(r.rate), float64(top)+plotH+16, r.rate)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">offered events/s</text>`+"\n", float64(left)+plotW/2, height-12)
	fmt.Fprintf(&b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">ms from when the POST was due</text>`+"\n", float64(top)+plotH/2)
	series := []struct {
		name, color, dash string
		v                 func(result) time.Duration
	}{
		{"frame p50", "#1f77b4", "", func(r result) time.Duration { return r.toFrame.p50 }},
		{"frame p99", "#1f77b4", "6 4", func(r result) time.Duration { return r.toFrame.p99 }},
		{"push p50", "#d62728", "", func(r result) time.Duration { return r.toPush.p50 }},
		{"push p99", "#d62728", "6 4", func(r result) time.Duration { return r.toPush.p99 }},
	}
	for i, s := range series {
		var pts []string
		for _, r := range rs {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(r.rate), y(msOf(s.v(r)))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s" points="%s"/>`+"\n", s.color, s.dash, strings.Join(pts, " "))
		for _, p := range pts {
			xy := strings.Split(p, ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], s.color)
		}
		ly := top + 20 + 20*i
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2" stroke-dasharray="%s"/><text x="%d" y="%d">POST → %s</text>`+"\n",
			width-right+15, width-right+45, ly, ly, s.color, s.dash, width-right+52, ly+4, s.name)
	}
	b.WriteString("</svg>\n")
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(cfg.out, "e2e.svg"), []byte(b.String()), 0o644)
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
