// Command pushbench measures how many pushes per second the dispatcher sends
// into a fake Expo: 1,000 users with 3 devices each, a queue of notifications
// ingested beforehand, Expo's rate cap off, Postgres with fsync on. Each
// round drains the queue from the first pass to the last message the fake
// received; the figure is messages per second.
//
// It starts its own Postgres cluster from the installed binaries, or uses
// -database-url.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/channel/expo/expotest"
	devicestore "github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/migrations"
	"github.com/spoolcast/spoolcast/preferences"
	"github.com/spoolcast/spoolcast/push"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

func main() {
	var (
		users       = flag.Int("users", 1000, "users")
		devices     = flag.Int("devices", 3, "devices per user")
		events      = flag.Int("events", 20000, "notifications per round (one recipient each)")
		rounds      = flag.Int("rounds", 3, "rounds")
		workers     = flag.Int("workers", 2, "dispatcher workers")
		databaseURL = flag.String("database-url", "", "Postgres maintenance URL (default: start a local cluster)")
		cpuProfile  = flag.String("cpuprofile", "", "write a CPU profile of the rounds to this file")
	)
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "pushbench:", err)
			os.Exit(1)
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if err := run(*users, *devices, *events, *rounds, *workers, *databaseURL); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "pushbench:", err)
		os.Exit(1)
	}
}

func run(users, devices, events, rounds, workers int, adminURL string) error {
	ctx := context.Background()
	if adminURL == "" {
		c, cleanup, err := pgcluster.StartTemp(ctx, "pushbench", pgcluster.Config{Durable: true})
		if err != nil {
			return err
		}
		defer cleanup()
		adminURL = c.URL
	}
	var rates []float64
	for round := range rounds {
		rate, err := runRound(ctx, adminURL, fmt.Sprintf("bench_push_%d", round), users, devices, events, workers)
		if err != nil {
			return err
		}
		fmt.Printf("round %d: %d pushes in all, %.0f pushes/s\n", round+1, events*devices, rate)
		rates = append(rates, rate)
	}
	slices.Sort(rates)
	fmt.Printf("\n%d users × %d devices, %d notifications a round, %d dispatcher workers, Expo client: 6 requests in flight, no rate cap; Postgres fsync on\nmedian: %.0f pushes/s\n",
		users, devices, events, workers, rates[len(rates)/2])
	return nil
}

func runRound(ctx context.Context, adminURL, name string, users, devices, events, workers int) (float64, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return 0, err
	}
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return 0, err
	}
	conn.Close(ctx)
	url := strings.Replace(adminURL, "/postgres?", "/"+name+"?", 1)
	if _, err := migrations.Up(ctx, url, nil); err != nil {
		return 0, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO devices (token, user_id, platform)
		SELECT 'ExponentPushToken[u' || u || '-d' || d || ']', 'u' || u, 'ios'
		FROM generate_series(1, $1) u, generate_series(1, $2) d`, users, devices); err != nil {
		return 0, err
	}
	for lo := 0; lo < events; lo += 500 {
		var items []ingest.Item
		for i := lo; i < min(lo+500, events); i++ {
			ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":"e%d","type":"job.finished","category":"jobs","recipients":["u%d"],"title":"Nightly export finished","body":"Your export of 12,345 rows is ready to download."}`, i, i%users+1), "")
			if err != nil {
				return 0, err
			}
			items = append(items, ingest.Item{Producer: "bench", Event: ev})
		}
		if _, err := ingest.Ingest(ctx, pool, items); err != nil {
			return 0, err
		}
	}
	fake := expotest.New()
	srv := httptest.NewServer(fake)
	defer srv.Close()
	client, err := expo.New(expo.Config{URL: srv.URL, RatePerSecond: -1})
	if err != nil {
		return 0, err
	}
	metrics := push.NewMetrics(nil)
	d, err := push.NewDispatcher(push.DispatcherConfig{
		DB: pool, Sender: client, Preferences: preferences.NewBuiltin(pool, nil, nil), Devices: devicestore.New(pool, nil),
		Workers: workers, Interval: 10 * time.Millisecond, Metrics: metrics, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return 0, err
	}
	want := events * devices
	start := time.Now()
	d.Start(ctx)
	defer d.Stop(ctx)
	deadline := start.Add(10 * time.Minute)
	for fake.Accepted() < want {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d of %d pushes after 10 minutes", fake.Accepted(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(start)
	return float64(want) / took.Seconds(), nil
}
