package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/egress"
	"github.com/spoolcast/spoolcast/internal/eventtest"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/webhook"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// delivery is one request a receiver got.
type delivery struct {
	ID, Timestamp, Signature string
	Body                     []byte
}

// receiver is a real HTTP server standing in for a subscriber: it answers
// with status (or stalls), and records what it got.
type receiver struct {
	*httptest.Server
	mu       sync.Mutex
	got      []delivery
	status   int           // answer; 0 is 204
	stall    time.Duration // wait before answering
	headers  http.Header   // extra answer headers
	gate     chan struct{} // when set, answers wait for it to close
	requests int
}

func newReceiver(t testing.TB) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.requests++
		status, stall, gate := r.status, r.stall, r.gate
		for k, v := range r.headers {
			w.Header()[k] = v
		}
		r.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-req.Context().Done():
				return
			}
		}
		if stall > 0 {
			select {
			case <-time.After(stall):
			case <-req.Context().Done():
				return
			}
		}
		if status == 0 || status/100 == 2 {
			r.mu.Lock()
			r.got = append(r.got, delivery{req.Header.Get("webhook-id"), req.Header.Get("webhook-timestamp"), req.Header.Get("webhook-signature"), body})
			r.mu.Unlock()
		}
		w.WriteHeader(max(status, 204))
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) set(status int, stall time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status, r.stall = status, stall
}

// hold makes the receiver's answers to requests from now on wait until
// release (or the test's end): an attempt in flight for as long as a test
// needs it. A later hold holds the requests after it, released apart.
func (r *receiver) hold(t testing.TB) (release func()) {
	r.mu.Lock()
	gate := make(chan struct{})
	r.gate = gate
	r.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			r.mu.Lock()
			if r.gate == gate { // not a later hold's
				r.gate = nil
			}
			r.mu.Unlock()
			close(gate)
		})
	}
	t.Cleanup(release) // before Close, which waits for the held answers
	return release
}

// requested is how many requests the receiver has had, answered or not.
func (r *receiver) requested() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

func (r *receiver) deliveries() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got...)
}

// env is a migrated database, a store and a deliverer on a fake clock.
type env struct {
	t       *testing.T
	url     string
	pool    *pgxpool.Pool
	clk     *clock.Fake
	metrics *webhook.Metrics
	store   *webhook.Store
	d       *webhook.Deliverer
}

func newEnv(t *testing.T, cfg webhook.DelivererConfig) *env {
	t.Helper()
	url := pgtest.DB(t)
	pool := pgtest.Connect(t, url)
	clk := clock.NewFake(time.Now())
	e := &env{t: t, url: url, pool: pool, clk: clk, metrics: webhook.NewMetrics(nil),
		store: webhook.NewStore(webhook.StoreConfig{DB: pool, AllowPrivate: true, Clock: clk})}
	e.d = e.replica(cfg)
	return e
}

// replica is another deliverer on the env's database and clock, as another
// replica runs one; its DB is the pool unless cfg says otherwise.
func (e *env) replica(cfg webhook.DelivererConfig) *webhook.Deliverer {
	e.t.Helper()
	if cfg.DB == nil {
		cfg.DB = e.pool
	}
	if cfg.Metrics == nil {
		cfg.Metrics = e.metrics
	}
	cfg.Clock, cfg.AllowPrivate = e.clk, true
	d, err := webhook.NewDeliverer(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

func (e *env) endpoint(url string, events ...string) webhook.Endpoint {
	e.t.Helper()
	ep, err := e.store.Create(context.Background(), webhook.NewEndpoint{URL: url, Events: events})
	if err != nil {
		e.t.Fatal(err)
	}
	return ep
}

// pass runs the deliverer's passes until nothing more is due now, waiting
// for each pass's attempts.
func (e *env) pass() {
	e.t.Helper()
	for range 100 {
		more, err := e.d.Pass(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		e.d.Wait()
		if !more {
			return
		}
	}
}

func (e *env) ingest(key string, users ...string) {
	e.t.Helper()
	if _, err := ingest.Ingest(context.Background(), e.pool, []ingest.Item{{Producer: "jobs", Event: eventtest.Event(e.t, key, users...)}}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	return pgtest.Count(e.t, e.pool, query, args...)
}

type body struct {
	Type      string         `json:"type"`
	Timestamp time.Time      `json:"timestamp"`
	Data      map[string]any `json:"data"`
}

func decode(t *testing.T, raw []byte) body {
	t.Helper()
	var b body
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatalf("body %s: %v", raw, err)
	}
	return b
}

func TestEachStateChangeIsOneSignedDeliveryToEachEndpointThatTakesIt(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	feeds, pushes := newReceiver(t), newReceiver(t)
	epFeed := e.endpoint(feeds.URL, webhook.NotificationCreated, webhook.NotificationRead)
	e.endpoint(pushes.URL, webhook.PushSent, webhook.PushDelivered, webhook.PushFailed, webhook.PushSkipped)
	if !strings.HasPrefix(epFeed.Secret, "whsec_") {
		t.Fatalf("secret %q: want whsec_…", epFeed.Secret)
	}

	e.ingest("export-1", "alice", "bob")
	e.ingest("export-1", "alice", "bob") // a duplicate changes nothing, so sends nothing
	var created time.Time
	var seq int64
	if err := e.pool.QueryRow(context.Background(), `SELECT created_at, id FROM notifications WHERE user_id = 'alice'`).Scan(&created, &seq); err != nil {
		t.Fatal(err)
	}
	id := feed.ID{CreatedAt: created, Seq: seq}
	if err := feed.NewStore(e.pool, nil).MarkRead(context.Background(), "alice", id); err != nil {
		t.Fatal(err)
	}
	// A dispatch through its states: queued is no event, the rest are.
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, token, state)
		VALUES ($1, $2, 'alice', 'ExponentPushToken[a]', 'queued')`, seq, created); err != nil {
		t.Fatal(err)
	}
	for _, state := range []string{"sent", "sent", "delivered"} { // sent twice: one change
		if _, err := e.pool.Exec(context.Background(), `UPDATE push_dispatches SET state = $1, updated_at = now()`, state); err != nil {
			t.Fatal(err)
		}
	}
	e.pass()

	got := feeds.deliveries()
	if len(got) != 3 {
		t.Fatalf("feed endpoint got %d deliveries, want 2 created + 1 read", len(got))
	}
	types := map[string]int{}
	for _, d := range got {
		b := decode(t, d.Body)
		types[b.Type]++
		if b.Type == webhook.NotificationRead && (b.Data["notification_id"] != id.String() || b.Data["user_id"] != "alice") {
			t.Errorf("read event data = %v, want alice's %s", b.Data, id)
		}
		if b.Type == webhook.NotificationCreated && b.Data["user_id"] == "alice" {
			if b.Data["id"] != id.String() || b.Data["idempotency_key"] != "export-1" || b.Data["producer"] != "jobs" || b.Data["title"] != "Export ready" {
				t.Errorf("created event data = %v", b.Data)
			}
		}
		want, _ := webhook.Sign([]string{epFeed.Secret}, d.ID, mustInt(t, d.Timestamp), d.Body)
		if d.Signature != want {
			t.Errorf("signature %q, want %q", d.Signature, want)
		}
	}
	if types[webhook.NotificationCreated] != 2 || types[webhook.NotificationRead] != 1 {
		t.Errorf("types = %v", types)
	}
	var pushTypes []string
	for _, d := range pushes.deliveries() {
		b := decode(t, d.Body)
		pushTypes = append(pushTypes, b.Type)
		if b.Data["notification_id"] != id.String() || b.Data["idempotency_key"] != "export-1" {
			t.Errorf("push event data = %v", b.Data)
		}
	}
	if fmt.Sprint(pushTypes) != "[push.sent push.delivered]" && fmt.Sprint(pushTypes) != "[push.delivered push.sent]" {
		t.Errorf("push endpoint got %v, want push.sent and push.delivered once each", pushTypes)
	}
	if n := e.count(`SELECT count(*) FROM webhook_deliveries WHERE state <> 'delivered'`); n != 0 {
		t.Errorf("%d deliveries not delivered", n)
	}
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	var n int64
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("timestamp %q: %v", s, err)
	}
	return n
}

func TestNoEndpointNoOutbox(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	e.ingest("k", "alice")
	r := newReceiver(t)
	ep := e.endpoint(r.URL, webhook.NotificationRead)
	e.ingest("k2", "alice") // not a type the endpoint takes
	if n := e.count(`SELECT count(*) FROM webhook_deliveries`); n != 0 {
		t.Fatalf("%d deliveries without an endpoint taking them", n)
	}
	if err := e.store.Delete(context.Background(), ep.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Delete(context.Background(), ep.ID); !errors.Is(err, webhook.ErrNotFound) {
		t.Errorf("second delete = %v, want ErrNotFound", err)
	}
}

func TestOneSlowEndpointHoldsOnlyItsOwnShare(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{Timeout: 2 * time.Second, Concurrency: 8, PerEndpoint: 2})
	slow, fast := newReceiver(t), newReceiver(t)
	slow.set(0, 1500*time.Millisecond)
	e.endpoint(slow.URL, webhook.NotificationCreated)
	e.endpoint(fast.URL, webhook.NotificationCreated)
	for i := range 20 {
		e.ingest(fmt.Sprintf("k%d", i), "alice")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.d.Start(ctx)
	defer e.d.Stop(context.Background())
	deadline := time.Now().Add(10 * time.Second)
	for len(fast.deliveries()) < 20 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	// The fast receiver got all 20 while the slow one, 2 at a time at
	// 1.5 s each, had at most a few.
	if n := len(fast.deliveries()); n != 20 {
		t.Fatalf("fast receiver got %d of 20", n)
	}
	if n := len(slow.deliveries()); n > 6 {
		t.Errorf("slow receiver got %d already: per-endpoint cap not kept", n)
	}
}

func TestSecretRotationSignsWithBothForTheOverlap(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	r := newReceiver(t)
	ep := e.endpoint(r.URL, webhook.NotificationCreated)
	next, until, err := e.store.RotateSecret(context.Background(), ep.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !until.Equal(e.clk.Now().Add(time.Hour).Truncate(time.Microsecond)) && until.Sub(e.clk.Now()) > time.Hour+time.Second {
		t.Errorf("previous secret until %s", until)
	}
	e.ingest("during", "alice")
	e.pass()
	e.clk.Advance(time.Hour + time.Second)
	e.ingest("after", "alice")
	e.pass()
	got := r.deliveries()
	if len(got) != 2 {
		t.Fatalf("got %d deliveries", len(got))
	}
	both, _ := webhook.Sign([]string{next, ep.Secret}, got[0].ID, mustInt(t, got[0].Timestamp), got[0].Body)
	if got[0].Signature != both {
		t.Errorf("during the overlap: signature %q, want both secrets' %q", got[0].Signature, both)
	}
	only, _ := webhook.Sign([]string{next}, got[1].ID, mustInt(t, got[1].Timestamp), got[1].Body)
	if got[1].Signature != only {
		t.Errorf("after the overlap: signature %q, want the new secret's only", got[1].Signature)
	}
	// A leaked secret: rotated with no overlap, only the newest signs.
	leaked, _, err := e.store.RotateSecret(context.Background(), ep.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	e.ingest("after-leak", "alice")
	e.pass()
	if got = r.deliveries(); len(got) != 3 {
		t.Fatalf("got %d deliveries, want 3", len(got))
	}
	if only, _ := webhook.Sign([]string{leaked}, got[2].ID, mustInt(t, got[2].Timestamp), got[2].Body); got[2].Signature != only {
		t.Errorf("after a rotation without overlap: signature %q, want the newest secret's only", got[2].Signature)
	}
	if _, _, err := e.store.RotateSecret(context.Background(), ep.ID, 8*24*time.Hour); !errors.Is(err, webhook.ErrInvalidInput) {
		t.Errorf("an 8-day overlap = %v, want refused", err)
	}
}

func TestURLsOnPrivateRangesAreRefusedUnlessAllowed(t *testing.T) {
	pool := pgtest.Connect(t, pgtest.DB(t))
	strict := webhook.NewStore(webhook.StoreConfig{DB: pool})
	for _, u := range []string{"http://127.0.0.1:9/x", "http://localhost/x", "http://10.1.2.3/", "http://169.254.169.254/latest/meta-data",
		"http://[::1]/", "http://[fd00::1]/", "http://192.168.1.1/", "http://[::ffff:10.0.0.1]/", "http://100.64.0.1/"} {
		_, err := strict.Create(context.Background(), webhook.NewEndpoint{URL: u, Events: []string{webhook.NotificationCreated}})
		var in *webhook.InputError
		if !errors.As(err, &in) || in.Field != "url" || !strings.Contains(in.Detail, "--webhook-allow-private") {
			t.Errorf("%s: %v, want refused naming --webhook-allow-private", u, err)
		}
	}
	for _, c := range []struct{ url, want string }{
		{"ftp://example.com/", "http or https"},
		{"https://user:pw@example.com/", "credentials"},
		{"https:///nohost", "no host"},
		{"https://example.com/#frag", "fragment"},
	} {
		_, err := strict.Create(context.Background(), webhook.NewEndpoint{URL: c.url, Events: []string{webhook.NotificationCreated}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.url, err, c.want)
		}
	}
	lax := webhook.NewStore(webhook.StoreConfig{DB: pool, AllowPrivate: true})
	if _, err := lax.Create(context.Background(), webhook.NewEndpoint{URL: "https://example.com/", Events: []string{"push.everything"}}); err == nil || !strings.Contains(err.Error(), "not an event type") {
		t.Errorf("unknown event type: %v", err)
	}
	// At delivery, the dialer refuses what the name resolves to, whatever
	// it resolved to at creation.
	r := newReceiver(t)
	client := webhook.Client(time.Second, false, 1)
	_, err := client.Post(r.URL, "application/json", strings.NewReader("{}"))
	if !errors.Is(err, webhook.ErrPrivateTarget) {
		t.Errorf("dialling %s = %v, want ErrPrivateTarget", r.URL, err)
	}
	for _, a := range []string{"8.8.8.8", "2606:4700::1111"} {
		if !egress.Public(netip.MustParseAddr(a)) {
			t.Errorf("%s is public", a)
		}
	}
}

func TestRetentionKeepsWhatReplayCanReachAndTheGaugesCount(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{Retention: 7 * 24 * time.Hour})
	r := newReceiver(t)
	e.endpoint(r.URL, webhook.NotificationCreated)
	e.ingest("old", "alice", "bob")
	e.pass()
	down := newReceiver(t)
	down.set(503, 0)
	e.endpoint(down.URL, webhook.NotificationCreated)
	e.ingest("new", "carol")
	e.pass() // carol's: delivered to the first, retrying to the second
	if _, err := e.d.Maintain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT count(*) FROM webhook_deliveries`); n != 4 {
		t.Fatalf("%d deliveries before retention, want 4", n)
	}
	e.clk.Advance(8 * 24 * time.Hour)
	e.ingest("today", "dave") // the second endpoint is failing: its delivery stays pending
	if _, err := e.d.Maintain(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Past retention: every ended delivery and its attempts went; the one
	// made today stays, as does the one still retrying (it ends first).
	var left []string
	rows, _ := e.pool.Query(context.Background(), `SELECT payload->'data'->>'idempotency_key' || ':' || state FROM webhook_deliveries ORDER BY 1`)
	for rows.Next() {
		var s string
		rows.Scan(&s)
		left = append(left, s)
	}
	if fmt.Sprint(left) != "[new:pending today:pending today:pending]" {
		t.Errorf("after retention: %v", left)
	}
	if n := e.count(`SELECT count(*) FROM webhook_attempts`); n != 0 {
		t.Errorf("%d attempts older than retention kept (all were made 8 days ago)", n)
	}
}

func TestAReplayAndADeleteOfABusyEndpointGoABatchAtATime(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	busy := e.endpoint(newReceiver(t).URL, webhook.NotificationCreated)
	other := e.endpoint(newReceiver(t).URL, webhook.NotificationCreated)
	e.ingest("k", "alice")
	// 12,001 delivered deliveries to busy (more than two replay batches),
	// each with an attempt in its log; other keeps its one.
	e.exec(`INSERT INTO webhook_deliveries (endpoint_id, type, payload, created_at, state, attempts, ended_at)
		SELECT endpoint_id, type, payload, created_at - make_interval(secs => g), 'delivered', 1, now()
		FROM webhook_deliveries, generate_series(1, 12000) g WHERE endpoint_id = $1`, busy.ID)
	e.exec(`UPDATE webhook_deliveries SET state = 'delivered', ended_at = now()`)
	e.exec(`INSERT INTO webhook_attempts (delivery_id, endpoint_id, status, duration_ms) SELECT id, endpoint_id, 200, 1 FROM webhook_deliveries`)
	want := e.count(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1`, busy.ID)

	n, err := e.store.Replay(context.Background(), busy.ID, time.Time{})
	if err != nil || n != int64(want) {
		t.Fatalf("replay queued %d (%v), want %d", n, err, want)
	}
	if got := e.count(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND state = 'pending' AND attempts = 0`, busy.ID); got != want {
		t.Errorf("%d of %d pending again after the replay", got, want)
	}
	if got := e.count(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND state = 'pending'`, other.ID); got != 0 {
		t.Errorf("the replay queued %d of another endpoint's deliveries", got)
	}

	if err := e.store.Delete(context.Background(), busy.ID); err != nil {
		t.Fatal(err)
	}
	e.maintain()
	for _, table := range []string{"webhook_deliveries", "webhook_attempts"} {
		if got := e.count(`SELECT count(*) FROM `+table+` WHERE endpoint_id = $1`, busy.ID); got != 0 {
			t.Errorf("%d rows of the deleted endpoint left in %s", got, table)
		}
		if got := e.count(`SELECT count(*) FROM `+table+` WHERE endpoint_id = $1`, other.ID); got != 1 {
			t.Errorf("%d rows of the other endpoint in %s, want its 1", got, table)
		}
	}
}
