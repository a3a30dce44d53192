// Command loadgen measures the relay's ingest throughput and latency against a
// bare net/http handler, in the same run with the same generator.
//
// It builds spoolcast, prepares a spool that already keeps -prefill forwarded
// keys (a relay a day into its key TTL), then runs rounds: in each, every
// target in turn is started as a subprocess on loopback (the bare handler is
// this program in -serve-bare mode) and sent ~300-byte events over N
// keep-alive connections for a fixed time after a warm-up. Producers send
// random keys (UUIDv4), the default; increasing keys (UUIDv7-like, time
// ordered) are measured as a second row. It prints each round and the
// medians as Markdown, with each relay row as a ratio of the bare handler's.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spoolcast/spoolcast/spool"
)

func main() {
	var (
		serveBare  = flag.String("serve-bare", "", "internal: serve the bare handler on this address")
		conns      = flag.Int("conns", 64, "concurrent connections")
		duration   = flag.Duration("duration", 10*time.Second, "measured time per target")
		warmup     = flag.Duration("warmup", 2*time.Second, "unmeasured time per target before measuring")
		rounds     = flag.Int("rounds", 3, "rounds; each runs every target once, in turn")
		prefill    = flag.Int("prefill", 300_000, "forwarded keys the relay's spool already keeps when a run starts")
		keys       = flag.String("keys", "random,increasing", "key orders to measure: random (UUIDv4), increasing (UUIDv7-like)")
		syncMode   = flag.String("sync", "full", "the relay's --sync mode")
		binary     = flag.String("spoolcast", "", "spoolcast binary (default: build ./cmd/spoolcast)")
		gomaxprocs = flag.Int("generator-procs", 0, "GOMAXPROCS of the generator (0 keeps the default)")
		pprofDir   = flag.String("pprof", "", "write a 5 s CPU profile of each relay run into this directory")
	)
	flag.Parse()
	if *serveBare != "" {
		serveBareHandler(*serveBare)
		return
	}
	if *gomaxprocs > 0 {
		runtime.GOMAXPROCS(*gomaxprocs)
	}
	cfg := config{conns: *conns, duration: *duration, warmup: *warmup, rounds: *rounds, prefill: *prefill,
		keyOrders: strings.Split(*keys, ","), syncMode: *syncMode, binary: *binary, pprofDir: *pprofDir}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

type config struct {
	conns            int
	duration, warmup time.Duration
	rounds, prefill  int
	keyOrders        []string
	syncMode, binary string
	pprofDir         string
}

// serveBareHandler is the baseline: read the body, answer 202.
func serveBareHandler(addr string) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"status":"accepted"}`))
	})
	if err := http.ListenAndServe(addr, h); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

type result struct {
	name     string
	requests int64
	errors   int64
	statuses map[int]int64
	elapsed  time.Duration
	p50, p99 time.Duration
	walBytes int64 // the relay's WAL file when the run ended
}

func (r result) rps() float64 { return float64(r.requests) / r.elapsed.Seconds() }

func (r result) non2xx() int64 {
	var n int64
	for code, c := range r.statuses {
		if code/100 != 2 {
			n += c
		}
	}
	return n
}

// target is one server to measure.
type target struct {
	name  string
	start func(addr string) (*exec.Cmd, error)
	keys  func() string
}

func run(cfg config) error {
	tmp, err := os.MkdirTemp("", "loadgen-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	binary := cfg.binary
	if binary == "" {
		binary = filepath.Join(tmp, "spoolcast")
		build := exec.Command("go", "build", "-o", binary, "./cmd/spoolcast")
		build.Stdout, build.Stderr = os.Stdout, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build spoolcast: %w", err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	template := filepath.Join(tmp, "prefilled.db")
	start := time.Now()
	if err := prefillSpool(template, cfg.prefill); err != nil {
		return fmt.Errorf("prefill the spool: %w", err)
	}
	fmt.Printf("spool prefilled with %d kept keys in %s\n", cfg.prefill, time.Since(start).Round(time.Second))

	targets := []target{{
		name:  "bare net/http (202, no work)",
		start: func(addr string) (*exec.Cmd, error) { return startServer(addr, self, "-serve-bare", addr) },
		keys:  uuidV4,
	}}
	for _, order := range cfg.keyOrders {
		keys := map[string]func() string{"random": uuidV4, "increasing": uuidV7}[order]
		if keys == nil {
			return fmt.Errorf("unknown key order %q: want random or increasing", order)
		}
		name := fmt.Sprintf("relay --sync %s, %s keys", cfg.syncMode, order)
		targets = append(targets, target{name: name, keys: keys, start: func(addr string) (*exec.Cmd, error) {
			spoolPath := filepath.Join(tmp, "spool.db")
			for _, suffix := range []string{"", "-wal", "-shm"} {
				os.Remove(spoolPath + suffix)
			}
			if err := copyFile(template, spoolPath); err != nil {
				return nil, err
			}
			args := []string{"relay", "--producer", "loadgen", "--listen", addr, "--spool", spoolPath,
				"--sync", cfg.syncMode, "--log-level", "warn", "--spool-max-bytes", "8GiB"}
			if cfg.pprofDir != "" {
				args = append(args, "--ops-listen", opsAddr(addr), "--pprof")
			}
			return startServer(addr, binary, args...)
		}})
	}

	all := make([][]result, len(targets))
	for round := range cfg.rounds {
		fmt.Printf("\nround %d of %d\n", round+1, cfg.rounds)
		for i, tg := range targets {
			addr := freeAddr()
			cmd, err := tg.start(addr)
			if err != nil {
				return err
			}
			var profile func()
			if cfg.pprofDir != "" && i > 0 {
				profile = startProfile(cfg, opsAddr(addr), fmt.Sprintf("round%d-target%d.pprof", round+1, i))
			}
			res := load(tg.name, "http://"+addr+"/v1/events", tg.keys, cfg)
			if fi, err := os.Stat(filepath.Join(tmp, "spool.db-wal")); err == nil && i > 0 {
				res.walBytes = fi.Size()
			}
			if profile != nil {
				profile()
			}
			stopServer(cmd)
			fmt.Printf("  %-40s %8.0f req/s  p50 %-8s p99 %-8s non-2xx %d, errors %d, WAL %d MB\n", tg.name, res.rps(),
				res.p50.Round(10*time.Microsecond), res.p99.Round(10*time.Microsecond), res.non2xx(), res.errors, res.walBytes>>20)
			all[i] = append(all[i], res)
		}
	}

	fmt.Printf("\n%d connections, %s measured after %s warm-up per run, ~300-byte events, %d kept keys in the spool, %d rounds (targets alternate), GOMAXPROCS=%d, %d CPUs\n\n",
		cfg.conns, cfg.duration, cfg.warmup, cfg.prefill, cfg.rounds, runtime.GOMAXPROCS(0), runtime.NumCPU())
	fmt.Println("| target | median req/s | vs bare (median of per-round ratios) | p50 | p99 | non-2xx | errors |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for i, tg := range targets {
		var rps, ratios []float64
		var p50, p99 []time.Duration
		var non2xx, errs int64
		for r, res := range all[i] {
			rps = append(rps, res.rps())
			ratios = append(ratios, res.rps()/all[0][r].rps())
			p50, p99 = append(p50, res.p50), append(p99, res.p99)
			non2xx += res.non2xx()
			errs += res.errors
		}
		fmt.Printf("| %s | %.0f | %.2f | %s | %s | %d | %d |\n", tg.name, median(rps), median(ratios),
			median(p50).Round(10*time.Microsecond), median(p99).Round(10*time.Microsecond), non2xx, errs)
	}
	return nil
}

func median[T int64 | float64 | time.Duration](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// prefillSpool writes a spool file keeping n forwarded keys, random as
// producers send them, through the spool's own claim and acknowledgement.
func prefillSpool(path string, n int) error {
	ctx := context.Background()
	sp, err := spool.Open(ctx, spool.Config{Path: path, Sync: spool.SyncNormal, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	payload := bytes.Repeat([]byte("x"), 300)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				key := uuidV4()
				if _, err := sp.Claim(ctx, spool.Entry{Producer: "loadgen", Key: key, Hash: payload[:32], Payload: payload}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	for {
		batch, err := sp.NextBatch(ctx, 0, spool.BatchLimit{Rows: 5000})
		if err != nil || len(batch) == 0 {
			if err == nil {
				err = sp.Close(ctx)
			}
			return err
		}
		seqs := make([]int64, len(batch))
		for i, rec := range batch {
			seqs[i] = rec.Seq
		}
		if err := sp.MarkForwarded(ctx, seqs); err != nil {
			return err
		}
	}
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}

// opsAddr is the relay's ops address for a run: the port after its own.
func opsAddr(addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	var p int
	fmt.Sscan(port, &p)
	return net.JoinHostPort(host, fmt.Sprint(p+1))
}

// startProfile fetches a 5 s CPU profile from the relay's ops address in the
// background, starting after the warm-up; the returned function waits for it.
func startProfile(cfg config, ops, name string) func() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(cfg.warmup)
		resp, err := http.Get("http://" + ops + "/debug/pprof/profile?seconds=5")
		if err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
			return
		}
		defer resp.Body.Close()
		os.MkdirAll(cfg.pprofDir, 0o755)
		f, err := os.Create(filepath.Join(cfg.pprofDir, name))
		if err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
			return
		}
		defer f.Close()
		io.Copy(f, resp.Body)
	}()
	return func() { <-done }
}

func freeAddr() string {
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		// The ops address (the next port) must be free too.
		if ops, err := net.Listen("tcp", opsAddr(addr)); err == nil {
			ops.Close()
			return addr
		}
	}
}

func startServer(addr, bin string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return cmd, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	return nil, fmt.Errorf("%s did not start listening on %s", bin, addr)
}

func stopServer(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
}

// uuidV4 is a random key, as most producers send.
func uuidV4() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return formatUUID(b)
}

var v7seq atomic.Uint64

// uuidV7 is a time-ordered key like UUIDv7: milliseconds first, then a
// counter, so that each key is above the last.
func uuidV7() string {
	n := v7seq.Add(1)
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(time.Now().UnixMilli())<<16|0x7000|(n>>52)&0xfff)
	binary.BigEndian.PutUint64(b[8:], 1<<63|(n&(1<<52-1))<<10|uint64(mrand.Uint32()&0x3ff))
	return formatUUID(b)
}

func formatUUID(b [16]byte) string {
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// body returns a ~300-byte event under key.
func body(key string, n int64) []byte {
	return fmt.Appendf(nil, `{"idempotency_key":%q,"type":"job.finished","category":"jobs","recipients":["u_%06d"],"title":"Nightly export finished","body":"Your export of 12,345 rows is ready to download.","data":{"job_id":"j_%012d","rows":12345,"url":"https://example.invalid/exports/%012d"}}`,
		key, n%1000000, n, n)
}

var bodySeq atomic.Int64

func load(name, url string, keys func() string, cfg config) result {
	transport := &http.Transport{MaxIdleConnsPerHost: cfg.conns, MaxConnsPerHost: cfg.conns, DisableCompression: true}
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	defer transport.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(context.Background(), cfg.warmup+cfg.duration)
	defer cancel()
	measureFrom := time.Now().Add(cfg.warmup)
	var mu sync.Mutex
	res := result{name: name, statuses: map[int]int64{}}
	var all []time.Duration
	var wg sync.WaitGroup
	for range cfg.conns {
		wg.Go(func() {
			var lat []time.Duration
			statuses := map[int]int64{}
			var errs int64
			for ctx.Err() == nil {
				start := time.Now()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body(keys(), bodySeq.Add(1))))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if start.Before(measureFrom) {
					continue
				}
				if ctx.Err() != nil {
					break
				}
				if err != nil {
					errs++
					continue
				}
				lat = append(lat, time.Since(start))
				statuses[resp.StatusCode]++
			}
			mu.Lock()
			all = append(all, lat...)
			for k, v := range statuses {
				res.statuses[k] += v
			}
			res.errors += errs
			mu.Unlock()
		})
	}
	wg.Wait()
	res.elapsed = cfg.duration
	for code, n := range res.statuses {
		if code/100 == 2 {
			res.requests += n
		}
	}
	slices.Sort(all)
	if len(all) > 0 {
		res.p50 = all[len(all)/2]
		res.p99 = all[len(all)*99/100]
	}
	return res
}
