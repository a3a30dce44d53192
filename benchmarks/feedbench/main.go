// Command feedbench measures feed page latency at depth, and what partitions
// cost: one user with over a million notifications spread over 20 weekly
// partitions, a page of 20 read at depth 0, 10k, 100k and 1M rows.
//
// The same rows are loaded twice: into notifications as the migrations make
// it (partitioned by week) and into a database where notifications is one
// plain table with the same columns and indexes. Keyset pages go through
// central's real handler (token check, query, JSON) with httptest recorders,
// server-side, on the partitioned table; the store's query alone is timed on
// the partitioned table and, as the baseline, the one query a plain table
// needs for the same page, alternating, in the same run. The OFFSET baseline runs the same
// page as an OFFSET query. It starts its own Postgres cluster from the
// installed binaries, or uses -database-url.
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
		weeks       = flag.Int("weeks", 20, "weeks (weekly partitions) the rows are spread over")
		iterations  = flag.Int("n", 2000, "keyset pages read per depth")
		offsetIters = flag.Int("offset-n", 30, "OFFSET pages read per depth")
		databaseURL = flag.String("database-url", "", "Postgres maintenance URL (default: start a local cluster)")
		pages       = flag.Bool("pages", true, "measure pages at depth against a plain table and OFFSET")
		tabs        = flag.Bool("tabs", true, "then measure the tabs (all, unread, archived) and the counts with states set")
		tabIters    = flag.Int("tabs-n", 500, "pages read per tab and depth")
	)
	flag.Parse()
	if err := run(*rows, *weeks, *iterations, *offsetIters, *databaseURL, *pages, *tabs, *tabIters); err != nil {
		fmt.Fprintln(os.Stderr, "feedbench:", err)
		os.Exit(1)
	}
}

func run(rows, weeks, iterations, offsetIters int, adminURL string, pages, tabs bool, tabIters int) error {
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
	pool, err := loadDatabase(ctx, adminURL, "bench_feed", rows, weeks, false)
	if err != nil {
		return err
	}
	defer pool.Close()
	var flat *pgxpool.Pool
	if pages {
		if flat, err = loadDatabase(ctx, adminURL, "bench_feed_flat", rows, weeks, true); err != nil {
			return err
		}
		defer flat.Close()
	}
	var deep, partitions int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM notifications WHERE user_id = 'deep'").Scan(&deep); err != nil {
		return err
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'notifications'::regclass").Scan(&partitions); err != nil {
		return err
	}

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
	defer api.Close()
	token, err := issuer.Mint("deep", nil, time.Hour)
	if err != nil {
		return err
	}

	if !pages {
		return measureTabs(ctx, pool, api, token, tabIters)
	}
	type result struct {
		depth                int
		keysetP50, keysetP99 time.Duration
		queryP50, flatP50    time.Duration
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
		// The store's reads alone on the partitioned table, and the one query
		// a plain table needs for the same page, in turn.
		store := feed.NewStore(pool, nil)
		times := [2][]time.Duration{}
		for i := range 2 * iterations {
			t0 := time.Now()
			if i%2 == 0 {
				if _, err := store.Page(ctx, q); err != nil {
					return err
				}
			} else if err := flatPage(ctx, flat, q); err != nil {
				return err
			}
			times[i%2] = append(times[i%2], time.Since(t0))
		}
		query, flatQuery := times[0], times[1]
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
		slices.Sort(flatQuery)
		slices.Sort(offset)
		results = append(results, result{depth, keyset[len(keyset)/2], keyset[len(keyset)*99/100], query[len(query)/2], flatQuery[len(flatQuery)/2], offset[len(offset)/2]})
	}

	fmt.Printf("\n%d rows of one user over %d weeks, %d partitions present; page of 20; keyset through the handler and as the store's query alone on the partitioned and the flat table (n=%d per depth, alternating), OFFSET query alone (n=%d)\n\n", deep, weeks, partitions, iterations, offsetIters)
	fmt.Println("| depth | handler p50 | handler p99 | handler vs depth 0 | query p50, partitioned | query p50, flat table | partitioned vs flat | OFFSET query p50 | OFFSET vs keyset |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range results {
		fmt.Printf("| %d | %s | %s | %.2f× | %s | %s | %.2f× | %s | %.0f× |\n", r.depth, r.keysetP50.Round(time.Microsecond), r.keysetP99.Round(time.Microsecond),
			float64(r.keysetP50)/float64(results[0].keysetP50), r.queryP50.Round(time.Microsecond), r.flatP50.Round(time.Microsecond),
			float64(r.queryP50)/float64(r.flatP50), r.offsetP50.Round(time.Microsecond), float64(r.offsetP50)/float64(r.queryP50))
	}
	if tabs {
		return measureTabs(ctx, pool, api, token, tabIters)
	}
	return nil
}

// flatPage reads q's page from a plain table with one query: the feed query
// as it was before partitions, the read-all watermark included.
func flatPage(ctx context.Context, db *pgxpool.Pool, q feed.Query) error {
	sql := `SELECT n.id, n.type, n.category, n.title, n.body, n.data, n.producer, n.created_at, n.received_at,
			coalesce(n.read_at, CASE WHEN (n.created_at, n.id) <= (w.at, w.id) THEN w.marked END)
		FROM notifications n, (SELECT coalesce(max(through_at), '-infinity') AS at, coalesce(max(through_id), 0) AS id,
			max(marked_at) AS marked FROM read_marks WHERE user_id = $1) w
		WHERE n.user_id = $1`
	args := []any{q.UserID, q.Limit + 1}
	if q.After != nil {
		sql += ` AND (n.created_at, n.id) < ($3, $4)`
		args = append(args, q.After.CreatedAt, q.After.ID)
	}
	rows, err := db.Query(ctx, sql+` ORDER BY n.created_at DESC, n.id DESC LIMIT $2`, args...)
	if err != nil {
		return err
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	if n != q.Limit+1 {
		return fmt.Errorf("flat page: %d rows, %v", n, rows.Err())
	}
	return rows.Err()
}

// loadDatabase creates database name with the schema and loads the rows: the
// measured user's, 100 per created_at (rows of one ingest transaction share
// it), among other users', spread evenly over the last `weeks` weeks. With
// flat, notifications is replaced by one plain table of the same columns and
// indexes first.
func loadDatabase(ctx context.Context, adminURL, name string, rows, weeks int, flat bool) (*pgxpool.Pool, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, err
	}
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, err
	}
	conn.Close(ctx)
	url := strings.Replace(adminURL, "/postgres?", "/"+name+"?", 1)
	if _, err := migrations.Up(ctx, url, nil); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	steps := []string{}
	if flat {
		steps = append(steps,
			`DROP TABLE notifications`,
			`CREATE TABLE notifications (
				id bigint GENERATED BY DEFAULT AS IDENTITY, user_id text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
				received_at timestamptz, type text NOT NULL, category text NOT NULL, title text NOT NULL DEFAULT '', body text NOT NULL DEFAULT '',
				data jsonb NOT NULL DEFAULT '{}'::jsonb, producer text NOT NULL, idempotency_key text NOT NULL, notification_key text NOT NULL,
				run_id text, read_at timestamptz, PRIMARY KEY (id, created_at))`,
			`CREATE INDEX notifications_feed ON notifications (user_id, created_at DESC, id DESC)`,
			`CREATE INDEX notifications_unread ON notifications (user_id, created_at DESC, id DESC) WHERE read_at IS NULL`)
	} else {
		steps = append(steps, fmt.Sprintf(`SELECT spoolcast_ensure_week_partition('notifications', w)
			FROM generate_series(now() - interval '%d weeks', now(), interval '1 week') w`, weeks))
	}
	total := rows + rows/10
	steps = append(steps, fmt.Sprintf(`INSERT INTO notifications (user_id, created_at, type, category, title, body, data, producer, idempotency_key, notification_key)
		SELECT CASE WHEN g %% 11 = 0 THEN 'other_' || (g %% 1000) ELSE 'deep' END,
		       now() - interval '%d weeks' + (g / 100) * (interval '%d weeks' / (%d / 100)),
		       'job.finished', 'jobs', 'Nightly export finished', 'Your export of 12,345 rows is ready to download.',
		       jsonb_build_object('job_id', 'j_' || g, 'rows', 12345), 'bench', 'k' || g, 'k' || g
		FROM generate_series(1, %d) g`, weeks, weeks, total, total), "VACUUM ANALYZE notifications")
	for _, q := range steps {
		if _, err := pool.Exec(ctx, q); err != nil {
			pool.Close()
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	fmt.Fprintf(os.Stderr, "%s: loaded %d rows in %s\n", name, total, time.Since(start).Round(time.Second))
	return pool, nil
}
