// Command livebench measures the live stream on this machine:
//
//   - memory per idle authenticated connection: central's RSS (and Go heap)
//     before and after opening -conns sockets, against a bare gobwas server
//     (upgrade, then one goroutine per connection blocked reading) measured
//     with the same client in the same run;
//   - commit → frame latency: with those sockets open, -rate notifications
//     per second are committed (batches every 10ms, one recipient each, a
//     random connected user) and woken as a relay's forwarder wakes; each
//     frame's latency is its arrival at the client minus the return of the
//     commit that wrote it;
//   - live reading per replica (-reading-replicas): with 1, then 4, central
//     replicas holding a few sockets each and -reading-rate notifications a
//     second, the Postgres CPU of the backends serving the replicas' readers,
//     per replica and per read, and the whole cluster's;
//   - the reconnect wave (-wave-movers): a replica holding that many sockets
//     is killed and all of them reconnect with their cursors to a second
//     replica, which meanwhile streams -wave-rate notifications a second to
//     -wave-stayers sockets of its own: time until every moved socket is
//     ready, Postgres CPU per resume, and the stayers' commit → frame latency
//     during the wave.
//
// With -wave-compare, the reading runs and the wave also run with another
// spoolcast binary, rounds alternating. Postgres CPU is that of the
// benchmark's own cluster alone (its postmaster's processes), so that other
// clusters on the machine do not count.
//
// Central runs as a subprocess of the real binary on a durable Postgres
// cluster of its own; the client sockets live in this process. A process
// here may hold at most ~20,000 open files, which bounds -conns.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/devauth"
	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/migrations"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

func main() {
	var (
		conns       = flag.Int("conns", 10000, "sockets to open (one user each)")
		rate        = flag.Int("rate", 1000, "notifications committed per second during the latency run")
		duration    = flag.Duration("duration", 30*time.Second, "length of the latency run")
		bare        = flag.String("bare-server", "", "internal: serve a bare gobwas server on this address")
		movers      = flag.Int("wave-movers", 10000, "sockets of the replica the wave kills (0: no wave)")
		stayers     = flag.Int("wave-stayers", 500, "sockets of the replica that survives the wave")
		waveRate    = flag.Int("wave-rate", 500, "notifications a second to the stayers during the wave")
		compare     = flag.String("wave-compare", "", "another spoolcast binary to run the same reading runs and wave with, rounds alternating")
		rounds      = flag.Int("wave-rounds", 2, "waves per binary")
		onlyWave    = flag.Bool("only-wave", false, "run only the wave")
		rReplicas   = flag.String("reading-replicas", "1,4", "replica counts of the reading runs, comma-separated (empty: no reading run)")
		rSockets    = flag.Int("reading-sockets", 50, "sockets per replica during the reading runs")
		rRate       = flag.Int("reading-rate", 500, "notifications committed per second during the reading runs")
		rWindow     = flag.Duration("reading-window", 10*time.Second, "how long each reading run measures")
		rRounds     = flag.Int("reading-rounds", 2, "reading runs per binary and replica count")
		onlyReading = flag.Bool("only-reading", false, "run only the reading runs")
	)
	flag.Parse()
	if *bare != "" {
		serveBare(*bare)
		return
	}
	raiseFileLimit()
	w := waveConfig{movers: *movers, stayers: *stayers, rate: *waveRate, compare: *compare, rounds: *rounds, only: *onlyWave}
	rd := readingConfig{sockets: *rSockets, rate: *rRate, window: *rWindow, rounds: *rRounds, only: *onlyReading}
	for _, f := range strings.Split(*rReplicas, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "livebench: -reading-replicas %q: want replica counts, such as 1,4\n", *rReplicas)
			os.Exit(2)
		}
		rd.replicas = append(rd.replicas, n)
	}
	if err := run(*conns, *rate, *duration, rd, w); err != nil {
		fmt.Fprintln(os.Stderr, "livebench:", err)
		os.Exit(1)
	}
}

// waveConfig is the reconnect wave's flags.
type waveConfig struct {
	movers, stayers, rate, rounds int
	compare                       string
	only                          bool
}

// readingConfig is the reading runs' flags.
type readingConfig struct {
	replicas              []int
	sockets, rate, rounds int
	window                time.Duration
	only                  bool
}

// env is what every run shares: the cluster, the token issuer and its JWKS.
type env struct {
	dbURL, jwksURL string
	cluster        *pgcluster.Cluster // to read its CPU by
	issuer         *devauth.Issuer
	pool           *pgxpool.Pool
}

func run(conns, rate int, duration time.Duration, reading readingConfig, wave waveConfig) error {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "livebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil { // Postgres may run as another user
		return err
	}
	bin := filepath.Join(tmp, "spoolcast")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/spoolcast").CombinedOutput(); err != nil {
		return fmt.Errorf("build spoolcast (run from the repository root): %v\n%s", err, out)
	}
	pgDir := filepath.Join(tmp, "pg")
	cluster, err := pgcluster.Start(ctx, pgcluster.Config{Dir: pgDir, Durable: true, Settings: []string{"max_connections=200"}})
	if err != nil {
		return err
	}
	defer cluster.Stop()
	if _, err := migrations.Up(ctx, cluster.URL, nil); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, cluster.URL)
	if err != nil {
		return err
	}
	defer pool.Close()

	issuer, err := devauth.LoadIssuer(filepath.Join(tmp, "key.pem"), "livebench", "spoolcast")
	if err != nil {
		return err
	}
	jwks := httptest.NewServer(issuer.JWKS())
	defer jwks.Close()
	tokens := make([]string, conns)
	for i := range tokens {
		if tokens[i], err = issuer.Mint(user(i), nil, 2*time.Hour); err != nil {
			return err
		}
	}

	e := env{dbURL: cluster.URL, jwksURL: jwks.URL, cluster: cluster, issuer: issuer, pool: pool}
	switch {
	case wave.only:
		return waves(ctx, e, bin, wave)
	case reading.only:
		return readings(ctx, e, bin, wave.compare, reading)
	}

	// The baseline: a bare gobwas server, same client, same count.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	bareAddr := freeAddr()
	bareProc, err := startProcess(self, "-bare-server", bareAddr)
	if err != nil {
		return err
	}
	bareBase := "http://" + bareAddr
	if err := waitHTTP(bareBase + "/healthz"); err != nil {
		return err
	}
	bareMem, bareSockets, err := measureIdle(bareProc.Process.Pid, bareBase, tokens, false)
	closeAll(bareSockets)
	stop(bareProc)
	if err != nil {
		return fmt.Errorf("bare server: %w", err)
	}

	central, base, err := startCentral(e, bin, "--log-level", "warn")
	if central != nil {
		defer stop(central)
	}
	if err != nil {
		return err
	}
	mem, sockets, err := measureIdle(central.Process.Pid, base, tokens, true)
	defer closeAll(sockets)
	if err != nil {
		return err
	}
	fmt.Printf("idle sockets: %d (RSS measured %s after the last one opened)\n", conns, settle)
	fmt.Printf("  bare gobwas: %6.2f KB RSS per socket\n", bareMem.rssPerConn/1024)
	fmt.Printf("  central:     %6.2f KB RSS per socket (Go heap %5.2f KB, goroutine stacks %5.2f KB); %.2fx bare\n",
		mem.rssPerConn/1024, mem.heapPerConn/1024, mem.stackPerConn/1024, mem.rssPerConn/bareMem.rssPerConn)

	lat, err := measureLatency(ctx, pool, sockets, rate, duration)
	if err != nil {
		return err
	}
	fmt.Printf("commit → frame, %d sockets, %d notifications/s for %s: %d frames, p50 %s, p90 %s, p99 %s, max %s\n",
		conns, rate, duration, lat.n, lat.p50, lat.p90, lat.p99, lat.max)
	if lat.lost > 0 {
		return fmt.Errorf("%d notifications committed but never received", lat.lost)
	}
	closeAll(sockets)
	stop(central)
	if err := readings(ctx, e, bin, wave.compare, reading); err != nil {
		return err
	}
	return waves(ctx, e, bin, wave)
}

// readings runs the reading runs with bin and, when set, the comparison
// binary, in alternating rounds, and prints each.
func readings(ctx context.Context, e env, bin, compare string, r readingConfig) error {
	binaries := []string{bin}
	if compare != "" {
		binaries = append(binaries, compare)
	}
	for round := range r.rounds {
		for _, n := range r.replicas {
			for _, b := range binaries {
				res, err := runReading(ctx, e, b, n, r.sockets, r.rate, r.window)
				if err != nil {
					return fmt.Errorf("reading with %s, %d replicas: %w", b, n, err)
				}
				fmt.Printf("reading %d, %s, %d replicas, %d notifications/s: %.1f reads/s per replica, reader backend CPU %s/s per replica (%s per read), LISTEN backend %s/s per replica; cluster CPU %s/s; %.0f frames/s\n",
					round+1, filepath.Base(b), n, r.rate, res.reads, res.readerCPU.Round(10*time.Microsecond), res.perRead.Round(time.Microsecond),
					res.listenCPU.Round(10*time.Microsecond), res.clusterCPU.Round(100*time.Microsecond), res.framesPerSec)
			}
		}
	}
	return nil
}

// waves runs the reconnect wave with bin and, when set, the comparison
// binary, in alternating rounds, and prints each.
func waves(ctx context.Context, e env, bin string, w waveConfig) error {
	if w.movers == 0 {
		return nil
	}
	binaries := []string{bin}
	if w.compare != "" {
		binaries = append(binaries, w.compare)
	}
	for round := range w.rounds {
		for _, b := range binaries {
			res, err := runWave(ctx, e, b, w.movers, w.stayers, w.rate)
			if err != nil {
				return fmt.Errorf("wave with %s: %w", b, err)
			}
			fmt.Printf("wave %d, %s: %d sockets moved, all ready %s after the kill (%d failed), Postgres CPU %s per resume; "+
				"%d stayers at %d/s meanwhile: %d frames, p50 %s, p99 %s, max %s\n",
				round+1, filepath.Base(b), w.movers, res.allReady.Round(time.Millisecond), res.failed, res.cpuPerResume.Round(time.Microsecond),
				w.stayers, w.rate, res.stay.n, res.stay.p50.Round(time.Millisecond), res.stay.p99.Round(time.Millisecond), res.stay.max.Round(time.Millisecond))
		}
	}
	return nil
}

func user(i int) string { return "user-" + strconv.Itoa(i) }

// startCentral starts a central replica from bin on the benchmark's cluster,
// without push or maintenance, and waits until it is ready; it returns the
// process even when it did not become ready, to be stopped.
func startCentral(e env, bin string, extra ...string) (*exec.Cmd, string, error) {
	addr := freeAddr()
	args := append([]string{"central", "--listen", addr, "--database-url", e.dbURL,
		"--oidc-issuer", "livebench", "--oidc-audience", "spoolcast", "--jwks-url", e.jwksURL,
		"--push=false", "--maintenance-interval", "0"}, extra...)
	cmd, err := startProcess(bin, args...)
	if err != nil {
		return nil, "", err
	}
	base := "http://" + addr
	return cmd, base, waitHTTP(base + "/readyz")
}

// startLoad commits rate notifications a second (a batch every 10 ms),
// each to the user to picks, under keys of its own, and wakes the readers
// after each commit as a relay's forwarder does; commits, when set, notes
// each commit's return. stop ends it and waits for the commits in flight.
func startLoad(ctx context.Context, e env, producer string, rate int, to func() string, commits *commitTimes) (stop func()) {
	done, loadDone := make(chan struct{}), make(chan struct{})
	prefix := producer + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	go func() {
		defer close(loadDone)
		var ingests sync.WaitGroup
		waker := ingest.NewWaker(e.pool, 0, nil, slog.New(slog.DiscardHandler))
		defer waker.Stop()
		const tick = 10 * time.Millisecond
		perTick := max(1, rate*int(tick)/int(time.Second))
		t := time.NewTicker(tick)
		defer t.Stop()
		for n := 0; ; {
			select {
			case <-done:
				ingests.Wait()
				return
			case <-t.C:
			}
			items := make([]ingest.Item, perTick)
			titles := make([]string, perTick)
			for i := range items {
				titles[i] = prefix + strconv.Itoa(n)
				n++
				ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":%q,"type":"bench","recipients":[%q],"title":%q}`,
					titles[i], to(), titles[i]), "")
				if err != nil {
					panic(err) // a valid event of our own
				}
				items[i] = ingest.Item{Producer: producer, Event: ev}
			}
			ingests.Go(func() {
				if _, err := ingest.Ingest(ctx, e.pool, items); err != nil {
					return
				}
				now := time.Now()
				waker.Committed()
				if commits != nil {
					commits.committed(titles, now)
				}
			})
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-loadDone }) }
}

func startProcess(bin string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	return cmd, cmd.Start()
}

func stop(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func waitHTTP(url string) error {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return errors.New(url + " did not answer 200 within 30s")
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// raiseFileLimit lifts this process's (and its children's) open-file limit
// to the hard limit.
func raiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}
