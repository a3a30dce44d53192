// Command feedbench measures feed page latency at depth: one user with over a
// million notifications, a page of 20 read at depth 0, 10k, 100k and 1M rows.
//
// Keyset pages go through central's real handler (token check, query, JSON)
// with httptest recorders, server-side. The OFFSET baseline runs the same page
// as an OFFSET query on the same pool, in the same run. It starts its own
// Postgres cluster from the installed binaries, or uses -database-url.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/central"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/devauth"
	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/migrations"
)

func main() {
	var (
		rows        = flag.Int("rows", 1_000_100, "notifications of the measured user")
		iterations  = flag.Int("n", 2000, "keyset pages read per depth")
		offsetIters = flag.Int("offset-n", 30, "OFFSET pages read per depth")
		databaseURL = flag.String("database-url", "", "Postgres maintenance URL (default: start a local cluster)")
	)
	flag.Parse()
	if err := run(*rows, *iterations, *offsetIters, *databaseURL); err != nil {
		fmt.Fprintln(os.Stderr, "feedbench:", err)
		os.Exit(1)
	}
}

func run(rows, iterations, offsetIters int, adminURL string) error {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "feedbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil { // Postgres may run as another user
		return err
	}
	if adminURL == "" {
		c, err := pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(tmp, "pg"), Settings: []string{"shared_buffers=512MB"}})
		if err != nil {
			return err
		}
		defer c.Stop()
		adminURL = c.URL
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS bench_feed WITH (FORCE)")
	if _, err := conn.Exec(ctx, "CREATE DATABASE bench_feed"); err != nil {
		return err
	}
	conn.Close(ctx)
	url := strings.Replace(adminURL, "/postgres?", "/bench_feed?", 1)
	if _, err := migrations.Up(ctx, url, nil); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()

	start := time.Now()
	// The measured user's rows, 100 per created_at (rows of one ingest
	// transaction share it), among other users' rows.
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (key) SELECT 'k' || g FROM generate_series(1, $1) g`, rows+rows/10); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO notifications (user_id, created_at, type, category, title, body, data, producer, idempotency_key, notification_key)
		SELECT CASE WHEN g % 11 = 0 THEN 'other_' || (g % 1000) ELSE 'deep' END,
		       timestamptz '2026-01-01' + ((g / 100) * interval '1 second'),
		       'job.finished', 'jobs', 'Nightly export finished', 'Your export of 12,345 rows is ready to download.',
		       jsonb_build_object('job_id', 'j_' || g, 'rows', 12345), 'bench', 'k' || g, 'k' || g
		FROM generate_series(1, $1) g`, rows+rows/10); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE notifications"); err != nil {
		return err
	}
	var deep int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM notifications WHERE user_id = 'deep'").Scan(&deep); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "loaded %d rows for the measured user in %s\n", deep, time.Since(start).Round(time.Second))

	issuer, err := devauth.LoadIssuer(filepath.Join(tmp, "key.pem"), "feedbench", "spoolcast")
	if err != nil {
		return err
	}
	jwks := httptest.NewServer(issuer.JWKS())
	defer jwks.Close()
	users, err := auth.NewUserVerifier(auth.UserVerifierConfig{JWKSURL: jwks.URL, Issuer: "feedbench", Audience: "spoolcast", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer users.Close()
	api, err := central.New(central.Config{DB: pool, Users: users, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	token, err := issuer.Mint("deep", nil, time.Hour)
	if err != nil {
		return err
	}

	var plan strings.Builder
	prows, err := pool.Query(ctx, `EXPLAIN SELECT id FROM notifications WHERE user_id = 'deep' AND (created_at, id) < ($1, $2) ORDER BY created_at DESC, id DESC LIMIT 21`, time.Now(), int64(1))
	if err != nil {
		return err
	}
	for prows.Next() {
		var line string
		_ = prows.Scan(&line)
		plan.WriteString("    " + line + "\n")
	}
	prows.Close()

	type result struct {
		depth                int
		keysetP50, keysetP99 time.Duration
		queryP50             time.Duration
		offsetP50            time.Duration
	}
	var results []result
	for _, depth := range []int{0, 10_000, 100_000, 1_000_000} {
		if depth+20 > deep {
			return fmt.Errorf("depth %d needs more than %d rows", depth, deep)
		}
		path := "/v1/notifications?limit=20"
		q := feed.Query{UserID: "deep", Limit: 20}
		if depth > 0 {
			var c feed.Cursor
			err := pool.QueryRow(ctx, `SELECT created_at, id FROM notifications WHERE user_id = 'deep'
				ORDER BY created_at DESC, id DESC OFFSET $1 LIMIT 1`, depth-1).Scan(&c.CreatedAt, &c.ID)
			if err != nil {
				return err
			}
			path += "&cursor=" + c.Encode()
			q.After = &c
		}
		store := feed.NewStore(pool)
		query := make([]time.Duration, 0, iterations)
		for range iterations {
			t0 := time.Now()
			if _, err := store.Page(ctx, q); err != nil {
				return err
			}
			query = append(query, time.Since(t0))
		}
		keyset := make([]time.Duration, 0, iterations)
		for i := range iterations + iterations/10 {
			req := httptest.NewRequest(http.MethodGet, path, nil)
			req.Header.Set("Authorization", "Bearer "+token)
			w := httptest.NewRecorder()
			t0 := time.Now()
			api.ServeHTTP(w, req)
			took := time.Since(t0)
			if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"has_more":true`) {
				return fmt.Errorf("depth %d: %d %s", depth, w.Code, w.Body.String())
			}
			if i >= iterations/10 { // the first tenth warms caches
				keyset = append(keyset, took)
			}
		}
		offset := make([]time.Duration, 0, offsetIters)
		for i := range offsetIters + 2 {
			t0 := time.Now()
			r, err := pool.Query(ctx, `SELECT id, type, category, title, body, data, producer, created_at, received_at, read_at
				FROM notifications WHERE user_id = 'deep' ORDER BY created_at DESC, id DESC OFFSET $1 LIMIT 21`, depth)
			if err != nil {
				return err
			}
			n := 0
			for r.Next() {
				n++
			}
			r.Close()
			if i >= 2 {
				offset = append(offset, time.Since(t0))
			}
			if n != 21 {
				return fmt.Errorf("offset %d returned %d rows", depth, n)
			}
		}
		slices.Sort(keyset)
		slices.Sort(query)
		slices.Sort(offset)
		results = append(results, result{depth, keyset[len(keyset)/2], keyset[len(keyset)*99/100], query[len(query)/2], offset[len(offset)/2]})
	}

	fmt.Printf("\nkeyset query plan:\n%s\n", plan.String())
	fmt.Printf("%d rows of one user; page of 20; keyset through the handler and as the store's query alone (n=%d per depth), OFFSET query alone (n=%d)\n\n", deep, iterations, offsetIters)
	fmt.Println("| depth | handler p50 | handler p99 | handler vs depth 0 | keyset query p50 | OFFSET query p50 | OFFSET vs keyset query |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range results {
		fmt.Printf("| %d | %s | %s | %.2f× | %s | %s | %.1f× |\n", r.depth, r.keysetP50.Round(time.Microsecond), r.keysetP99.Round(time.Microsecond),
			float64(r.keysetP50)/float64(results[0].keysetP50), r.queryP50.Round(time.Microsecond), r.offsetP50.Round(time.Microsecond), float64(r.offsetP50)/float64(r.queryP50))
	}
	return nil
}
