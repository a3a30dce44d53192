// Command forwardbench measures the forwarder against Postgres.
//
//  1. Throughput: a spool filled with -events events (one recipient each) is
//     drained by the forwarder into Postgres; the baseline inserts the same
//     claim and notification rows by a plain unnest batch loop with no spool,
//     in the same run, on the same server.
//  2. Lag: a real relay subprocess with its forwarder takes a steady -rate
//     events/s for -lag-duration; lag is each notification's Postgres commit
//     transaction time minus the relay's receipt time.
//
// It starts its own Postgres cluster (fsync on) from the installed binaries,
// or uses -database-url.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/migrations"
	"github.com/spoolcast/spoolcast/spool"
	"github.com/spoolcast/spoolcast/sync/forward"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

func main() {
	var (
		events      = flag.Int("events", 60_000, "events in the full spool, per round")
		batch       = flag.Int("batch", 500, "rows per Postgres transaction, forwarder and baseline alike")
		rate        = flag.Int("rate", 2000, "events/s for the lag measurement")
		lagDuration = flag.Duration("lag-duration", 15*time.Second, "how long the steady load runs")
		databaseURL = flag.String("database-url", "", "Postgres maintenance URL (default: start a local cluster)")
		rounds      = flag.Int("rounds", 5, "alternating baseline and forwarder rounds")
		workers     = flag.Int("workers", 2, "forwarder workers, one Postgres connection each (the relay's --db-max-conns)")
		cpuProfile  = flag.String("cpuprofile", "", "write a CPU profile of the forwarder's drain to this file")
		wakeUp      = flag.Duration("wake-up-interval", 0, "the forwarder's wake-up interval (0: its default)")
		refeed      = flag.Duration("refeed-window", 0, "the spool's --refeed-window (the relay's default is 10m; 0 drops each payload once forwarded)")
		refeedBytes = flag.Int64("refeed-max-bytes", 0, "the spool's --refeed-max-bytes (0: its default, 64 MiB)")
	)
	flag.Parse()
	profilePath = *cpuProfile
	wakeUpInterval = *wakeUp
	refeedWindow, refeedMaxBytes = *refeed, *refeedBytes
	if err := run(*events, *batch, *workers, *rounds, *rate, *lagDuration, *databaseURL); err != nil {
		fmt.Fprintln(os.Stderr, "forwardbench:", err)
		os.Exit(1)
	}
}

func run(events, batch, workers, rounds, rate int, lagDuration time.Duration, adminURL string) error {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "forwardbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil { // Postgres may run as another user
		return err
	}
	if adminURL == "" {
		c, err := pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(tmp, "pg"), Durable: true, Settings: []string{"track_commit_timestamp=on"}})
		if err != nil {
			return err
		}
		defer c.Stop()
		adminURL = c.URL
		cluster = c
	}
	db := func(name string) (string, error) {
		conn, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			return "", err
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
			return "", err
		}
		u := strings.Replace(adminURL, "/postgres?", "/"+name+"?", 1)
		_, err = migrations.Up(ctx, u, nil)
		return u, err
	}
	items := makeItems(events)
	checkpoint := func() error {
		conn, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "CHECKPOINT")
		return err
	}

	// Rounds alternate baseline and forwarder on fresh databases, each after a
	// checkpoint, so that neither always meets Postgres in the same state.
	var baseRates, fwdRates []float64
	var baseCPU, fwdCPU []cpuUse
	for round := range rounds {
		baseURL, err := db(fmt.Sprintf("bench_baseline_%d", round))
		if err != nil {
			return err
		}
		if err := checkpoint(); err != nil {
			return err
		}
		before := cpuNow()
		baseRate, err := baseline(ctx, baseURL, items, batch, workers)
		baseCPU = append(baseCPU, cpuNow().since(before, len(items)))
		if err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		fwdURL, err := db(fmt.Sprintf("bench_forwarder_%d", round))
		if err != nil {
			return err
		}
		if err := checkpoint(); err != nil {
			return err
		}
		fwdRate, use, err := forwarder(ctx, fwdURL, filepath.Join(tmp, fmt.Sprintf("spool-%d.db", round)), items, batch, workers)
		fwdCPU = append(fwdCPU, use)
		if err != nil {
			return fmt.Errorf("forwarder: %w", err)
		}
		baseRates, fwdRates = append(baseRates, baseRate), append(fwdRates, fwdRate)
	}

	lagURL, err := db("bench_lag")
	if err != nil {
		return err
	}
	lag, err := steadyLag(ctx, lagURL, filepath.Join(tmp, "lag.db"), rate, lagDuration)
	if err != nil {
		return fmt.Errorf("lag: %w", err)
	}

	fmt.Printf("\n%d events × 1 recipient per round, batches of %d, %d forwarder workers and %d baseline connections, Postgres fsync on\n\n", events, batch, workers, workers)
	fmt.Println("| round | baseline notifications/s | forwarder notifications/s | forwarder vs baseline | CPU µs/notification, baseline: process, Postgres | forwarder: process, Postgres |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|")
	var ratios []float64
	for i := range baseRates {
		ratios = append(ratios, fwdRates[i]/baseRates[i])
		fmt.Printf("| %d | %.0f | %.0f | %.0f%% | %s | %s |\n", i+1, baseRates[i], fwdRates[i], 100*fwdRates[i]/baseRates[i], baseCPU[i], fwdCPU[i])
	}
	slices.Sort(ratios)
	fmt.Printf("\nmedian forwarder vs baseline: %.0f%%\n", 100*ratios[len(ratios)/2])
	fmt.Printf("\nsteady %d events/s for %s through a relay: %s\n", rate, lagDuration, lag)
	return nil
}

var (
	profilePath    string
	wakeUpInterval time.Duration
	refeedWindow   time.Duration
	refeedMaxBytes int64
	cluster        *pgcluster.Cluster // the benchmark's own Postgres; nil with -database-url
)

// cpuUse is the CPU a phase cost per notification: this process's (the
// forwarder, or the baseline's client) and Postgres's (zero with
// -database-url, whose server may be shared).
type cpuUse struct{ process, postgres time.Duration }

func (u cpuUse) String() string {
	return fmt.Sprintf("%.1f, %.1f", float64(u.process)/1e3, float64(u.postgres)/1e3)
}

// cpuNow is the CPU used so far, in total.
func cpuNow() cpuUse {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	u := cpuUse{process: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
	if cluster != nil {
		u.postgres = cluster.CPU()
	}
	return u
}

// since is the CPU used from before to u, per one of n notifications.
func (u cpuUse) since(before cpuUse, n int) cpuUse {
	return cpuUse{process: (u.process - before.process) / time.Duration(n), postgres: (u.postgres - before.postgres) / time.Duration(n)}
}

func makeItems(n int) []ingest.Item {
	items := make([]ingest.Item, n)
	now := time.Now()
	for i := range items {
		body := fmt.Sprintf(`{"idempotency_key":"bench:%d","type":"job.finished","category":"jobs","recipients":["u_%d"],"title":"Nightly export finished","body":"Your export of 12,345 rows is ready.","data":{"job_id":"j_%d","rows":12345}}`, i, i%10000, i)
		ev, err := event.Decode([]byte(body), "")
		if err != nil {
			panic(err)
		}
		items[i] = ingest.Item{Producer: "bench", Event: ev, ReceivedAt: now}
	}
	return items
}

// baselineSQL writes the rows the forwarder writes for one batch — each event's
// claimed key and each recipient's, with the request hash, the notifications,
// the push queue entries — with unnest, and nothing more: no spool, no
// conflict check, no NOTIFY.
const baselineSQL = `
WITH input AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::bytea[], $12::text[])
    AS t(key, user_id, received_at, type, category, title, body, data, producer, producer_key, hash, event_key)
), event_claims AS (
  INSERT INTO idempotency_keys (key, request_hash) SELECT event_key, hash FROM input ORDER BY event_key ON CONFLICT DO NOTHING
), claimed AS (
  INSERT INTO idempotency_keys (key, request_hash) SELECT key, hash FROM input ORDER BY key ON CONFLICT DO NOTHING RETURNING key
), inserted AS (
  INSERT INTO notifications (user_id, received_at, type, category, title, body, data, producer, idempotency_key, notification_key)
  SELECT i.user_id, i.received_at, i.type, i.category, i.title, i.body, i.data::jsonb, i.producer, i.producer_key, i.key
  FROM input i JOIN claimed c USING (key)
  RETURNING id, user_id, category
)
INSERT INTO push_queue (notification_id, user_id, category) SELECT id, user_id, category FROM inserted`

// baseline writes the batches with as many connections as the forwarder has
// workers, each taking the next batch in turn.
func baseline(ctx context.Context, url string, items []ingest.Item, batch, workers int) (float64, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				lo := int(next.Add(int64(batch))) - batch
				if lo >= len(items) {
					return
				}
				if err := insertBaseline(ctx, pool, items[lo:min(lo+batch, len(items))]); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return 0, err
	}
	return float64(len(items)) / time.Since(start).Seconds(), nil
}

func insertBaseline(ctx context.Context, pool *pgxpool.Pool, items []ingest.Item) error {
	var key, user, typ, cat, title, body, data, prod, pkey, ekey []string
	var recv []time.Time
	var hash [][]byte
	for _, it := range items {
		ev := it.Event
		key = append(key, ingest.NotificationKey(it.Producer, ev.IdempotencyKey, ev.Recipients[0]))
		ekey = append(ekey, "event:"+it.Producer+":"+ev.IdempotencyKey) // the same shape as ingest's event key
		hash = append(hash, it.Event.Hash())
		user = append(user, ev.Recipients[0])
		recv = append(recv, it.ReceivedAt)
		typ, cat, title, body = append(typ, ev.Type), append(cat, ev.Category), append(title, ev.Title), append(body, ev.Body)
		data, prod, pkey = append(data, string(ev.Data)), append(prod, it.Producer), append(pkey, ev.IdempotencyKey)
	}
	_, err := pool.Exec(ctx, baselineSQL, key, user, recv, typ, cat, title, body, data, prod, pkey, hash, ekey)
	return err
}

func forwarder(ctx context.Context, url, spoolPath string, items []ingest.Item, batch, workers int) (_ float64, _ cpuUse, err error) {
	sp, err := spool.Open(ctx, spool.Config{Path: spoolPath, RefeedWindow: refeedWindow, RefeedMaxBytes: refeedMaxBytes, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 0, cpuUse{}, err
	}
	defer sp.Close(ctx)
	var next atomic.Int64
	var wg sync.WaitGroup
	var fillErr atomic.Value
	for range 64 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(items)); i = next.Add(1) - 1 {
				c := items[i].Event.Canonical()
				if _, err := sp.Claim(ctx, spool.Entry{Producer: "bench", Key: items[i].Event.IdempotencyKey, Hash: event.HashCanonical(c), Payload: c}); err != nil {
					fillErr.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := fillErr.Load().(error); err != nil {
		return 0, cpuUse{}, err
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return 0, cpuUse{}, err
	}
	pcfg.MaxConns = int32(workers)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return 0, cpuUse{}, err
	}
	defer pool.Close()
	f, err := forward.New(forward.Config{Spool: sp, DB: pool, BatchSize: batch, Workers: workers, WakeUpInterval: wakeUpInterval, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 0, cpuUse{}, err
	}
	if profilePath != "" {
		pf, err := os.Create(profilePath)
		if err != nil {
			return 0, cpuUse{}, err
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			return 0, cpuUse{}, err
		}
		defer pprof.StopCPUProfile()
	}
	start, before := time.Now(), cpuNow()
	f.Start(ctx)
	for {
		// A cheap probe: the first pending row, if any.
		next, err := sp.NextBatch(ctx, 0, spool.BatchLimit{Rows: 1})
		if err != nil {
			return 0, cpuUse{}, err
		}
		if len(next) == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed, use := time.Since(start), cpuNow().since(before, len(items))
	if err := f.Stop(ctx); err != nil {
		return 0, cpuUse{}, err
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM notifications").Scan(&n); err != nil {
		return 0, cpuUse{}, err
	}
	if n != len(items) {
		return 0, cpuUse{}, fmt.Errorf("forwarded %d notifications, want %d", n, len(items))
	}
	return float64(n) / elapsed.Seconds(), use, nil
}

func steadyLag(ctx context.Context, url, spoolPath string, rate int, duration time.Duration) (string, error) {
	bin := filepath.Join(filepath.Dir(spoolPath), "spoolcast")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/spoolcast").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build: %v\n%s", err, out)
	}
	addr := "127.0.0.1:17399"
	relay := exec.Command(bin, "relay", "--producer", "lag", "--listen", addr, "--spool", spoolPath, "--database-url", url, "--log-level", "warn")
	relay.Stderr = os.Stderr
	if err := relay.Start(); err != nil {
		return "", err
	}
	defer func() { _ = relay.Process.Signal(syscall.SIGTERM); _ = relay.Wait() }()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if resp, err := client.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("relay did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	tokens := make(chan int, rate)
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := range tokens {
				body := fmt.Sprintf(`{"idempotency_key":"lag:%d","type":"job.finished","category":"jobs","recipients":["u_%d"],"title":"Nightly export finished","body":"Your export is ready."}`, i, i%1000)
				resp, err := client.Post("http://"+addr+"/v1/events", "application/json", strings.NewReader(body))
				if err != nil || resp.StatusCode != http.StatusAccepted {
					failed.Add(1)
				}
				if err == nil {
					resp.Body.Close()
				}
			}
		})
	}
	// Release rate/100 events every 10 ms.
	tick := time.NewTicker(10 * time.Millisecond)
	sent := 0
	total := int(duration.Seconds() * float64(rate))
	for start := time.Now(); sent < total; {
		<-tick.C
		due := min(total, int(time.Since(start).Seconds()*float64(rate)))
		for ; sent < due; sent++ {
			tokens <- sent
		}
	}
	tick.Stop()
	close(tokens)
	wg.Wait()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	for deadline := time.Now().Add(60 * time.Second); ; {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM notifications").Scan(&n); err != nil {
			return "", err
		}
		if n >= total-int(failed.Load()) {
			break
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("only %d of %d notifications landed", n, total)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Lag to the commit when the server tracks commit times, else to the
	// ingest transaction's start (created_at).
	committed := "created_at"
	var track string
	if err := pool.QueryRow(ctx, "SHOW track_commit_timestamp").Scan(&track); err == nil && track == "on" {
		committed = "pg_xact_commit_timestamp(xmin)"
	}
	var p50, p99, pmax float64
	err = pool.QueryRow(ctx, fmt.Sprintf(`SELECT
		percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), percentile_cont(0.99) WITHIN GROUP (ORDER BY lag), max(lag)
		FROM (SELECT extract(epoch FROM %s - received_at) AS lag FROM notifications) l`, committed)).Scan(&p50, &p99, &pmax)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d events, %d failed posts; relay receipt → %s: p50 %.1f ms, p99 %.1f ms, max %.1f ms", total, failed.Load(), committed, p50*1000, p99*1000, pmax*1000), nil
}
