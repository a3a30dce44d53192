package forward_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/eventtest"
	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/migrations"
	"github.com/spoolcast/spoolcast/spool"
	"github.com/spoolcast/spoolcast/sync/forward"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// relayProc is a relay subprocess with its forwarder.
type relayProc struct {
	*proctest.Process
	base  string
	spool string
}

func startRelay(t *testing.T, dbURL, spoolPath string, env ...string) *relayProc {
	t.Helper()
	return startRelayOf(t, dbURL, spoolPath, env, nil)
}

// startRelayWith starts a relay with more flags.
func startRelayWith(t *testing.T, dbURL, spoolPath string, args []string) *relayProc {
	t.Helper()
	return startRelayOf(t, dbURL, spoolPath, nil, args)
}

func startRelayOf(t *testing.T, dbURL, spoolPath string, env, args []string) *relayProc {
	t.Helper()
	addr := proctest.FreeAddr(t)
	p := proctest.Start(t, env, append([]string{"relay", "--producer", "billing", "--listen", addr, "--spool", spoolPath,
		"--database-url", dbURL, "--max-backoff", "200ms", "--log-level", "warn"}, args...)...)
	r := &relayProc{Process: p, base: "http://" + addr, spool: spoolPath}
	p.WaitHealthy(r.base)
	return r
}

var client = &http.Client{Timeout: 10 * time.Second}

func eventBody(key string, recipients ...string) string {
	to, _ := json.Marshal(recipients)
	return fmt.Sprintf(`{"idempotency_key":%q,"type":"job.finished","category":"jobs","recipients":%s,"title":"Export %s ready"}`, key, to, key)
}

// post sends one event and returns the status, or 0 when the relay did not answer.
func (r *relayProc) post(body string) int {
	resp, err := client.Post(r.base+"/v1/events", "application/json", strings.NewReader(body))
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (r *relayProc) mustPost(t *testing.T, body string) {
	t.Helper()
	if s := r.post(body); s != http.StatusAccepted && s != http.StatusOK {
		t.Fatalf("post answered %d, want 202 or 200", s)
	}
}

func pendingIn(t *testing.T, spoolPath string) int64 {
	t.Helper()
	rd, err := spool.OpenReadOnly(spoolPath)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	st, err := rd.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.Pending
}

func TestRelayForwardsEveryRecipientExactlyOnce(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.DB(t)
	pool := pgtest.Connect(t, dbURL)
	r := startRelay(t, dbURL, filepath.Join(t.TempDir(), "spool.db"))
	for i := range 200 {
		r.mustPost(t, eventBody(fmt.Sprintf("job:%d", i), "u1", fmt.Sprintf("u%d", i+2)))
	}
	testsignal.Eventually(t, "400 notifications", 30*time.Second, func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM notifications") >= 400
	})
	testsignal.Eventually(t, "the spool to drain", 10*time.Second, func() bool { return pendingIn(t, r.spool) == 0 })
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 400 {
		t.Errorf("notifications = %d, want exactly 400", n)
	}
	if n := pgtest.Count(t, pool, "SELECT count(DISTINCT notification_key) FROM notifications"); n != 400 {
		t.Errorf("distinct keys = %d, want 400", n)
	}
	resp, err := http.Get(r.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var metrics strings.Builder
	_, _ = fmt.Fprint(&metrics, readAll(resp))
	for _, want := range []string{"spoolcast_sync_forwarded_total 200", "spoolcast_sync_lag_seconds_count 200", "spoolcast_sync_batch_duration_seconds_count", "spoolcast_sync_errors_total 0", "spoolcast_sync_duplicates_total 0"} {
		if !strings.Contains(metrics.String(), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	r.Stop()
}

func readAll(resp *http.Response) string {
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestSameKeyThroughTwoRelaysMakesOneNotificationPerRecipient(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.DB(t)
	pool := pgtest.Connect(t, dbURL)
	a := startRelay(t, dbURL, filepath.Join(t.TempDir(), "a.db"))
	b := startRelay(t, dbURL, filepath.Join(t.TempDir(), "b.db"))
	for i := range 50 {
		body := eventBody(fmt.Sprintf("meeting:%d", i), "u1", "u2")
		a.mustPost(t, body)
		b.mustPost(t, body)
	}
	testsignal.Eventually(t, "both spools to drain", 30*time.Second, func() bool {
		return pendingIn(t, a.spool) == 0 && pendingIn(t, b.spool) == 0
	})
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 100 {
		t.Errorf("notifications = %d, want 100 (50 events × 2 recipients, once)", n)
	}
}

func TestCrashAfterCommitBeforeAckResendsWithoutDuplicates(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.DB(t)
	pool := pgtest.Connect(t, dbURL)
	spoolPath := filepath.Join(t.TempDir(), "spool.db")

	// The first relay exits right after its first Postgres commit, before it
	// acknowledges the batch in the spool.
	first := startRelay(t, dbURL, spoolPath, "SPOOLCAST_TEST_FAULT=exit-after-ingest")
	for i := range 20 {
		if s := first.post(eventBody(fmt.Sprintf("k%d", i), "u1", "u2")); s != http.StatusAccepted && s != 0 {
			t.Fatalf("post %d = %d", i, s)
		}
	}
	select {
	case <-first.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not exit at the injected fault")
	}
	committed := pgtest.Count(t, pool, "SELECT count(*) FROM notifications")
	pending := pendingIn(t, spoolPath)
	if committed == 0 || pending == 0 {
		t.Fatalf("after the fault: %d notifications committed, %d spool rows pending; want both > 0", committed, pending)
	}

	second := startRelay(t, dbURL, spoolPath)
	testsignal.Eventually(t, "the spool to drain", 30*time.Second, func() bool { return pendingIn(t, spoolPath) == 0 })
	accepted := acceptedKeys(t, spoolPath)
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 2*accepted {
		t.Errorf("notifications = %d, want %d (each spooled event × 2 recipients, once)", n, 2*accepted)
	}
	resp, err := http.Get(second.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if m := readAll(resp); !strings.Contains(m, "spoolcast_sync_duplicates_total") || strings.Contains(m, "spoolcast_sync_duplicates_total 0\n") {
		t.Error("the re-sent batch was not counted as duplicates")
	}
	resp.Body.Close()
	second.Stop()
}

func acceptedKeys(t *testing.T, spoolPath string) int {
	t.Helper()
	rd, err := spool.OpenReadOnly(spoolPath)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	rows, err := rd.List(context.Background(), spool.AllRows, 0)
	if err != nil {
		t.Fatal(err)
	}
	return len(rows)
}

// migratedCluster starts a Postgres of the test's own, to stop and restart,
// with the schema applied.
func migratedCluster(t *testing.T) (*pgcluster.Cluster, *pgxpool.Pool) {
	t.Helper()
	cluster := pgtest.Cluster(t)
	if _, err := migrations.Up(context.Background(), cluster.URL, nil); err != nil {
		t.Fatal(err)
	}
	return cluster, pgtest.Connect(t, cluster.URL)
}

func TestPostgresOutageDelaysButLosesNothing(t *testing.T) {
	t.Parallel()
	cluster, pool := migratedCluster(t)
	ctx := context.Background()
	r := startRelay(t, cluster.URL, filepath.Join(t.TempDir(), "spool.db"))
	for i := range 50 {
		r.mustPost(t, eventBody(fmt.Sprintf("before:%d", i), "u1"))
	}
	testsignal.Eventually(t, "the first events to land", 30*time.Second, func() bool { return pendingIn(t, r.spool) == 0 })

	if err := cluster.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		if s := r.post(eventBody(fmt.Sprintf("during:%d", i), "u1", "u2")); s != http.StatusAccepted {
			t.Fatalf("post during the outage answered %d, want 202", s)
		}
	}
	if p := pendingIn(t, r.spool); p != 300 {
		t.Fatalf("pending during the outage = %d, want 300", p)
	}
	if err := cluster.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	testsignal.Eventually(t, "the spool to drain after the outage", 60*time.Second, func() bool { return pendingIn(t, r.spool) == 0 })
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 50+600 {
		t.Errorf("notifications = %d, want 650", n)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications WHERE received_at < created_at - interval '1 millisecond'"); n < 600 {
		t.Errorf("%d delayed notifications kept their relay receipt time; want 600", n)
	}
	r.Stop()
}

func TestKill9WhileForwardingLandsEveryEventOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test runs subprocesses")
	}
	t.Parallel()
	dbURL := pgtest.DB(t)
	pool := pgtest.Connect(t, dbURL)
	spoolPath := filepath.Join(t.TempDir(), "spool.db")

	var mu sync.Mutex
	answered := map[string]bool{} // key → answered 202 or 200
	unknown := map[string]bool{}  // key → the relay died before answering
	const recipients = 3
	for round := range 5 {
		r := startRelay(t, dbURL, spoolPath)
		// A producer retries what it never got an answer for.
		for key := range unknown {
			r.mustPost(t, eventBody(key, "u1", "u2", "u3"))
			answered[key] = true
			delete(unknown, key)
		}
		stop := proctest.Load(8, func(g, n int) bool {
			key := fmt.Sprintf("r%d-g%d-n%d", round, g, n)
			s := r.post(eventBody(key, "u1", "u2", "u3"))
			mu.Lock()
			if s == http.StatusAccepted || s == http.StatusOK {
				answered[key] = true
			} else {
				unknown[key] = true
			}
			mu.Unlock()
			return s != 0
		})
		time.Sleep(time.Duration(150+rand.IntN(400)) * time.Millisecond)
		r.Kill()
		stop()
	}
	r := startRelay(t, dbURL, spoolPath)
	for key := range unknown {
		r.mustPost(t, eventBody(key, "u1", "u2", "u3"))
		answered[key] = true
	}
	testsignal.Eventually(t, "the spool to drain", 60*time.Second, func() bool { return pendingIn(t, spoolPath) == 0 })
	want := len(answered) * recipients
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != want {
		t.Errorf("notifications = %d, want %d (%d accepted events × %d recipients)", n, want, len(answered), recipients)
	}
	t.Logf("5 kills, %d events accepted, %d notifications", len(answered), want)
	r.Stop()
}

// inProcess is a spool and a forwarder into a test database, in this process.
type inProcess struct {
	t    *testing.T
	sp   *spool.Spool
	pool *pgxpool.Pool
	reg  *prometheus.Registry
}

func newInProcess(t *testing.T) *inProcess {
	t.Helper()
	sp, err := spool.Open(context.Background(), spool.Config{Path: filepath.Join(t.TempDir(), "spool.db"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close(context.Background()) })
	return &inProcess{t: t, sp: sp, pool: pgtest.Connect(t, pgtest.DB(t)), reg: prometheus.NewRegistry()}
}

// claim spools payload as is, as a relay of another version might have.
func (h *inProcess) claim(key string, payload []byte) {
	h.t.Helper()
	if _, err := h.sp.Claim(context.Background(), spool.Entry{Producer: "p", Key: key, Hash: event.HashCanonical(payload), Payload: payload}); err != nil {
		h.t.Fatal(err)
	}
}

// start runs a forwarder with cfg's settings over the spool and database.
func (h *inProcess) start(cfg forward.Config) *forward.Forwarder {
	h.t.Helper()
	cfg.Spool, cfg.DB, cfg.Metrics, cfg.Logger = h.sp, h.pool, forward.NewMetrics(h.reg), slog.New(slog.DiscardHandler)
	f, err := forward.New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	f.Start(context.Background())
	h.t.Cleanup(func() { f.Stop(context.Background()) })
	return f
}

func (h *inProcess) waitDrained(timeout time.Duration) {
	h.t.Helper()
	testsignal.Eventually(h.t, "the spool to drain", timeout, func() bool {
		next, err := h.sp.NextBatch(context.Background(), 0, spool.BatchLimit{Rows: 1})
		return err == nil && len(next) == 0
	})
}

func TestRowsPostgresRefusesAreSetAsideWithoutHoldingUpTheRest(t *testing.T) {
	t.Parallel()
	h := newInProcess(t)
	for i := range 20 {
		switch i {
		case 7: // an old relay's payload that Postgres refuses: jsonb holds no NUL
			h.claim("nul", []byte(`{"idempotency_key":"nul","type":"t","category":"c","recipients":["u1"],"data":{"a":"\u0000"}}`))
		case 13: // a damaged row
			h.claim("garbage", []byte(`not json`))
		case 17: // an old relay's payload that breaks today's rules: no recipients
			h.claim("nobody", []byte(`{"idempotency_key":"nobody","type":"t","category":"c","recipients":[]}`))
		default:
			ev := eventtest.Event(t, fmt.Sprintf("good-%d", i), "u1")
			h.claim(ev.IdempotencyKey, ev.Canonical())
		}
	}
	f := h.start(forward.Config{})
	h.waitDrained(30 * time.Second)
	if err := f.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, h.pool, "SELECT count(*) FROM notifications"); n != 17 {
		t.Errorf("notifications = %d, want the 17 good events", n)
	}
	dead, err := h.sp.List(context.Background(), spool.DeadRows, 0)
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]string{}
	for _, d := range dead {
		reasons[d.Key] = d.DeadReason
	}
	if len(dead) != 3 || !strings.HasPrefix(reasons["nul"], "refused: ") || !strings.HasPrefix(reasons["garbage"], "invalid: ") ||
		!strings.HasPrefix(reasons["nobody"], "invalid: ") || !strings.Contains(reasons["nobody"], "recipient") {
		t.Errorf("dead rows = %v; want nul refused, garbage and nobody invalid, with reasons", reasons)
	}
	if got := metricValue(t, h.reg, "spoolcast_sync_dead_total"); got != 3 {
		t.Errorf("spoolcast_sync_dead_total = %v, want 3", got)
	}
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestShutdownForwardsTheBacklog(t *testing.T) {
	t.Parallel()
	cluster, pool := migratedCluster(t)
	ctx := context.Background()
	if err := cluster.Stop(); err != nil {
		t.Fatal(err)
	}
	r := startRelay(t, cluster.URL, filepath.Join(t.TempDir(), "spool.db"))
	for i := range 200 {
		r.mustPost(t, eventBody(fmt.Sprintf("backlog:%d", i), "u1"))
	}
	if err := cluster.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	r.Stop() // SIGTERM with a backlog: the final forward sends it
	if p := pendingIn(t, r.spool); p != 0 {
		t.Errorf("%d events still pending after a clean shutdown with Postgres up", p)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM notifications"); n != 200 {
		t.Errorf("notifications = %d, want 200", n)
	}
}

func TestAConflictFoundInPostgresAfterA202IsADeadRow(t *testing.T) {
	t.Parallel()
	first := newInProcess(t)
	// A second relay of the same producer, with its own spool, on the same database.
	second := &inProcess{t: t, pool: first.pool, reg: prometheus.NewRegistry()}
	var err error
	if second.sp, err = spool.Open(context.Background(), spool.Config{Path: filepath.Join(t.TempDir(), "b.db"), Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.sp.Close(context.Background()) })
	a := eventtest.Event(t, "invoice:7", "u1")
	b := eventtest.Event(t, "invoice:7", "u2") // the same key, another request
	first.claim(a.IdempotencyKey, a.Canonical())
	second.claim(b.IdempotencyKey, b.Canonical())
	first.start(forward.Config{})
	first.waitDrained(30 * time.Second)
	second.start(forward.Config{})
	second.waitDrained(30 * time.Second)
	testsignal.Eventually(t, "the conflict to be set aside", 30*time.Second, func() bool {
		dead, _ := second.sp.List(context.Background(), spool.DeadRows, 0)
		return len(dead) == 1
	})
	dead, _ := second.sp.List(context.Background(), spool.DeadRows, 0)
	if !strings.HasPrefix(dead[0].DeadReason, "conflict: ") || string(dead[0].Payload) != string(b.Canonical()) {
		t.Errorf("dead row = %q with payload %s; want a conflict keeping the second request", dead[0].DeadReason, dead[0].Payload)
	}
	if n := pgtest.Count(t, first.pool, "SELECT count(*) FROM notifications WHERE user_id = 'u2'"); n != 0 {
		t.Errorf("the conflicting request wrote %d notifications", n)
	}
	if got := metricValue(t, second.reg, "spoolcast_sync_dead_total"); got != 1 {
		t.Errorf("spoolcast_sync_dead_total = %v, want 1 (reason conflict)", got)
	}
	if st, _ := second.sp.Stats(context.Background()); st.Pending != 0 || st.KeptKeys != 0 || st.Dead != 1 {
		t.Errorf("second spool = %+v; want the event dead, not acknowledged", st)
	}
}

// TestTheWorstLegalInputLandsInBoundedMemory posts the largest events the
// relay accepts, 64 KiB with 1,000 recipients each, and checks the relay's
// peak resident memory stays under the 256 MiB of the sidecar manifest.
func TestTheWorstLegalInputLandsInBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay as a subprocess")
	}
	t.Parallel()
	dbURL := pgtest.DB(t)
	pool := pgtest.Connect(t, dbURL)
	r := startRelay(t, dbURL, filepath.Join(t.TempDir(), "spool.db"))
	const events, recipients = 24, 1000
	bodies := make(chan string, events)
	for i := range events {
		bodies <- largestEvent(t, fmt.Sprintf("big:%d", i), recipients)
	}
	close(bodies)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for body := range bodies {
				r.mustPost(t, body)
			}
		})
	}
	wg.Wait()
	testsignal.Eventually(t, "every notification to land", 120*time.Second, func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM notifications") == events*recipients
	})
	peak, err := r.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("relay peak RSS after %d events of 64 KiB × %d recipients: %.1f MiB", events, recipients, float64(peak)/(1<<20))
	if peak > 256<<20 {
		t.Errorf("relay peak RSS %.1f MiB; want under 256 MiB", float64(peak)/(1<<20))
	}
	r.Stop()
}

// largestEvent returns an event just under the 64 KiB body limit with n recipients.
func largestEvent(t *testing.T, key string, n int) string {
	t.Helper()
	to := make([]string, n)
	for i := range to {
		to[i] = fmt.Sprintf("user_%05d", i)
	}
	rcpt, _ := json.Marshal(to)
	head := fmt.Sprintf(`{"idempotency_key":%q,"type":"report.ready","category":"reports","recipients":%s,"title":"Report","data":{"blob":"`, key, rcpt)
	tail := `"}}`
	fill := make([]byte, 64<<10-len(head)-len(tail))
	for i := range fill {
		fill[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[(i*7+len(key))%36]
	}
	return head + string(fill) + tail
}
