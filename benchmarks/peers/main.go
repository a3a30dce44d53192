// Command peers measures the relay against the durable ingest a team would
// build instead, all behind the relay's HTTP contract: POST /v1/events,
// 202 once the event is durable, 200 for a key already taken.
//
// The targets are the spoolcast relay (--sync full), Redis with an
// fsync'd append-only file behind a small HTTP front-end, NATS JetStream
// with file storage synced on every write behind one, and Postgres with one
// committed transaction per event behind one. Each runs as its own
// processes on loopback. Every target is first prefilled with -prefill
// events; each run starts from a copy of that data. Rounds alternate the
// targets; the table gives each target's median over the rounds.
//
// With -plot it also offers fixed request rates (open loop) to each target
// and draws p99 latency against achieved throughput into a PNG.
//
// The program re-executes itself with -serve to run a front-end.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	var (
		serve    = flag.String("serve", "", "internal: run the HTTP front-end for this backend (redis, nats, postgres)")
		listen   = flag.String("listen", "", "internal: the front-end's address")
		backend  = flag.String("backend", "", "internal: the front-end's backend address or URL")
		pool     = flag.Int("pool", 64, "connections each front-end keeps to its backend (Redis, Postgres)")
		conns    = flag.Int("conns", 64, "concurrent HTTP connections of the load generator")
		duration = flag.Duration("duration", 10*time.Second, "measured time per target and round")
		warmup   = flag.Duration("warmup", 2*time.Second, "unmeasured load per target before -duration")
		rounds   = flag.Int("rounds", 3, "rounds; each runs every target once, in turn (0: only -plot)")
		prefill  = flag.Int("prefill", 300_000, "events each target already keeps when a run starts")
		targets  = flag.String("targets", "relay,redis,nats,postgres", "targets to measure, comma-separated")
		plotOn   = flag.Bool("plot", false, "after the rounds, sweep fixed offered rates (open loop) and write -plot-out")
		rates    = flag.String("rates", "1000,2000,4000,8000,12000,16000", "offered rates of the -plot sweep, req/s, ascending")
		plotDur  = flag.Duration("plot-duration", 5*time.Second, "measured time per target and offered rate (after -warmup)")
		plotOut  = flag.String("plot-out", "latency.png", "PNG written by -plot")
		plotNote = flag.String("plot-note", "", "second title line of the PNG (e.g. the machine and date)")
		repo     = flag.String("repo", "../..", "spoolcast repository root, to build ./cmd/spoolcast from")
		spoolBin = flag.String("spoolcast", "", "spoolcast binary (default: built from -repo)")
		redisBin = flag.String("redis-server", "redis-server", "redis-server binary")
		natsBin  = flag.String("nats-server", "", "nats-server binary (default: built from this module's pinned tool)")
		pgBin    = flag.String("pg-bin", "", "directory of initdb and postgres (default: newest /usr/lib/postgresql/*/bin)")
		workdir  = flag.String("workdir", "", "directory for binaries and data (default: a new one under the system temp dir, removed at exit)")
	)
	flag.Parse()
	if *serve != "" {
		if err := serveFrontEnd(*serve, *listen, *backend, *pool); err != nil {
			fmt.Fprintf(os.Stderr, "peers -serve %s: %v\n", *serve, err)
			os.Exit(1)
		}
		return
	}
	cfg := config{
		conns: *conns, duration: *duration, warmup: *warmup, rounds: *rounds, prefill: *prefill, pool: *pool,
		targets: strings.Split(*targets, ","), plot: *plotOn, plotDuration: *plotDur, plotOut: *plotOut, plotNote: *plotNote,
		repo: *repo, spoolcast: *spoolBin, redisServer: *redisBin, natsServer: *natsBin, pgBin: *pgBin, workdir: *workdir,
	}
	for _, r := range strings.Split(*rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "peers: bad rate %q in -rates\n", r)
			os.Exit(2)
		}
		cfg.rates = append(cfg.rates, n)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

type config struct {
	conns, rounds, prefill, pool int
	duration, warmup             time.Duration
	targets                      []string
	plot                         bool
	rates                        []int
	plotDuration                 time.Duration
	plotOut, plotNote            string
	repo, spoolcast, redisServer string
	natsServer, pgBin, workdir   string
}

func run(cfg config) error {
	work := cfg.workdir
	if work == "" {
		var err error
		if work, err = os.MkdirTemp("", "peers-"); err != nil {
			return err
		}
		defer os.RemoveAll(work)
	}
	// Postgres runs as the postgres user when we are root: it must reach
	// its data directory under this one.
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(work, 0o755); err != nil {
		return err
	}
	env, err := prepare(cfg, work)
	if err != nil {
		return err
	}
	var tgs []*target
	for _, name := range cfg.targets {
		tg, err := env.target(strings.TrimSpace(name))
		if err != nil {
			return err
		}
		tgs = append(tgs, tg)
	}

	// Prefill once per target, through its own HTTP front, into a template
	// that every run copies.
	for _, tg := range tgs {
		start := time.Now()
		if err := prefillTarget(tg, filepath.Join(work, tg.name, "template"), cfg); err != nil {
			return fmt.Errorf("%s: prefill: %w", tg.name, err)
		}
		fmt.Printf("%-9s prefilled with %d events in %s\n", tg.name, cfg.prefill, time.Since(start).Round(time.Second))
	}

	all := make([][]runResult, len(tgs))
	for round := range cfg.rounds {
		// The device counts every process's writes: show what the rest of
		// the machine writes meanwhile.
		fmt.Printf("\nround %d of %d (device writes while idle: %.1f MB/s)\n", round+1, cfg.rounds, idleDeviceRate(work, 2*time.Second)/1e6)
		// Each round starts at the next target, so that no target always
		// follows the same one.
		for j := range tgs {
			i := (round + j) % len(tgs)
			tg := tgs[i]
			res, err := measureClosedLoop(tg, work, cfg)
			if err != nil {
				return fmt.Errorf("%s: %w", tg.name, err)
			}
			fmt.Printf("  %-9s %s\n", tg.name, res.line())
			all[i] = append(all[i], res)
		}
	}
	if cfg.rounds > 0 {
		printTable(cfg, tgs, all)
	}

	if cfg.plot {
		curves, err := sweep(tgs, work, cfg)
		if err != nil {
			return fmt.Errorf("sweep: %w", err)
		}
		printSweep(cfg, curves)
		if err := plotCurves(cfg, curves); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		fmt.Printf("\nwrote %s\n", cfg.plotOut)
	}
	return nil
}

// measureClosedLoop runs one target from a copy of its prefilled data under
// closed-loop load and reads what its processes wrote meanwhile.
func measureClosedLoop(tg *target, work string, cfg config) (runResult, error) {
	dir := filepath.Join(work, tg.name, "run")
	if err := copyTemplate(filepath.Join(work, tg.name, "template"), dir); err != nil {
		return runResult{}, err
	}
	defer os.RemoveAll(dir)
	inst, err := tg.start(dir, freeAddr(), true)
	if err != nil {
		return runResult{}, fmt.Errorf("start: %w", err)
	}
	defer inst.stop()
	if err := checkContract(inst.url); err != nil {
		return runResult{}, err
	}

	before := sampleCounters(inst, dir)
	res := closedLoop(inst.url, cfg.conns, cfg.warmup, cfg.duration)
	afterLoad := sampleCounters(inst, dir)
	// Work a store defers past the load (Postgres writes its data pages at
	// checkpoints) is charged to the events that caused it.
	if inst.settle != nil {
		if err := inst.settle(); err != nil {
			return runResult{}, fmt.Errorf("settle: %w", err)
		}
	}
	settled := sampleCounters(inst, dir)
	return runResult{load: res, written: settled.sub(before), cpu: afterLoad.sub(before).cpu}, nil
}

type runResult struct {
	load    loadResult
	written counters // over the whole load and the settle step
	cpu     time.Duration
}

func (r runResult) perEvent(n int64) float64 {
	if r.load.acceptedAll == 0 {
		return 0
	}
	return float64(n) / float64(r.load.acceptedAll)
}

func (r runResult) line() string {
	return fmt.Sprintf("%8.0f req/s  p50 %-9s p99 %-9s  %6.0f B/event (processes)  %6.0f B/event (device)  %4.0f µs CPU/event  non-2xx %d, errors %d",
		r.load.rps(), round(r.load.p50), round(r.load.p99), r.perEvent(r.written.writeBytes), r.perEvent(r.written.deviceBytes),
		r.perEvent(r.cpu.Microseconds()), r.load.non2xx(), r.load.errors)
}

func round(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }

func printTable(cfg config, tgs []*target, all [][]runResult) {
	fmt.Printf("\n%d connections, %s measured after %s warm-up per run, ~300-byte random-UUIDv4-key events, %d events prefilled, %d rounds (targets alternate), %d CPUs\n\n",
		cfg.conns, cfg.duration, cfg.warmup, cfg.prefill, cfg.rounds, runtime.NumCPU())
	fmt.Println("| target | median req/s | p50 | p99 | disk bytes/event, processes' write_bytes | disk bytes/event, device | server CPU/event | non-2xx | errors |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for i, tg := range tgs {
		var rps, written, device, cpu []float64
		var p50, p99 []time.Duration
		var non2xx, errs int64
		for _, r := range all[i] {
			rps = append(rps, r.load.rps())
			p50, p99 = append(p50, r.load.p50), append(p99, r.load.p99)
			written = append(written, r.perEvent(r.written.writeBytes))
			device = append(device, r.perEvent(r.written.deviceBytes))
			cpu = append(cpu, r.perEvent(r.cpu.Microseconds()))
			non2xx += r.load.non2xx()
			errs += r.load.errors
		}
		fmt.Printf("| %s | %.0f | %s | %s | %.0f | %.0f | %.0f µs | %d | %d |\n", tg.label, median(rps), round(median(p50)), round(median(p99)),
			median(written), median(device), median(cpu), non2xx, errs)
	}
}

func median[T int64 | float64 | time.Duration](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// copyTemplate makes dir a copy of template, ownership kept (Postgres's
// data belongs to the postgres user).
func copyTemplate(template, dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	out, err := exec.Command("cp", "-a", template, dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s: %w: %s", template, err, out)
	}
	return nil
}

// prefillTarget starts tg on a fresh directory with its durability relaxed
// (the data it leaves is the same, only written sooner), sends it n events
// and stops it cleanly, so that everything reaches the files.
func prefillTarget(tg *target, dir string, cfg config) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if tg.init != nil {
		if err := tg.init(dir); err != nil {
			return fmt.Errorf("init: %w", err)
		}
	}
	inst, err := tg.start(dir, freeAddr(), false)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if err := checkContract(inst.url); err != nil {
		inst.stop()
		return err
	}
	err = fill(context.Background(), inst.url, cfg.conns, cfg.prefill)
	if stopErr := inst.stop(); err == nil {
		err = stopErr
	}
	return err
}
