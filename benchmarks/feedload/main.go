// Command feedload measures how many feed reads one central server answers
// per second, against /healthz on the same server in the same run: the first
// page of a feed (with its refresh cursor), the page after it (a cursor), and
// the unread count, each with a valid ES256 bearer token.
//
// It starts its own Postgres cluster (or uses -database-url), loads a
// retained feed for every user (-users, -per-day notifications a day over
// -weeks weeks, weekly partitions as maintenance makes them; most users
// read-all two days ago, the rest never did), and serves central's real
// handler (token check, per-user rate limit, the store's reads, JSON) on a
// loopback port from this process, its pool opened as central opens it:
// -prepared is --database-prepared-statements (auto: feed reads as named
// prepared statements on these direct connections; off: unnamed, as behind
// any pooler). wrk sends the requests, cycling through
// the users and their tokens, over -conns connections; every target runs in
// each round, in an order that rotates between rounds. It prints each
// round, the medians as Markdown with each target as a ratio of /healthz,
// and the CPU each request took from wrk, central and Postgres.
//
// Run it under the shared benchmark lock: flock /tmp/bench.lock feedload.
// Results: benchmarks/README.md, "Feed reads under load".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/central"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/devauth"
	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/ratelimit"
	"github.com/spoolcast/spoolcast/migrations"
)

func main() {
	var cfg config
	flag.IntVar(&cfg.users, "users", 2000, "users, each with a feed and a token; wrk cycles through them")
	flag.IntVar(&cfg.perDay, "per-day", 4, "notifications each user receives a day")
	flag.IntVar(&cfg.weeks, "weeks", 13, "weeks of notifications retained (the default --notification-retention is 90 days)")
	flag.IntVar(&cfg.conns, "conns", 32, "wrk connections")
	flag.IntVar(&cfg.threads, "threads", 2, "wrk threads")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured time per target")
	flag.DurationVar(&cfg.warmup, "warmup", 2*time.Second, "unmeasured time per target before it is measured")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds; each runs every target once")
	flag.IntVar(&cfg.dbConns, "db-max-conns", 10, "central's Postgres connections (central's --db-max-conns default)")
	flag.StringVar(&cfg.targets, "targets", "healthz,first-page,next-page,unread-count", "targets to measure, from healthz, first-page, next-page, unread-count")
	flag.StringVar(&cfg.databaseURL, "database-url", "", "Postgres maintenance URL (default: start a local cluster)")
	flag.StringVar(&cfg.pprofDir, "pprof", "", "write a CPU profile of central for each target's run in round 1 into this directory")
	flag.StringVar(&cfg.wrk, "wrk", "wrk", "the wrk binary")
	flag.TextVar(&cfg.prepared, "prepared", pgpool.PreparedAuto, "central's --database-prepared-statements: auto (its default) and on run feed reads as named prepared statements on these direct connections, off unnamed, as behind a pooler without named statements")
	flag.Parse()
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "feedload:", err)
		os.Exit(1)
	}
}

type config struct {
	users, perDay, weeks      int
	conns, threads            int
	duration, warmup          time.Duration
	rounds, dbConns           int
	targets, databaseURL, wrk string
	pprofDir                  string
	prepared                  pgpool.PreparedStatements
}

// target is one kind of request, and the request each user sends for it.
type target struct {
	name     string
	requests []request
}

type request struct{ path, token string }

// measured is one wrk run of a target, and the CPU it took.
type measured struct {
	rps, p50, p99             float64 // req/s, ms, ms
	wrkCPU, centralCPU, pgCPU time.Duration
	requests                  int64
}

func run(cfg config) error {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "feedload-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil { // Postgres may run as another user
		return err
	}
	adminURL, pgDir := cfg.databaseURL, ""
	if adminURL == "" {
		pgDir = filepath.Join(tmp, "pg")
		c, err := pgcluster.Start(ctx, pgcluster.Config{Dir: pgDir, Settings: []string{"shared_buffers=512MB"}})
		if err != nil {
			return err
		}
		defer c.Stop()
		adminURL = c.URL
	}
	url, err := loadDatabase(ctx, adminURL, "bench_feedload", cfg)
	if err != nil {
		return err
	}
	pool, err := pgpool.New(ctx, pgpool.Config{URL: url, MaxConns: cfg.dbConns, PreparedStatements: cfg.prepared, PrepareOnFirstRun: true})
	if err != nil {
		return err
	}
	defer pool.Close()

	issuer, err := devauth.LoadIssuer(filepath.Join(tmp, "key.pem"), "feedload", "spoolcast")
	if err != nil {
		return err
	}
	jwks := httptest.NewServer(issuer.JWKS())
	defer jwks.Close()
	users, err := auth.NewUserVerifier(auth.UserVerifierConfig{JWKSURL: jwks.URL, Issuer: "feedload", Audience: "spoolcast", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer users.Close()
	// central's defaults: 20 requests a second per user, bursts of 40.
	userLimit, err := ratelimit.New(ratelimit.Config{Name: "user", Rate: ratelimit.Rate{N: 20, Per: time.Second}})
	if err != nil {
		return err
	}
	api, err := central.New(central.Config{DB: pool, Users: users, UserLimit: userLimit, PrepareFeedReads: pgpool.PrepareWhereAllowed, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer api.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	server := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = server.Serve(ln) }()
	defer server.Close()
	base := "http://" + ln.Addr().String()

	targets, err := makeTargets(ctx, pool, issuer, cfg)
	if err != nil {
		return err
	}
	for _, t := range targets {
		if err := check(base, t); err != nil {
			return err
		}
	}
	postmaster := 0
	if pgDir != "" {
		postmaster = postmasterPID(filepath.Join(pgDir, "data"))
	}

	fmt.Fprintf(os.Stderr, "feedload: %d users, %d targets, %d rounds of %s (+%s warm-up) each, wrk -t%d -c%d\n",
		cfg.users, len(targets), cfg.rounds, cfg.duration, cfg.warmup, cfg.threads, cfg.conns)
	results := make(map[string][]measured)
	for round := range cfg.rounds {
		order := slices.Clone(targets)
		for range round % len(order) { // rotate: no target always follows another
			order = append(order[1:], order[0])
		}
		for _, t := range order {
			script, err := writeScript(tmp, t)
			if err != nil {
				return err
			}
			if cfg.warmup > 0 {
				if _, err := runWrk(cfg, base, script, cfg.warmup); err != nil {
					return err
				}
			}
			var profile *os.File
			if cfg.pprofDir != "" && round == 0 {
				if profile, err = os.Create(filepath.Join(cfg.pprofDir, t.name+".pprof")); err != nil {
					return err
				}
				if err := pprof.StartCPUProfile(profile); err != nil {
					return err
				}
			}
			selfBefore, pgBefore := selfCPU(), postgresCPU(postmaster)
			m, err := runWrk(cfg, base, script, cfg.duration)
			m.centralCPU, m.pgCPU = selfCPU()-selfBefore, postgresCPU(postmaster)-pgBefore
			if profile != nil {
				pprof.StopCPUProfile()
				profile.Close()
			}
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			results[t.name] = append(results[t.name], m)
			fmt.Fprintf(os.Stderr, "round %d %-13s %9.0f req/s  p50 %6.2f ms  p99 %6.2f ms  CPU µs/req: wrk %.0f, central %.0f, Postgres %.0f\n",
				round+1, t.name, m.rps, m.p50, m.p99, perRequest(m.wrkCPU, m), perRequest(m.centralCPU, m), perRequest(m.pgCPU, m))
		}
	}
	report(cfg, targets, results)
	return nil
}

// report prints the medians as a Markdown table, each target beside the
// median of its per-round ratios to /healthz.
func report(cfg config, targets []target, results map[string][]measured) {
	health := results["healthz"]
	reads := "unnamed statements (--database-prepared-statements off)"
	if cfg.prepared != pgpool.PreparedOff {
		reads = "prepared statements (--database-prepared-statements " + cfg.prepared.String() + ")"
	}
	fmt.Printf("\n%d users, %d notifications a day each over %d weeks; feed reads as %s; wrk -t%d -c%d, %s per target after %s of warm-up, %d rounds (medians)\n\n",
		cfg.users, cfg.perDay, cfg.weeks, reads, cfg.threads, cfg.conns, cfg.duration, cfg.warmup, cfg.rounds)
	fmt.Println("| target | req/s | vs /healthz | rounds of the ratio | p50 | p99 | CPU µs/req: wrk | central | Postgres |")
	fmt.Println("|---|---:|---:|---|---:|---:|---:|---:|---:|")
	for _, t := range targets {
		ms := results[t.name]
		ratio, rounds := "", ""
		if len(health) == len(ms) && t.name != "healthz" {
			var rs []float64
			var parts []string
			for i := range ms {
				r := ms[i].rps / health[i].rps
				rs = append(rs, r)
				parts = append(parts, fmt.Sprintf("%.3f", r))
			}
			ratio, rounds = fmt.Sprintf("**%.3f**", median(rs)), strings.Join(parts, ", ")
		}
		field := func(f func(measured) float64) float64 {
			var xs []float64
			for _, m := range ms {
				xs = append(xs, f(m))
			}
			return median(xs)
		}
		fmt.Printf("| %s | %s | %s | %s | %.2f ms | %.2f ms | %.0f | %.0f | %.0f |\n", t.name,
			thousands(field(func(m measured) float64 { return m.rps })), ratio, rounds,
			field(func(m measured) float64 { return m.p50 }), field(func(m measured) float64 { return m.p99 }),
			field(func(m measured) float64 { return perRequest(m.wrkCPU, m) }),
			field(func(m measured) float64 { return perRequest(m.centralCPU, m) }),
			field(func(m measured) float64 { return perRequest(m.pgCPU, m) }))
	}
}

func perRequest(cpu time.Duration, m measured) float64 {
	if m.requests == 0 {
		return 0
	}
	return float64(cpu.Microseconds()) / float64(m.requests)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func thousands(x float64) string {
	s := strconv.FormatInt(int64(x+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// makeTargets builds each target's requests: one per user, with the user's
// token; the next page starts at the cursor after the user's first page.
func makeTargets(ctx context.Context, pool *pgxpool.Pool, issuer *devauth.Issuer, cfg config) ([]target, error) {
	want := strings.Split(cfg.targets, ",")
	var out []target
	tokens := make([]string, cfg.users)
	for i := range tokens {
		var err error
		if tokens[i], err = issuer.Mint(userName(i), nil, 24*time.Hour); err != nil {
			return nil, err
		}
	}
	for _, name := range want {
		t := target{name: name}
		for i, token := range tokens {
			path := ""
			switch name {
			case "healthz":
				path = "/healthz"
			case "first-page":
				path = "/v1/notifications?limit=20"
			case "next-page":
				var c feed.Cursor
				err := pool.QueryRow(ctx, `SELECT created_at, id FROM notifications WHERE user_id = $1
					ORDER BY created_at DESC, id DESC OFFSET 19 LIMIT 1`, userName(i)).Scan(&c.CreatedAt, &c.ID)
				if err != nil {
					return nil, fmt.Errorf("cursor of %s: %w", userName(i), err)
				}
				path = "/v1/notifications?limit=20&cursor=" + c.Encode()
			case "unread-count":
				path = "/v1/notifications/unread-count"
			default:
				return nil, fmt.Errorf("unknown target %q", name)
			}
			t.requests = append(t.requests, request{path: path, token: token})
		}
		out = append(out, t)
	}
	return out, nil
}

func userName(i int) string { return fmt.Sprintf("u_%05d", i) }

// check sends a target's first request and wants a 200 with a body that
// shows the feed was read.
func check(base string, t target) error {
	r := t.requests[0]
	req, _ := http.NewRequest(http.MethodGet, base+r.path, nil)
	req.Header.Set("Authorization", "Bearer "+r.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s answered %d: %s", t.name, r.path, resp.StatusCode, body)
	}
	if t.name != "healthz" && !strings.Contains(string(body), `"count"`) && !strings.Contains(string(body), `"has_more":true`) {
		return fmt.Errorf("%s: %s answered %s", t.name, r.path, body)
	}
	return nil
}

// writeScript writes the wrk script of a target: the requests, formatted
// once, sent in turn.
func writeScript(dir string, t target) (string, error) {
	// Formatted in init, once wrk has set the Host header.
	var b strings.Builder
	b.WriteString("local reqs, i = {}, 0\ninit = function(args)\n")
	for _, r := range t.requests {
		fmt.Fprintf(&b, "  reqs[#reqs+1] = wrk.format(\"GET\", %q, {[\"Authorization\"] = \"Bearer %s\"})\n", r.path, r.token)
	}
	b.WriteString("  i = math.random(#reqs)\nend\nrequest = function()\n  i = i % #reqs + 1\n  return reqs[i]\nend\n")
	path := filepath.Join(dir, t.name+".lua")
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

var (
	rpsLine     = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	totalLine   = regexp.MustCompile(`(\d+) requests in`)
	latencyLine = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)\s*$`)
	non2xx      = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	socketErrs  = regexp.MustCompile(`Socket errors: .*`)
)

// runWrk runs wrk for d and reads its figures and its CPU time.
func runWrk(cfg config, base, script string, d time.Duration) (measured, error) {
	cmd := exec.Command(cfg.wrk, "-t"+strconv.Itoa(cfg.threads), "-c"+strconv.Itoa(cfg.conns),
		"-d"+strconv.Itoa(int(d.Seconds()))+"s", "--latency", "-s", script, base)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return measured{}, fmt.Errorf("wrk: %w: %s", err, out)
	}
	text := string(out)
	if m := non2xx.FindStringSubmatch(text); m != nil {
		return measured{}, fmt.Errorf("wrk saw %s answers that were not 2xx:\n%s", m[1], text)
	}
	if m := socketErrs.FindString(text); m != "" {
		return measured{}, errors.New("wrk: " + m)
	}
	var m measured
	if s := rpsLine.FindStringSubmatch(text); s != nil {
		m.rps, _ = strconv.ParseFloat(s[1], 64)
	}
	if s := totalLine.FindStringSubmatch(text); s != nil {
		m.requests, _ = strconv.ParseInt(s[1], 10, 64)
	}
	for _, s := range latencyLine.FindAllStringSubmatch(text, -1) {
		v, _ := strconv.ParseFloat(s[2], 64)
		switch s[3] {
		case "us":
			v /= 1000
		case "s":
			v *= 1000
		}
		if s[1] == "50" {
			m.p50 = v
		} else {
			m.p99 = v
		}
	}
	if m.rps == 0 || m.requests == 0 {
		return measured{}, fmt.Errorf("wrk printed no figures:\n%s", text)
	}
	m.wrkCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return m, nil
}

// selfCPU is this process's CPU time so far: central, and the few idle
// goroutines of the benchmark itself.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// postmasterPID reads the cluster's postmaster.pid; 0 when unknown.
func postmasterPID(dataDir string) int {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return pid
}

// postgresCPU is the CPU time of the postmaster and its children now: the
// backends serving central's pool live through a run, so the difference
// over a run is what it cost Postgres.
func postgresCPU(postmaster int) time.Duration {
	if postmaster == 0 {
		return 0
	}
	entries, _ := os.ReadDir("/proc")
	tick := 100 // USER_HZ on Linux
	var total int64
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command, which is in parentheses and may hold spaces.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if pid != postmaster && ppid != postmaster {
			continue
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		total += utime + stime
	}
	return time.Duration(total) * time.Second / time.Duration(tick)
}

// loadDatabase creates database name with the schema and a retained feed
// for every user: perDay notifications a day over the last weeks weeks, in
// weekly partitions (with this week's and four ahead, as maintenance keeps
// them). Nine users in ten read-all two days ago; the tenth never did, and
// has every notification unread.
func loadDatabase(ctx context.Context, adminURL, name string, cfg config) (string, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", err
	}
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	conn.Close(ctx)
	url := strings.Replace(adminURL, "/postgres?", "/"+name+"?", 1)
	if _, err := migrations.Up(ctx, url, nil); err != nil {
		return "", err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	start := time.Now()
	perUser := cfg.perDay * 7 * cfg.weeks
	steps := []string{
		fmt.Sprintf(`SELECT spoolcast_ensure_week_partition('notifications', w)
			FROM generate_series(now() - interval '%d weeks', now() + interval '4 weeks', interval '1 week') w`, cfg.weeks),
		// Every user's notifications at even steps back from now, in the
		// order they would have arrived (ids grow with created_at).
		fmt.Sprintf(`INSERT INTO notifications (user_id, created_at, type, category, title, body, data, producer, idempotency_key, notification_key)
			SELECT 'u_' || lpad(u::text, 5, '0'), now() - (%d - g) * (interval '%d weeks' / %d) - u * interval '1 second',
			       'job.finished', 'jobs', 'Nightly export finished', 'Your export of 12,345 rows is ready to download.',
			       jsonb_build_object('job_id', 'j_' || g, 'rows', 12345, 'url', 'https://example.com/exports/' || u || '/' || g),
			       'bench', 'k' || u || '-' || g, 'k' || u || '-' || g
			FROM generate_series(1, %d) g, generate_series(0, %d) u
			ORDER BY g, u`, perUser, cfg.weeks, perUser, perUser, cfg.users-1),
		`INSERT INTO read_marks (user_id, through_at, through_id, marked_at, snapshot)
			SELECT DISTINCT ON (user_id) user_id, created_at, id, now() - interval '2 days', pg_current_snapshot()
			FROM notifications
			WHERE created_at < now() - interval '2 days' AND right(user_id, 1) <> '9'
			ORDER BY user_id, created_at DESC, id DESC`,
		"VACUUM ANALYZE notifications",
		"VACUUM ANALYZE read_marks",
	}
	for _, q := range steps {
		if _, err := pool.Exec(ctx, q); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
	}
	fmt.Fprintf(os.Stderr, "feedload: loaded %d notifications (%d users × %d) in %s\n", perUser*cfg.users, cfg.users, perUser, time.Since(start).Round(time.Second))
	return url, nil
}
