// Command channelbench measures how many pushes a second the APNs and FCM
// channels (channel/apns, channel/fcm) send into their fakes, against a
// bare loop making the same requests with nothing around them, and the CPU
// a push costs each.
//
//	go run ./benchmarks/channelbench                           # both, 20,000 pushes a run, 3 runs
//	go run ./benchmarks/channelbench -provider apns -n 50000
//	go run ./benchmarks/channelbench -cpuprofile cpu.out       # then: go tool pprof -tags cpu.out
//
// Each measurement starts a fresh fake on loopback, in this process
// (apnstest: TLS and HTTP/2, one connection; fcmtest: plain HTTP/1.1, and
// its OAuth token endpoint), sends -warmup pushes, then times -n more:
//
//   - channel: the real Channel's Send, handed batches of its MaxBatch,
//     -batches of them in flight, the next as one ends, as the dispatcher's
//     workers hand over their passes (push's channelSend); the channel
//     bounds its requests in flight to 100 (its default Concurrency);
//   - bare: 100 goroutines making the same requests (the same headers and
//     payload size, built before the clock starts; a JWT signed once for
//     APNs, an access token fetched once for FCM) on the same transport,
//     checking only the status.
//
// Throughput is closed loop: a request goes as soon as one of the 100 in
// flight is answered, so the figure is what the machine can do, not what a
// schedule offered. Runs alternate which side goes first, and each
// figure is the median of -runs; the ratio is the median of the runs'
// channel ÷ bare.
//
// CPU per push is the process's user+sys time (getrusage) over the timed
// pushes, divided by them. The fake runs in this process, so both rows
// include its share, the same for both; the difference between the rows is
// what the channel costs over the bare client. -cpuprofile labels each
// goroutine with its provider and side=fake, channel or bare, and the
// fake's with client=channel or bare (unlabelled: the runtime's own, GC
// workers mostly), so that `go tool pprof -tags` splits the CPU.
//
// The fakes cost a request about what the clients do (they check every
// request; apnstest verifies each JWT's signature once), so -server sink sends the
// runs to a server of this program's instead, which answers as the
// provider does when all is well and checks nothing: what each side's
// client costs when the server costs next to nothing. The check that both
// sides send the same request still runs against the fakes.
//
// It exits non-zero on errors only (a push the fake did not take is one),
// not on a ratio under the target.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spoolcast/spoolcast/benchmarks/internal/benchfmt"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/feed"
)

const (
	// concurrency is the most requests in flight, on either side: the
	// channels' default Concurrency.
	concurrency = 100
	// target is the least channel ÷ bare wanted.
	target = 0.8
)

func main() {
	n := flag.Int("n", 20_000, "pushes timed in each run")
	runs := flag.Int("runs", 3, "runs of each side; the figures are their medians")
	which := flag.String("provider", "both", "apns, fcm or both")
	warmup := flag.Int("warmup", 500, "pushes sent before each run's clock starts")
	batches := flag.Int("batches", 4, "the channel's batches in flight (two dispatcher workers, a pass's 500 notifications to about two devices each)")
	server := flag.String("server", "fake", "what the runs send to: fake (apnstest, fcmtest) or sink (a server in this program that checks and keeps nothing)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the runs to this file, goroutines labelled provider, side=fake|channel|bare and the fake's client=channel|bare")
	flag.Parse()
	if *n < 1 || *runs < 1 || *warmup < 0 || *batches < 1 || *server != "fake" && *server != "sink" {
		fmt.Fprintln(os.Stderr, "channelbench: want -n, -runs and -batches ≥ 1, -warmup ≥ 0, -server fake or sink")
		os.Exit(2)
	}
	var names []string
	switch *which {
	case "apns", "fcm":
		names = []string{*which}
	case "both":
		names = []string{"apns", "fcm"}
	default:
		fmt.Fprintf(os.Stderr, "channelbench: -provider %q: want apns, fcm or both\n", *which)
		os.Exit(2)
	}
	if err := run(names, *n, *runs, *warmup, *batches, *server == "sink", *cpuProfile); err != nil {
		fmt.Fprintln(os.Stderr, "channelbench:", err)
		os.Exit(1)
	}
}

// A provider is one channel and its fake, and the bare loop beside it.
type provider interface {
	// name is how the tables call it.
	name() string
	// setup says what a request carries, after checking that the channel's
	// and the bare loop's requests carry the same.
	setup(ctx context.Context) (string, error)
	// start starts a fresh fake and one side's client of it.
	start(side string) (rig, error)
}

// A rig is a fresh fake and one side's client of it.
type rig interface {
	// push sends messages [lo, hi), closed loop, and fails if the fake did
	// not take one.
	push(ctx context.Context, lo, hi int) error
	// seen is what the fake saw: the most requests in flight at once,
	// and the connections they came on (0: not counted).
	seen() (inFlight, conns int)
	close()
}

// The sides.
const (
	sideChannel = "channel"
	sideBare    = "bare"
)

// result is one timed run of one side.
type result struct {
	rate            float64 // pushes a second
	cpu             float64 // µs of CPU (user+sys) a push, the fake's included
	allocs          float64 // heap allocations a push, the fake's included
	inFlight, conns int
}

func run(names []string, n, runs, warmup, batches int, sink bool, cpuProfile string) error {
	ctx := context.Background()
	total := warmup + n
	fmt.Printf("channelbench: %s pushes timed a run after %d of warm-up, %d runs a side, closed loop, %d requests in flight;\n"+
		"the channel's batches of its MaxBatch, %d in flight; %s, GOMAXPROCS %d, %d CPUs\n\n",
		commas(n), warmup, runs, concurrency, batches, runtime.Version(), runtime.GOMAXPROCS(0), runtime.NumCPU())

	var provs []provider
	for _, name := range names {
		var p provider
		var err error
		switch name {
		case "apns":
			p = newAPNs(total, batches, sink)
		case "fcm":
			if p, err = newFCM(total, batches, sink); err != nil {
				return err
			}
		}
		what, err := p.setup(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name(), err)
		}
		fmt.Printf("%s: %s\n", p.name(), what)
		provs = append(provs, p)
	}
	fmt.Println()

	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	type report struct {
		name          string
		channel, bare []result
		ratios, extra []float64 // each run's channel ÷ bare, and channel − bare CPU µs a push
	}
	var reports []report
	for _, p := range provs {
		rep := report{name: p.name()}
		for r := range runs {
			// Alternate which side goes first, to spread the drift of a
			// shared machine over both.
			order := []string{sideChannel, sideBare}
			if r%2 == 1 {
				order = []string{sideBare, sideChannel}
			}
			got := map[string]result{}
			for _, side := range order {
				res, err := measure(ctx, p, side, warmup, n)
				if err != nil {
					return fmt.Errorf("%s, %s side, run %d: %w", p.name(), side, r+1, err)
				}
				got[side] = res
			}
			ch, bare := got[sideChannel], got[sideBare]
			rep.channel, rep.bare = append(rep.channel, ch), append(rep.bare, bare)
			rep.ratios = append(rep.ratios, ch.rate/bare.rate)
			rep.extra = append(rep.extra, ch.cpu-bare.cpu)
			fmt.Printf("%s run %d (%s first): channel %s pushes/s, %.1f µs CPU a push; bare %s pushes/s, %.1f µs; channel ÷ bare %.2f\n",
				p.name(), r+1, order[0], commas(int(ch.rate)), ch.cpu, commas(int(bare.rate)), bare.cpu, ch.rate/bare.rate)
		}
		fmt.Println()
		reports = append(reports, rep)
	}
	pprof.StopCPUProfile()

	field := func(rs []result, f func(result) float64) float64 {
		var xs []float64
		for _, r := range rs {
			xs = append(xs, f(r))
		}
		return median(xs)
	}
	rate := func(r result) float64 { return r.rate }
	cpu := func(r result) float64 { return r.cpu }
	allocs := func(r result) float64 { return r.allocs }

	fmt.Printf("Medians of %d runs, %s pushes each (CPU: the whole process, the fake's share included; ÷ and −: medians of the runs' own):\n\n", runs, commas(n))
	fmt.Println("| provider | channel pushes/s | bare pushes/s | channel ÷ bare | CPU µs/push, channel | bare | channel − bare | allocs/push, channel | bare |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, rep := range reports {
		fmt.Printf("| %s | %s | %s | **%.2f** | %.1f | %.1f | %.1f | %.0f | %.0f |\n", rep.name,
			commas(int(field(rep.channel, rate))), commas(int(field(rep.bare, rate))), median(rep.ratios),
			field(rep.channel, cpu), field(rep.bare, cpu), median(rep.extra), field(rep.channel, allocs), field(rep.bare, allocs))
	}
	fmt.Println()
	for _, rep := range reports {
		var rs []string
		for _, x := range rep.ratios {
			rs = append(rs, fmt.Sprintf("%.2f", x))
		}
		verdict := "met"
		if median(rep.ratios) < target {
			verdict = "NOT met"
		}
		last := rep.channel[len(rep.channel)-1]
		conns := ""
		if last.conns > 0 {
			conns = fmt.Sprintf(", on %d connection(s)", last.conns)
		}
		fmt.Printf("%s: channel ÷ bare by run %s; target ≥ %.1f %s. The fake held at most %d of the channel's requests at once%s.\n",
			rep.name, strings.Join(rs, ", "), target, verdict, last.inFlight, conns)
	}
	return nil
}

// measure starts a fresh fake and side's client, warms up, and times n
// pushes.
func measure(ctx context.Context, p provider, side string, warmup, n int) (result, error) {
	var rg rig
	var err error
	// The fake's goroutines (its listener's, and each connection's and
	// request's, which it starts) carry its label, and the client's side.
	pprof.Do(ctx, pprof.Labels("provider", p.name(), "side", "fake", "client", side), func(context.Context) { rg, err = p.start(side) })
	if err != nil {
		return result{}, err
	}
	defer rg.close()
	var res result
	pprof.Do(ctx, pprof.Labels("provider", p.name(), "side", side), func(ctx context.Context) {
		if warmup > 0 {
			if err = rg.push(ctx, 0, warmup); err != nil {
				err = fmt.Errorf("warm-up: %w", err)
				return
			}
		}
		runtime.GC() // each run starts with the same heap: none of the last run's garbage
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		cpu := cpuTime()
		start := time.Now()
		err = rg.push(ctx, warmup, warmup+n)
		took := time.Since(start)
		used := cpuTime() - cpu
		runtime.ReadMemStats(&after)
		res = result{
			rate:   float64(n) / took.Seconds(),
			cpu:    float64(used.Microseconds()) / float64(n),
			allocs: float64(after.Mallocs-before.Mallocs) / float64(n),
		}
	})
	if err != nil {
		return result{}, err
	}
	res.inFlight, res.conns = rg.seen()
	return res, nil
}

// messages are the run's messages, one a device, as the dispatcher builds
// them (push's channelMessage) for a job's notification: a feed id, a
// title and a body, a category, no data, not urgent, the channel's default
// expiry.
func messages(total int, token func(i int) string) []channel.Message {
	created := time.Now().Add(-time.Minute)
	msgs := make([]channel.Message, total)
	for i := range msgs {
		msgs[i] = channel.Message{
			Token:    token(i),
			ID:       feed.ID{CreatedAt: created.Add(time.Duration(i) * time.Microsecond), Seq: int64(1_000_000 + i)}.String(),
			Title:    "Nightly export finished",
			Body:     "Your export of 12,345 rows is ready to download.",
			Category: "jobs",
		}
	}
	return msgs
}

// sendBatches sends msgs through ch in batches of its MaxBatch, inFlight
// batches at once, the next as soon as one is answered: as the
// dispatcher's workers call it, each pass's batches in parallel. Every
// message must be delivered.
func sendBatches(ctx context.Context, ch channel.Channel, msgs []channel.Message, inFlight int) error {
	size := max(1, ch.MaxBatch())
	var next atomic.Int64
	var failed atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range inFlight {
		wg.Go(func() {
			for {
				lo := int(next.Add(int64(size))) - size
				if lo >= len(msgs) {
					return
				}
				hi := min(lo+size, len(msgs))
				for i, o := range ch.Send(ctx, msgs[lo:hi]) {
					if o.Kind != channel.Delivered {
						failed.Add(1)
						once.Do(func() { first = fmt.Errorf("message %d: %s: %s", lo+i, o.Kind, o.Reason) })
					}
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("%d of %d not delivered, the first: %w", n, len(msgs), first)
	}
	return nil
}

// commas writes n with thousands separators.
func commas(n int) string { return benchfmt.Commas(n) }

// firstPushes sends msg once through ch and once by the bare loop (its
// message 0), for the fake to compare the two requests.
func firstPushes(ctx context.Context, ch channel.Channel, msg channel.Message, bare func(context.Context, int) error) error {
	if out := ch.Send(ctx, []channel.Message{msg}); out[0].Kind != channel.Delivered {
		return fmt.Errorf("the channel's first push: %s: %s", out[0].Kind, out[0].Reason)
	}
	if err := bare(ctx, 0); err != nil {
		return fmt.Errorf("the bare loop's first push: %w", err)
	}
	return nil
}

// bareLoop calls do for each of [lo, hi) from concurrency goroutines, the
// next as soon as one returns. Every call must succeed.
func bareLoop(lo, hi int, do func(i int) error) error {
	var next atomic.Int64
	next.Store(int64(lo))
	var failed atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= hi {
					return
				}
				if err := do(i); err != nil {
					failed.Add(1)
					once.Do(func() { first = fmt.Errorf("message %d: %w", i, err) })
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("%d of %d failed, the first: %w", n, hi-lo, first)
	}
	return nil
}

// cpuTime is the user and system CPU this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err) // RUSAGE_SELF with a valid pointer cannot fail
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sameShape reports how two requests for the same message differ in what
// they carry, nil when they do not: the header names, each value's length
// (the JWTs and expirations differ in their bytes) and the payload's.
func sameShape(chHeader, bareHeader map[string][]string, chPayload, barePayload []byte) error {
	var errs []error
	for k := range chHeader {
		if _, ok := bareHeader[k]; !ok {
			errs = append(errs, fmt.Errorf("header %s: the channel's request has it, the bare one's not", k))
		}
	}
	for k, v := range bareHeader {
		w, ok := chHeader[k]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("header %s: the bare request has it, the channel's not", k))
		case len(strings.Join(v, ",")) != len(strings.Join(w, ",")):
			errs = append(errs, fmt.Errorf("header %s: %q (bare) and %q (channel) differ in length", k, v, w))
		}
	}
	if len(chPayload) != len(barePayload) {
		errs = append(errs, fmt.Errorf("payload: %d bytes (channel) and %d (bare):\n  %s\n  %s", len(chPayload), len(barePayload), chPayload, barePayload))
	}
	return errors.Join(errs...)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
