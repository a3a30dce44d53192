// Command chaos runs the whole of spoolcast under the faults production
// brings, then checks that nothing was lost, nothing doubled and nothing
// stuck, and prints one row per invariant with the counts behind it. It
// exits non-zero on any violation.
//
//	go run ./benchmarks/chaos -duration 10m -seed 42
//	make chaos-selfcheck   # planted defects, in the system and in Postgres; must fail
//
// It starts, on this machine, a Postgres primary with a synchronous
// streaming standby, two relays (each spool on a volume of its own), two
// central replicas, a fake Expo, an OIDC issuer and a preference service,
// then drives producers and apps for the duration while injecting each
// fault at least once. It needs root (the spool volumes are tmpfs mounts)
// and Postgres's server binaries.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

func main() {
	defaultDuration, _ := time.ParseDuration(cmp.Or(os.Getenv("CHAOS_DURATION"), "10m"))
	defaultSeed, _ := strconv.ParseUint(os.Getenv("CHAOS_SEED"), 10, 64)
	var (
		duration  = flag.Duration("duration", defaultDuration, "how long producers and apps run while faults are injected (env CHAOS_DURATION)")
		seed      = flag.Uint64("seed", defaultSeed, "seed of the faults' order and moments and of the traffic (env CHAOS_SEED; 0 picks one)")
		selfcheck = flag.Bool("selfcheck", false, "plant a duplicate and a stuck dispatch in Postgres before checking (run it against a binary built with -tags chaosdefects, which plants three more): the run must report all and fail")
		binary    = flag.String("spoolcast", "", "spoolcast binary (default: build ./cmd/spoolcast)")
		keep      = flag.Bool("keep", false, "keep the working directory (logs of every process) after the run")
		inject    = flag.Bool("faults", true, "inject the faults; false runs the traffic alone (the self-check's short run)")
		scheduled = flag.Bool("scheduled", true, "send 5% of events with a send_at 2–20 s ahead")
	)
	flag.Parse()
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	fmt.Printf("chaos: duration %s, seed %d (replay with CHAOS_DURATION=%s CHAOS_SEED=%d)\n", *duration, *seed, *duration, *seed)
	scheduledEvents = *scheduled
	code, err := run(*duration, *seed, *selfcheck, *inject, *binary, *keep)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

func run(duration time.Duration, seed uint64, selfcheck, inject bool, binary string, keep bool) (int, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "spoolcast-chaos-")
	if err != nil {
		return 0, err
	}
	if err := os.Chmod(dir, 0o755); err != nil { // Postgres runs as its own user
		return 0, err
	}
	if binary == "" {
		binary = filepath.Join(dir, "spoolcast")
		if out, err := exec.Command("go", "build", "-o", binary, "./cmd/spoolcast").CombinedOutput(); err != nil {
			return 0, fmt.Errorf("build spoolcast (run from the repository's root): %w\n%s", err, out)
		}
	}
	w, err := setUp(ctx, dir, binary, seed)
	defer func() {
		w.tearDown()
		if keep {
			fmt.Println("chaos: logs kept in", dir)
		} else {
			_ = os.RemoveAll(dir)
		}
	}()
	if err != nil {
		return 0, fmt.Errorf("set up: %w (logs in %s)", err, dir)
	}
	if err := oldWeek(ctx, w); err != nil {
		return 0, err
	}
	began := time.Now()
	rng := rand.New(rand.NewPCG(seed, 1))
	l := newLedger()
	w.ledger = l
	if err := fillTopic(ctx, w); err != nil {
		return 0, err
	}
	procs := append(append([]*proc{}, w.relays...), w.centrals...)
	samples := newSampler()
	sctx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go samples.run(sctx, procs)

	var bases []string
	for _, c := range w.centrals {
		bases = append(bases, c.base)
	}
	apps := make([]*app, appUsers)
	for i := range apps {
		apps[i] = newApp(appUser(i), token(w.issuer, appUser(i)), bases, w.handovers)
	}
	streams, stopStreams := context.WithCancel(ctx)
	defer stopStreams()
	actions, stopActions := context.WithCancel(ctx)
	defer stopActions()
	var appsDone, actsDone sync.WaitGroup
	for i, a := range apps {
		arng := rand.New(rand.NewPCG(seed, uint64(100+i)))
		a.call(ctx, http.MethodPut, bases[0]+"/v1/devices", fmt.Sprintf(`{"token":"ExponentPushToken[%s]","platform":"ios"}`, a.user))
		if a.direct = directDevice(a.user, i); a.direct != "" {
			a.call(ctx, http.MethodPut, bases[0]+"/v1/devices", a.direct)
		}
		browser, err := w.web.webDevice(a.user, i)
		if err != nil {
			return 0, err
		}
		if browser != "" {
			if status, body := a.call(ctx, http.MethodPut, bases[0]+"/v1/devices", browser); status != http.StatusOK && status != http.StatusCreated {
				return 0, fmt.Errorf("register %s's browser: %d %s", a.user, status, body)
			}
		}
		appsDone.Go(func() { a.stream(streams, rand.New(rand.NewPCG(seed, uint64(200+i)))) })
		actsDone.Go(func() { a.act(actions, arng, apps) })
	}
	if err := plantStrays(ctx, w, apps, bases[0]); err != nil {
		return 0, err
	}
	produce, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	var producers sync.WaitGroup
	for n := range 6 {
		producers.Go(func() { producer(produce, w, l, seed, n) })
	}

	// The faults, in the seed's order, spread over the duration.
	var fs []fault
	if inject {
		fs = faults(duration)
	}
	rng.Shuffle(len(fs), func(i, j int) { fs[i], fs[j] = fs[j], fs[i] })
	orderFailovers(fs)
	var busy time.Duration
	for _, f := range fs {
		busy += f.takes
	}
	gap := max(2*time.Second, (duration-busy)/time.Duration(len(fs)+1))
	var done []injected
	for _, f := range fs {
		sleep(ctx, time.Duration(float64(gap)*(0.5+rng.Float64())))
		if ctx.Err() != nil {
			break
		}
		start := time.Now()
		detail, err := f.inject(ctx, w, rng)
		done = append(done, injected{name: f.name, at: start.Sub(began), took: time.Since(start), detail: detail, err: err})
		status := "ok"
		if err != nil {
			status = "FAILED: " + err.Error()
		}
		fmt.Printf("  %7s  %-55s %s (%s) %s\n", start.Sub(began).Round(time.Second), f.name, detail, time.Since(start).Round(100*time.Millisecond), status)
	}
	if rest := duration - time.Since(began); rest > 0 {
		sleep(ctx, rest)
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}

	fmt.Println("chaos: traffic stops; waiting for the relays, the apps and the pushes to settle")
	stopProducing()
	producers.Wait()
	stopActions()
	actsDone.Wait()
	db, err := pgx.Connect(ctx, w.dbURL)
	if err != nil {
		return 0, err
	}
	defer db.Close(context.WithoutCancel(ctx))
	// The self-check's binary drops frames, which no wait brings: its run
	// settles without faults, in seconds, or never.
	settleFor := 5 * time.Minute
	if selfcheck {
		settleFor = time.Minute
	}
	if err := settle(ctx, w, db, apps, settleFor); err != nil {
		return 0, err
	}
	stopStreams()
	appsDone.Wait()
	if selfcheck {
		if err := plant(ctx, db); err != nil {
			return 0, err
		}
	}
	for _, p := range procs {
		samples.take(p)
	}

	var rows []invariant
	faultsOK := len(done) == len(fs)
	var failed []string
	for _, d := range done {
		if d.err != nil {
			faultsOK = false
			failed = append(failed, d.name)
		}
	}
	rows = append(rows, invariant{"every fault was injected and healed", faultsOK,
		fmt.Sprintf("%d of %d injected; failed: %s", len(done), len(fs), strings.Join(failed, ", "))})
	stopped, cs, err := checkCancels(ctx, db, l, &w.loss)
	if err != nil {
		return 0, err
	}
	ev, err := checkEvents(ctx, db, l, stopped)
	if err != nil {
		return 0, err
	}
	rows = append(rows, ev...)
	rows = append(rows, cs...)
	ru, err := checkReuses(ctx, db, l)
	if err != nil {
		return 0, err
	}
	rows = append(rows, ru...)
	expected, err := expectedFeeds(ctx, db)
	if err != nil {
		return 0, err
	}
	rows = append(rows, checkApps(apps, expected, &w.loss)...)
	rs, err := checkReadState(ctx, apps, bases[0], &w.loss)
	if err != nil {
		return 0, err
	}
	rows = append(rows, rs...)
	ps, err := checkPushes(ctx, db, w)
	if err != nil {
		return 0, err
	}
	rows = append(rows, ps...)
	rf, err := checkRefusals(ctx, db, w, samples)
	if err != nil {
		return 0, err
	}
	rows = append(rows, rf...)
	ds, err := checkPolicies(ctx, db, w, l)
	if err != nil {
		return 0, err
	}
	rows = append(rows, ds...)
	wh, err := checkWebhooks(ctx, db, w.receiver)
	if err != nil {
		return 0, err
	}
	rows = append(rows, wh...)
	rows = append(rows, checkProcesses(l, samples, procs)...)

	violations := 0
	fmt.Printf("\n| invariant | holds | counts |\n|---|---|---|\n")
	for _, r := range rows {
		mark := "yes"
		if !r.ok {
			mark = "**NO**"
			violations++
		}
		fmt.Printf("| %s | %s | %s |\n", r.name, mark, r.counts)
	}
	fmt.Printf("\nchaos: %d violations in %s (seed %d; %s)\n", violations, time.Since(began).Round(time.Second), seed, w.loss.String())
	if violations > 0 {
		return 1, nil
	}
	return 0, nil
}

// oldWeek makes an empty partition of a week past the retention, which the
// maintenance fault's pass drops.
func oldWeek(ctx context.Context, w *world) error {
	conn, err := pgx.Connect(ctx, w.dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `SELECT spoolcast_ensure_week_partition('notifications', now() - interval '100 days', 5000)`)
	return err
}

// settle waits until the relays have forwarded everything, every app's
// socket has caught up with its user's notifications, and every dispatch
// has ended; then a little longer for the read frames in flight.
func settle(ctx context.Context, w *world, db *pgx.Conn, apps []*app, within time.Duration) error {
	deadline := time.Now().Add(within)
	wait := func(what string, done func() (bool, error)) error {
		began := time.Now()
		for {
			ok, err := done()
			if err == nil && ok {
				// Where a run's time goes: each wait, in order.
				fmt.Printf("chaos: %s in %s\n", what, time.Since(began).Round(100*time.Millisecond))
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("timed out waiting for %s (last error %v)", what, err)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			sleep(ctx, time.Second)
		}
	}
	if err := wait("the relays to forward their spools", func() (bool, error) {
		for _, r := range w.relays {
			m, err := metrics(r.base, "spoolcast_spool_pending")
			if err != nil || m["spoolcast_spool_pending"] > 0 {
				return false, err
			}
		}
		return true, nil
	}); err != nil {
		return err
	}
	if err := wait("scheduled notifications to fire", func() (bool, error) {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM scheduled_notifications WHERE cancelled_at IS NULL`).Scan(&n)
		return n == 0, err
	}); err != nil {
		if ctx.Err() != nil {
			return err
		}
		fmt.Println("chaos:", err)
	}
	if err := wait("topic fan-outs to complete", func() (bool, error) {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM topic_fanouts WHERE state IN ('pending', 'running')`).Scan(&n)
		return n == 0, err
	}); err != nil {
		if ctx.Err() != nil {
			return err
		}
		fmt.Println("chaos:", err)
	}
	if err := wait("every app to catch up", func() (bool, error) {
		expected, err := expectedFeeds(ctx, db)
		if err != nil {
			return false, err
		}
		for _, a := range apps {
			a.mu.Lock()
			behind := 0
			for id := range expected[a.user] {
				if a.frames[id] == 0 && !a.loaded[id] {
					behind++
				}
			}
			a.mu.Unlock()
			if behind > 0 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		if ctx.Err() != nil {
			return err
		}
		fmt.Println("chaos:", err) // the check below says which notifications
	}
	// One snapshot: a digest is opened by a dispatcher taking its member off
	// the push queue, and its push is queued by the firer deleting it, so
	// work moves between these tables but is never outside all of them.
	if err := wait("every dispatch, digest and webhook delivery to end", func() (bool, error) {
		var n int
		err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM push_dispatches WHERE state IN ('queued', 'sent')) + (SELECT count(*) FROM push_queue) + (SELECT count(*) FROM push_digests) + (SELECT count(*) FROM scheduled_notifications WHERE cancelled_at IS NULL)
			+ (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending')`).Scan(&n)
		return n == 0, err
	}); err != nil {
		if ctx.Err() != nil {
			return err
		}
		fmt.Println("chaos:", err)
	}
	sleep(ctx, 3*time.Second)
	return nil
}

// metrics reads base's /metrics once and answers each family of names:
// the sum of its series (one for a metric without labels), or an error
// naming the first that is not exported.
func metrics(base string, names ...string) (map[string]float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := make(map[string]float64, len(names))
	for line := range strings.SplitSeq(string(raw), "\n") {
		for _, name := range names {
			rest, ok := strings.CutPrefix(line, name)
			if !ok || (!strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{")) {
				continue
			}
			f := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
			if len(f) == 0 {
				continue
			}
			v, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				return nil, err
			}
			out[name] += v
		}
	}
	for _, name := range names {
		if _, ok := out[name]; !ok {
			return nil, fmt.Errorf("%s not exported by %s", name, base)
		}
	}
	return out, nil
}

// plant makes two violations in Postgres the checks must find: a
// notification stored twice and a dispatch stuck queued. The self-check's
// binary (-tags chaosdefects, internal/chaosplant) plants three more
// through the running system: an event acknowledged and never stored, a
// push sent twice and a live frame dropped.
func plant(ctx context.Context, db *pgx.Conn) error {
	if _, err := db.Exec(ctx, `INSERT INTO notifications (user_id, created_at, received_at, type, category, title, body, data, producer, idempotency_key, notification_key)
		SELECT user_id, created_at, received_at, type, category, title, body, data, producer, idempotency_key, notification_key || ':planted'
		FROM notifications WHERE user_id LIKE 'bulk-%' LIMIT 1`); err != nil {
		return fmt.Errorf("plant a duplicate: %w", err)
	}
	if _, err := db.Exec(ctx, `UPDATE push_dispatches SET state = 'queued' WHERE id = (SELECT id FROM push_dispatches WHERE state = 'delivered' LIMIT 1)`); err != nil {
		return fmt.Errorf("plant a stuck dispatch: %w", err)
	}
	fmt.Println("chaos: planted a duplicate and a stuck dispatch in Postgres")
	return nil
}
