// Command loadgen measures the relay's ingest throughput and latency against a
// bare net/http handler, in the same run with the same generator.
//
// It builds spoolcast, then for each target starts a server subprocess on
// loopback (the bare handler is this program in -serve-bare mode), posts
// ~300-byte events with unique keys over N keep-alive connections for a fixed
// time after a warm-up, and prints a Markdown table of requests/s and p50/p99
// latency, with the relay's throughput as a ratio of the bare handler's.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
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
)

func main() {
	var (
		serveBare  = flag.String("serve-bare", "", "internal: serve the bare handler on this address")
		conns      = flag.Int("conns", 64, "concurrent connections")
		duration   = flag.Duration("duration", 10*time.Second, "measured time per target")
		warmup     = flag.Duration("warmup", 2*time.Second, "unmeasured time per target before measuring")
		syncModes  = flag.String("sync", "full", "comma-separated relay --sync modes to measure")
		binary     = flag.String("spoolcast", "", "spoolcast binary (default: build ./cmd/spoolcast)")
		gomaxprocs = flag.Int("generator-procs", 0, "GOMAXPROCS of the generator (0 keeps the default)")
	)
	flag.Parse()
	if *serveBare != "" {
		serveBareHandler(*serveBare)
		return
	}
	if *gomaxprocs > 0 {
		runtime.GOMAXPROCS(*gomaxprocs)
	}
	if err := run(*conns, *duration, *warmup, strings.Split(*syncModes, ","), *binary); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
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
}

func (r result) rps() float64 { return float64(r.requests) / r.elapsed.Seconds() }

func run(conns int, duration, warmup time.Duration, syncModes []string, binary string) error {
	tmp, err := os.MkdirTemp("", "loadgen-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
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

	var results []result
	addr := freeAddr()
	bare, err := startServer(addr, self, "-serve-bare", addr)
	if err != nil {
		return err
	}
	res := load("bare net/http (202, no work)", "http://"+addr+"/v1/events", conns, duration, warmup)
	stopServer(bare)
	results = append(results, res)

	for _, mode := range syncModes {
		addr := freeAddr()
		spoolPath := filepath.Join(tmp, "spool-"+mode+".db")
		relay, err := startServer(addr, binary, "relay", "--producer", "loadgen", "--listen", addr,
			"--spool", spoolPath, "--sync", mode, "--log-level", "warn", "--spool-max-bytes", "8GiB")
		if err != nil {
			return err
		}
		res := load("relay --sync "+mode, "http://"+addr+"/v1/events", conns, duration, warmup)
		stopServer(relay)
		results = append(results, res)
	}

	fmt.Printf("\n%d connections, %s measured after %s warm-up, ~300-byte events, GOMAXPROCS=%d, %d CPUs\n\n", conns, duration, warmup, runtime.GOMAXPROCS(0), runtime.NumCPU())
	fmt.Println("| target | req/s | vs bare | p50 | p99 | non-2xx | errors |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for _, r := range results {
		var non2xx int64
		for code, n := range r.statuses {
			if code/100 != 2 {
				non2xx += n
			}
		}
		fmt.Printf("| %s | %.0f | %.0f%% | %s | %s | %d | %d |\n", r.name, r.rps(), 100*r.rps()/results[0].rps(),
			r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), non2xx, r.errors)
	}
	return nil
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func startServer(addr, bin string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(20 * time.Second)
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

var keySeq atomic.Int64

// body returns a ~300-byte event with a unique key.
func body(run string) []byte {
	n := keySeq.Add(1)
	return fmt.Appendf(nil, `{"idempotency_key":"loadgen:%s:%012d","type":"job.finished","category":"jobs","recipients":["u_%06d"],"title":"Nightly export finished","body":"Your export of 12,345 rows is ready to download.","data":{"job_id":"j_%012d","rows":12345,"url":"https://example.invalid/exports/%012d"}}`,
		run, n, n%1000000, n, n)
}

func load(name, url string, conns int, duration, warmup time.Duration) result {
	transport := &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true}
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	defer transport.CloseIdleConnections()
	run := fmt.Sprintf("%d", time.Now().UnixNano())

	ctx, cancel := context.WithTimeout(context.Background(), warmup+duration)
	defer cancel()
	measureFrom := time.Now().Add(warmup)
	var mu sync.Mutex
	res := result{name: name, statuses: map[int]int64{}}
	var all []time.Duration
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			var lat []time.Duration
			statuses := map[int]int64{}
			var errs int64
			for ctx.Err() == nil {
				start := time.Now()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body(run)))
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
	res.elapsed = duration
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
