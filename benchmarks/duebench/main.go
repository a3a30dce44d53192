// Command duebench measures due-work throughput on one replica: N scheduled
// notifications due in the same second (random UUIDv4 keys, one recipient
// each among 20,000 users, ~300-byte events), fired by one schedule.Firer;
// then N digest windows closing in the same second, each queued as one
// push. The figure is the time from the first firing statement to the last
// row moved, beside the time ingest takes to write the same notifications
// directly (the same rows, the same indexes), measured in the same round.
// Postgres has fsync on and keeps -retained older notifications, so the
// indexes the firer writes into are of a realistic size.
//
// It starts its own Postgres cluster from the installed binaries, or uses
// -database-url.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/migrations"
	"github.com/spoolcast/spoolcast/schedule"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

func main() {
	var (
		due         = flag.Int("due", 100_000, "notifications (and digests) due in the same second")
		users       = flag.Int("users", 20_000, "users the notifications go to")
		retained    = flag.Int("retained", 1_000_000, "older notifications kept in the feed beforehand")
		batch       = flag.Int("batch", 0, "rows per firing statement (0: the firer's default, 2000)")
		rounds      = flag.Int("rounds", 3, "rounds")
		databaseURL = flag.String("database-url", "", "Postgres maintenance URL (default: start a local cluster)")
	)
	flag.Parse()
	if err := run(*due, *users, *retained, *batch, *rounds, *databaseURL); err != nil {
		fmt.Fprintln(os.Stderr, "duebench:", err)
		os.Exit(1)
	}
}

type result struct {
	fire, digests, ingest time.Duration
}

func run(due, users, retained, batch, rounds int, adminURL string) error {
	ctx := context.Background()
	if adminURL == "" {
		c, cleanup, err := pgcluster.StartTemp(ctx, "duebench", pgcluster.Config{Durable: true})
		if err != nil {
			return err
		}
		defer cleanup()
		adminURL = c.URL
	}
	var results []result
	for round := range rounds {
		r, err := runRound(ctx, adminURL, fmt.Sprintf("bench_due_%d", round), due, users, retained, batch)
		if err != nil {
			return err
		}
		fmt.Printf("round %d: %d scheduled fired in %.2f s (%.0f/s); %d digests queued in %.2f s (%.0f/s); ingest of the same rows %.2f s (%.0f/s)\n",
			round+1, due, r.fire.Seconds(), float64(due)/r.fire.Seconds(), due, r.digests.Seconds(), float64(due)/r.digests.Seconds(),
			r.ingest.Seconds(), float64(due)/r.ingest.Seconds())
		results = append(results, r)
	}
	median := func(get func(result) time.Duration) time.Duration {
		ds := make([]time.Duration, len(results))
		for i, r := range results {
			ds[i] = get(r)
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	fire, digests, ing := median(func(r result) time.Duration { return r.fire }), median(func(r result) time.Duration { return r.digests }),
		median(func(r result) time.Duration { return r.ingest })
	fmt.Printf("\n%d due in one second, %d users, %d retained notifications, Postgres fsync on\n", due, users, retained)
	fmt.Printf("median: scheduled %.2f s, digests %.2f s, ingest of the same rows %.2f s (firing at %.2f× ingest's rate)\n",
		fire.Seconds(), digests.Seconds(), ing.Seconds(), ing.Seconds()/fire.Seconds())
	return nil
}

func runRound(ctx context.Context, adminURL, name string, due, users, retained, batch int) (result, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return result{}, err
	}
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return result{}, err
	}
	conn.Close(ctx)
	url := strings.Replace(adminURL, "/postgres?", "/"+name+"?", 1)
	if _, err := migrations.Up(ctx, url, nil); err != nil {
		return result{}, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO notifications (user_id, created_at, type, category, title, body, producer, idempotency_key, notification_key)
		SELECT 'u' || (i % $2), now() - (i || ' seconds')::interval / 10, 'job.finished', 'jobs', 'Nightly export finished',
		       'Your export of 12,345 rows is ready to download.', 'old', 'old' || i, 'old:' || i
		FROM generate_series(1, $1) i`, retained, users); err != nil {
		return result{}, fmt.Errorf("retained notifications: %w", err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE notifications`); err != nil {
		return result{}, err
	}
	at := time.Now().Add(time.Hour).Truncate(time.Second)
	// emit ingests due events and returns the time spent in ingest's
	// statements alone (not in making the events).
	emit := func(prefix string, sendAt bool) (time.Duration, error) {
		var took time.Duration
		for lo := 0; lo < due; lo += 500 {
			var items []ingest.Item
			for i := lo; i < min(lo+500, due); i++ {
				when := ""
				if sendAt {
					when = fmt.Sprintf(`,"send_at":%q`, at.Add(time.Duration(i%1000)*time.Millisecond).UTC().Format(time.RFC3339Nano))
				}
				ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":%q,"type":"job.finished","category":"jobs","recipients":["u%d"],"title":"Nightly export finished","body":"Your export of 12,345 rows is ready to download. It holds every order of the quarter.","data":{"export_id":"%s","rows":12345}%s}`,
					prefix+uuid4(), randInt(users), uuid4(), when), "")
				if err != nil {
					return 0, err
				}
				items = append(items, ingest.Item{Producer: "bench", Event: ev, ReceivedAt: time.Now()})
			}
			start := time.Now()
			if _, err := ingest.Ingest(ctx, pool, items); err != nil {
				return 0, err
			}
			took += time.Since(start)
		}
		return took, nil
	}
	if _, err := emit("s-", true); err != nil {
		return result{}, err
	}
	var r result
	// The reference: the same notifications written directly by ingest.
	if r.ingest, err = emit("i-", false); err != nil {
		return result{}, err
	}
	if _, err := pool.Exec(ctx, `TRUNCATE push_queue`); err != nil {
		return result{}, err
	}
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return result{}, err
	}
	firer, err := schedule.New(schedule.Config{DB: pool, BatchSize: batch, Clock: clock.Frozen(at.Add(time.Second)), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	for {
		n, _, err := firer.Pass(ctx)
		if err != nil {
			return result{}, err
		}
		if n == 0 {
			break
		}
	}
	r.fire = time.Since(start)
	var fired int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM push_queue`).Scan(&fired); err != nil || fired != due {
		return result{}, fmt.Errorf("%d pushes queued by the firing, want %d (%v)", fired, due, err)
	}
	// Digest windows closing in the same second: one per fired notification.
	if _, err := pool.Exec(ctx, `WITH q AS (DELETE FROM push_queue RETURNING *)
		INSERT INTO push_digests (user_id, digest_key, window_end, count, notification_id, notification_created_at, category, priority)
		SELECT user_id, 'chat:' || notification_id, $1, 5, notification_id, notification_created_at, category, 'normal' FROM q`, at); err != nil {
		return result{}, err
	}
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return result{}, err
	}
	start = time.Now()
	for {
		_, d, err := firer.Pass(ctx)
		if err != nil {
			return result{}, err
		}
		if d == 0 {
			break
		}
	}
	r.digests = time.Since(start)
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM push_queue WHERE digest_count = 5`).Scan(&fired); err != nil || fired != due {
		return result{}, fmt.Errorf("%d digest pushes queued, want %d (%v)", fired, due, err)
	}
	return r, nil
}

// uuid4 is a random UUIDv4, the key users send.
func uuid4() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func randInt(n int) int64 {
	v, _ := rand.Int(rand.Reader, big.NewInt(int64(n)))
	return v.Int64()
}
