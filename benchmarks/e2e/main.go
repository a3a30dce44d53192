// Command e2e measures the whole pipeline from a producer's POST to the
// app: the time from when each event was due at the relay to the arrival
// of its notification frame on each recipient's open stream, and to the
// arrival of its push request at Expo, at fixed offered rates (open loop).
//
//	go run ./benchmarks/e2e                 # 200, 500, 1000 events/s, 10,000 sockets
//	go run ./benchmarks/e2e -quick          # 200/s for 5 s, 500 sockets
//	go run ./benchmarks/e2e -replicas 2 -wave -rates 200   # a replica killed mid-run
//	go run ./benchmarks/e2e -rates 200 -duration 30m -sample 1m   # the soak
//	go run ./benchmarks/e2e -rates 200 -sockets 10000 -fanout 1000000 -duration 3m   # a 1M-member broadcast mid-window
//
// It starts, on this machine, a durable Postgres cluster, one relay and
// -replicas central replicas (subprocesses of the real binary, push on,
// pointed at a fake Expo that notes when each push request arrives), and
// -sockets users, each with one Expo device and one stream open (half
// WebSocket, half server-sent events), split evenly between the replicas.
// For each rate it posts realistic events (random UUIDv4 keys, 1–3
// recipients, ~300 bytes) over keep-alive connections, then waits out a
// grace period for stragglers, and reports the latency quantiles, the
// stages between (relay accept, forward, commit → frame, commit → push),
// missing and duplicated frames and pushes, and each process's CPU per
// event. Tables go to stdout, a CSV and an SVG plot to -out. With -fanout N
// a topic of N other users is filled first, and one event to it is posted
// in the last rate's window: the direct events' latency before it and
// while its fan-out runs are compared (fanout.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	var (
		sockets     = flag.Int("sockets", 10000, "users, each with one Expo device and one open stream (half WebSocket, half SSE)")
		rates       = flag.String("rates", "200,500,1000", "offered rates, events/s, comma-separated, each run in turn")
		duration    = flag.Duration("duration", 15*time.Second, "measured time per rate, after -warmup")
		warmup      = flag.Duration("warmup", 3*time.Second, "unmeasured time per rate before measuring")
		grace       = flag.Duration("grace", 20*time.Second, "longest wait after a rate's last request for its frames and pushes")
		replicas    = flag.Int("replicas", 1, "central replicas, behind nothing: sockets split evenly, push dispatch on each")
		expoRate    = flag.Int("expo-rate", 0, "central's --expo-rate (pushes/s per replica; 0: no cap, the fake answers at once)")
		quick       = flag.Bool("quick", false, "a smoke run: one rate of 200/s for 5 s after 2 s, 500 sockets")
		out         = flag.String("out", "benchmarks/e2e/out", "directory of the CSV and SVG")
		binary      = flag.String("spoolcast", "", "spoolcast binary (default: build ./cmd/spoolcast)")
		keep        = flag.Bool("keep", false, "keep the working directory (the processes' logs) after the run")
		relayArgs   = flag.String("relay-flags", "", "more flags for the relay, space-separated (e.g. --wake-up-interval 5ms)")
		centralArgs = flag.String("central-flags", "", "more flags for each central replica, space-separated")
		pgStats     = flag.Bool("pg-stats", false, "record Postgres's statements (pg_stat_statements) and print the costliest of each window")
		wave        = flag.Bool("wave", false, "kill (SIGKILL) the last replica in the middle of the last rate's window; its apps move to the others (needs -replicas 2 or more)")
		pprof       = flag.Bool("pprof", false, "profile the first replica's CPU (Go's pprof, on an --ops-listen address of its own) over each measured window, or over the wave; the profiles go to -out")
		every       = flag.Duration("sample", 0, "sample RSS, goroutines and table sizes this often, and report latency per interval (the soak: -duration 30m -sample 1m)")
		fanout      = flag.Int("fanout", 0, "fill topic \"everyone\" with this many members (not the benchmark's users) and post one event to it in the last rate's window, after at most 30 s of it; the last rate's window is then, unless -duration is given, long enough for the fan-out")
	)
	flag.Parse()
	durationSet := false
	flag.Visit(func(f *flag.Flag) { durationSet = durationSet || f.Name == "duration" })
	if *quick {
		*rates, *duration, *warmup, *sockets = "200", 5*time.Second, 2*time.Second, 500
	}
	cfg := config{sockets: *sockets, duration: *duration, warmup: *warmup, grace: *grace, replicas: *replicas,
		expoRate: *expoRate, out: *out, binary: *binary, keep: *keep, relayArgs: strings.Fields(*relayArgs), centralArgs: strings.Fields(*centralArgs), pgStats: *pgStats,
		wave: *wave, sample: *every, pprof: *pprof, fanout: *fanout}
	cfg.lastDuration = cfg.duration
	if cfg.fanout > 0 && !durationSet {
		cfg.lastDuration = defaultFanoutWindow(cfg.fanout)
	}
	for f := range strings.SplitSeq(*rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "e2e: -rates %q: want rates, such as 200,500,1000\n", *rates)
			os.Exit(2)
		}
		cfg.rates = append(cfg.rates, n)
	}
	if cfg.replicas < 1 || cfg.sockets < cfg.replicas {
		fmt.Fprintln(os.Stderr, "e2e: want at least one replica and a socket per replica")
		os.Exit(2)
	}
	if cfg.wave && cfg.replicas < 2 {
		fmt.Fprintln(os.Stderr, "e2e: -wave kills a replica: give -replicas 2 or more")
		os.Exit(2)
	}
	if cfg.fanout < 0 || cfg.fanout > 0 && cfg.wave {
		fmt.Fprintln(os.Stderr, "e2e: -fanout wants a number of members, and not with -wave (each takes the last rate's window)")
		os.Exit(2)
	}
	if cfg.sample < 0 {
		fmt.Fprintln(os.Stderr, "e2e: -sample must not be negative")
		os.Exit(2)
	}
	code, err := run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

type config struct {
	sockets, replicas, expoRate int
	rates                       []int
	duration, warmup, grace     time.Duration
	// lastDuration is the last rate's window: -duration, or under -fanout
	// without it, long enough for the fan-out.
	lastDuration           time.Duration
	fanout                 int // members of the broadcast's topic; 0: no broadcast
	out, binary            string
	keep                   bool
	relayArgs, centralArgs []string
	pgStats, wave, pprof   bool
	sample                 time.Duration
}

// pushLease is central's default push claim lease: the pushes a killed
// replica had claimed wait this long before another replica sends them.
const pushLease = 2 * time.Minute

func run(cfg config) (int, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// This process holds a socket per user and the generator's
	// connections; a replica holds its share of the sockets.
	if limit, err := raiseFileLimit(uint64(cfg.sockets + workers + 1024)); err != nil {
		fmt.Printf("e2e: open files limited to %d (%v): fewer sockets may open than asked\n", limit, err)
	} else {
		fmt.Printf("e2e: open-file limit %d\n", limit)
	}
	dir, err := os.MkdirTemp("", "spoolcast-e2e-")
	if err != nil {
		return 0, err
	}
	if err := os.Chmod(dir, 0o755); err != nil { // Postgres runs as its own user under root
		return 0, err
	}
	defer func() {
		if cfg.keep {
			fmt.Println("e2e: logs kept in", dir)
		} else {
			_ = os.RemoveAll(dir)
		}
	}()
	bin := cfg.binary
	if bin == "" {
		bin = filepath.Join(dir, "spoolcast")
		if out, err := exec.Command("go", "build", "-o", bin, "./cmd/spoolcast").CombinedOutput(); err != nil {
			return 0, fmt.Errorf("build spoolcast (run from the repository's root): %w\n%s", err, out)
		}
	}
	l := &ledger{}
	w, err := setUp(ctx, dir, bin, cfg, l)
	defer w.tearDown()
	if err != nil {
		return 0, fmt.Errorf("set up: %w (logs in %s; -keep keeps them)", err, dir)
	}
	// Filled before the apps open, so that the fill is timed alone.
	if cfg.fanout > 0 {
		if err := fillTopic(ctx, w.cluster.URL, cfg.fanout); err != nil {
			return 0, fmt.Errorf("fill the topic: %w", err)
		}
	}
	var bases []string
	for _, c := range w.centrals {
		bases = append(bases, c.base)
	}
	began := time.Now()
	a, err := openApps(ctx, bases, w.issuer, cfg.sockets, l)
	if err != nil {
		return 0, fmt.Errorf("open the apps: %w", err)
	}
	defer a.close()
	// The devices' statistics as a database in service has them: planned
	// on the empty table of the setup, each push read all 10,000 devices.
	// (Not the notifications': analyzed empty, they would be read by
	// scans until autovacuum analyzes them again.)
	if err := execOnce(ctx, w.cluster.URL, `ANALYZE devices`); err != nil {
		return 0, fmt.Errorf("analyze: %w", err)
	}
	fmt.Printf("e2e: %d users, a device and a stream each (%d WebSocket, %d SSE) on %d replica(s), in %s; %d CPUs, load average %s\n",
		cfg.sockets, (cfg.sockets+1)/2, cfg.sockets/2, cfg.replicas, time.Since(began).Round(100*time.Millisecond), runtime.NumCPU(), loadAverage())

	meters := []meter{{"relay", lastCPU(w.relay)}}
	for _, c := range w.centrals {
		meters = append(meters, meter{c.name, lastCPU(c)})
	}
	meters = append(meters, meter{"Postgres", w.cluster.CPU}, meter{"benchmark", selfCPU})

	var results []result
	for i, rate := range cfg.rates {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		last, rc := i == len(cfg.rates)-1, cfg
		if last {
			rc.duration = cfg.lastDuration
		}
		res := measure(ctx, rc, w, rate, l, a, meters, last)
		res.print()
		results = append(results, res)
	}
	l.mu.Lock()
	strays := l.strays
	l.mu.Unlock()
	code := report(cfg, results, strays, a.dropped.Load())
	if err := writeCSV(cfg, results); err != nil {
		return 0, err
	}
	if err := writeSVG(cfg, results); err != nil {
		return 0, err
	}
	fmt.Printf("\nwrote %s and %s\n", filepath.Join(cfg.out, "e2e.csv"), filepath.Join(cfg.out, "e2e.svg"))
	return code, nil
}

// meter reads one process's CPU time so far.
type meter struct {
	name string
	cpu  func() time.Duration
}

// lastCPU reads p's CPU time so far, or the last it read once p is gone
// (a replica the wave killed).
func lastCPU(p *proc) func() time.Duration {
	var last time.Duration
	return func() time.Duration {
		if d := procCPU(p.pid()); d > last {
			last = d
		}
		return last
	}
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// measure offers one rate: warm-up, the measured window (CPU read at its
// two ends), then the grace period for stragglers. With -wave, the last
// rate's window has a replica killed in its middle; with -fanout, a
// broadcast posted in it; with -sample, samples are taken throughout.
func measure(ctx context.Context, cfg config, w *world, rate int, l *ledger, a *apps, meters []meter, last bool) result {
	relay, pgURL := w.relay.base, w.cluster.URL
	scraped := append([]*proc{w.relay}, w.centrals...)
	rssOf := scraped
	total := int(float64(rate) * (cfg.warmup + cfg.duration).Seconds())
	evs := l.add(total)
	t0 := time.Now().Add(100 * time.Millisecond)
	from, to := t0.Add(cfg.warmup), t0.Add(cfg.warmup+cfg.duration)
	res := result{rate: rate, sockets: cfg.sockets, duration: cfg.duration, load: loadAverage()}
	var killedAt time.Time
	victim := w.centrals[len(w.centrals)-1]
	killed := make(chan struct{})
	if cfg.wave && last {
		go func() {
			defer close(killed)
			time.Sleep(time.Until(from.Add(cfg.duration / 2)))
			a.down.Store(int32(len(w.centrals) - 1))
			killedAt = time.Now()
			_ = victim.cmd.Process.Kill()
		}()
	} else {
		close(killed)
	}
	var broadcasted <-chan *fanoutResult
	postAt := fanoutAt(from, cfg.duration)
	withFanout := cfg.fanout > 0 && last
	if withFanout {
		broadcasted = broadcast(ctx, cfg, w, meters, from, postAt, to)
	}
	profiled := make(chan struct{})
	if cfg.pprof {
		profiles := []profileSpec{{from, cfg.duration, filepath.Join(cfg.out, fmt.Sprintf("e2e-%d.pprof", rate))}}
		switch {
		case cfg.wave && last:
			profiles = []profileSpec{{from.Add(cfg.duration / 2), 5 * time.Second, filepath.Join(cfg.out, fmt.Sprintf("e2e-%d-wave.pprof", rate))}}
		case withFanout:
			profiles = fanoutProfiles(cfg, rate, from, postAt)
		}
		go func() {
			defer close(profiled)
			for _, p := range profiles {
				time.Sleep(time.Until(p.start))
				if err := profile(w.centrals[0].ops, int(p.length.Seconds()), p.path); err != nil {
					fmt.Println("e2e: profile:", err)
				}
			}
		}()
	} else {
		close(profiled)
	}
	stopSampling := make(chan struct{})
	sampled := make(chan []sample, 1)
	if cfg.sample > 0 {
		go func() { sampled <- sampler(ctx, cfg.sample, pgURL, rssOf, t0, rate, stopSampling) }()
	} else {
		sampled <- nil
	}
	cpuDone := make(chan struct{})
	go func() {
		defer close(cpuDone)
		time.Sleep(time.Until(from))
		before := make([]time.Duration, len(meters))
		for i, m := range meters {
			before[i] = m.cpu()
		}
		countsBefore := scrapeAll(scraped)
		diskBefore, diskErr := readDiskWork(ctx, pgURL, w.relay.pid())
		if cfg.pgStats {
			_ = execOnce(ctx, pgURL, `SELECT pg_stat_statements_reset()`)
		}
		time.Sleep(time.Until(to))
		for i, m := range meters {
			res.cpu = append(res.cpu, named{m.name, m.cpu() - before[i]})
		}
		res.counters = perSecond(countsBefore, scrapeAll(scraped), cfg.duration)
		if diskAfter, err := readDiskWork(ctx, pgURL, w.relay.pid()); err == nil && diskErr == nil {
			res.disk = diskAfter.minus(diskBefore)
		}
		if cfg.pgStats && !withFanout { // the broadcast reads them, before it and during
			res.statements = costliest(ctx, pgURL, cfg.duration)
		}
		for _, p := range rssOf {
			res.rss = append(res.rss, namedBytes{p.name, procRSS(p.pid())})
		}
		res.load = loadAverage()
	}()
	res.lag = produce(ctx, relay, evs, rate, cfg.sockets, t0, l)
	<-cpuDone
	<-killed
	<-profiled
	close(stopSampling)
	if withFanout {
		// Its end is timed even when it outlasts the window.
		res.fanout = <-broadcasted
	}
	sent := time.Now()
	grace := cfg.grace
	if !killedAt.IsZero() {
		// The pushes the killed replica had claimed wait out its lease.
		grace = max(grace, pushLease+30*time.Second)
	}
	if withFanout {
		grace = max(grace, fanoutGrace)
	}
	for {
		frames, pushes := l.outstanding(evs)
		if frames == 0 && pushes == 0 || time.Since(sent) > grace || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.waited = time.Since(sent)
	// Duplicates come soon after the first copy, if they come.
	time.Sleep(time.Second)
	res.tally(l, evs, from, to)
	res.dropped = a.dropped.Load()
	if !killedAt.IsZero() {
		res.wave = tallyWave(l, evs, a.moved(), victim.name, killedAt, from, to)
		if ends, err := explainMissing(ctx, pgURL, l, evs); err != nil {
			fmt.Println("e2e: the missing pushes' dispatches:", err)
		} else {
			res.wave.pushEnds = ends
		}
	}
	if res.fanout != nil {
		res.fanout.tally(l, evs, from, to)
	}
	res.samples, res.ledger, res.evs, res.from = <-sampled, l, evs, from
	return res
}

// profileSpec is a CPU profile to take: from start, for length.
type profileSpec struct {
	start  time.Time
	length time.Duration
	path   string
}

// profile writes secs seconds of a process's CPU profile to path.
func profile(ops string, secs int, path string) error {
	client := http.Client{Timeout: time.Duration(secs+30) * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", strings.TrimPrefix(ops, "http://"), secs))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", ops, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	fmt.Println("e2e: profile written to", path)
	return f.Close()
}
