package forward_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/relay"
	"github.com/spoolcast/spoolcast/spool"
	"github.com/spoolcast/spoolcast/sync/forward"
)

// cancelHarness is a relay in this process, its spool file and the
// forwarder into a test database, started when the test says so, all on
// one metrics registry as in the relay's binary.
type cancelHarness struct {
	t         *testing.T
	spoolPath string
	pool      *pgxpool.Pool
	reg       *prometheus.Registry
	metrics   *forward.Metrics
	sp        *spool.Spool
	http      *httptest.Server
	url       string
	forwarder *forward.Forwarder
}

func newCancelHarness(t *testing.T) *cancelHarness {
	t.Helper()
	h := &cancelHarness{t: t, spoolPath: filepath.Join(t.TempDir(), "spool.db"), pool: pgtest.Connect(t, pgtest.DB(t))}
	h.openRelay()
	t.Cleanup(func() {
		if h.forwarder != nil {
			h.forwarder.Stop(context.Background())
		}
		h.closeRelay()
	})
	return h
}

// openRelay opens the spool file and serves the relay over it, on a new
// registry: a relay process starting.
func (h *cancelHarness) openRelay() {
	h.t.Helper()
	logger := slog.New(slog.NewTextHandler(testLog{h.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sp, err := spool.Open(context.Background(), spool.Config{Path: h.spoolPath, Logger: logger})
	if err != nil {
		h.t.Fatal(err)
	}
	h.reg = prometheus.NewRegistry()
	srv, err := relay.New(relay.Config{Producer: "billing", Spool: sp, Registry: h.reg, Logger: logger})
	if err != nil {
		h.t.Fatal(err)
	}
	h.metrics = forward.NewMetrics(h.reg)
	h.sp, h.http = sp, httptest.NewServer(srv)
	h.url = h.http.URL
}

// closeRelay stops serving and closes the spool: a relay process stopping.
func (h *cancelHarness) closeRelay() {
	h.t.Helper()
	if h.sp == nil {
		return
	}
	h.http.Close()
	if err := h.sp.Close(context.Background()); err != nil {
		h.t.Error(err)
	}
	h.sp = nil
}

// startForwarder forwards the spool with cfg's batch settings.
func (h *cancelHarness) startForwarder(cfg forward.Config) {
	h.t.Helper()
	cfg.Spool, cfg.DB, cfg.Metrics = h.sp, h.pool, h.metrics
	cfg.Logger = slog.New(slog.NewTextHandler(testLog{h.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	f, err := forward.New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	f.Start(context.Background())
	h.forwarder = f
}

type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// post sends an event to the relay; it must be answered 202.
func (h *cancelHarness) post(body string) {
	h.t.Helper()
	resp, err := http.Post(h.url+"/v1/events", "application/json", strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		raw, _ := io.ReadAll(resp.Body)
		h.t.Fatalf("POST = %d %s; want 202", resp.StatusCode, raw)
	}
}

// cancel sends DELETE /v1/events/{key}; it must be answered 202 with the
// cancellation's body.
func (h *cancelHarness) cancel(key string) {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodDelete, h.url+"/v1/events/"+key, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	want := fmt.Sprintf(`{"status":"cancel_accepted","idempotency_key":%q}`+"\n", key)
	if resp.StatusCode != http.StatusAccepted || string(raw) != want {
		h.t.Fatalf("DELETE %s = %d %q; want 202 %q", key, resp.StatusCode, raw, want)
	}
}

func (h *cancelHarness) waitDrained() {
	h.t.Helper()
	testsignal.Eventually(h.t, "the spool to drain", 30*time.Second, func() bool {
		st, err := h.sp.Stats(context.Background())
		return err == nil && st.Pending == 0
	})
}

// metrics returns the relay's /metrics page.
func (h *cancelHarness) metricsPage() string {
	h.t.Helper()
	resp, err := http.Get(h.url + "/metrics")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	return readAll(resp)
}

// wantCancels checks the cancellation outcomes counted, exactly.
func (h *cancelHarness) wantCancels(cancelled, alreadySent, unknown int) {
	h.t.Helper()
	page := h.metricsPage()
	for outcome, n := range map[string]int{"cancelled": cancelled, "already_sent": alreadySent, "unknown": unknown} {
		if want := fmt.Sprintf("spoolcast_relay_cancels_total{outcome=%q} %d\n", outcome, n); !strings.Contains(page, want) {
			h.t.Errorf("metrics lack %q", strings.TrimSpace(want))
		}
	}
}

// cancelReceivedAt is when the spool received the cancellation of key.
func (h *cancelHarness) cancelReceivedAt(key string) time.Time {
	h.t.Helper()
	rows, err := h.sp.List(context.Background(), spool.AllRows, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, rec := range rows {
		if producer, ok := rec.CancelOf(); ok && producer == "billing" && rec.Key == key {
			return rec.ReceivedAt
		}
	}
	h.t.Fatalf("no cancellation of %s in the spool", key)
	return time.Time{}
}

// wantCancelled checks that the scheduled event key of n recipients is
// cancelled: each of its rows marked at the cancellation's receipt, one
// cancelled dispatch per recipient, nothing in the feed.
func (h *cancelHarness) wantCancelled(key string, n int) {
	h.t.Helper()
	at := h.cancelReceivedAt(key)
	if got := pgtest.Count(h.t, h.pool, `SELECT count(*) FROM scheduled_notifications WHERE producer = 'billing' AND idempotency_key = $1`, key); got != n {
		h.t.Errorf("%s: %d scheduled rows, want %d", key, got, n)
	}
	if got := pgtest.Count(h.t, h.pool, `SELECT count(*) FROM scheduled_notifications WHERE producer = 'billing' AND idempotency_key = $1 AND cancelled_at = $2`, key, at); got != n {
		h.t.Errorf("%s: %d scheduled rows cancelled at the DELETE's receipt %s, want %d", key, got, at.UTC().Format(time.RFC3339Nano), n)
	}
	if got := pgtest.Count(h.t, h.pool, `SELECT count(*) FROM push_dispatches d JOIN scheduled_notifications s ON s.id = d.notification_id
		WHERE s.idempotency_key = $1 AND d.state = 'cancelled' AND d.user_id = s.user_id`, key); got != n {
		h.t.Errorf("%s: %d cancelled dispatches of its rows, want %d", key, got, n)
	}
	if got := pgtest.Count(h.t, h.pool, `SELECT count(DISTINCT d.user_id) FROM push_dispatches d JOIN scheduled_notifications s ON s.id = d.notification_id
		WHERE s.idempotency_key = $1`, key); got != n {
		h.t.Errorf("%s: dispatches for %d recipients, want one for each of %d", key, got, n)
	}
	if got := pgtest.Count(h.t, h.pool, `SELECT count(*) FROM notifications WHERE idempotency_key = $1`, key); got != 0 {
		h.t.Errorf("%s: %d notifications in the feed, want none", key, got)
	}
}

// scheduledBody is an event for recipients, due in an hour.
func scheduledBody(key string, recipients ...string) string {
	sendAt := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	return strings.Replace(eventBody(key, recipients...), `{`, `{"send_at":"`+sendAt+`",`, 1)
}

func TestADeletedScheduledEventIsCancelledInPostgres(t *testing.T) {
	t.Parallel()
	h := newCancelHarness(t)
	h.startForwarder(forward.Config{})
	h.post(scheduledBody("report:1", "u1", "u2", "u3"))
	h.waitDrained()
	if got := pgtest.Count(t, h.pool, `SELECT count(*) FROM scheduled_notifications WHERE cancelled_at IS NULL`); got != 3 {
		t.Fatalf("%d scheduled rows before the DELETE, want 3", got)
	}
	h.cancel("report:1")
	h.waitDrained()
	h.wantCancelled("report:1", 3)
	h.wantCancels(1, 0, 0)
	if page := h.metricsPage(); !strings.Contains(page, "spoolcast_sync_forwarded_total 1\n") {
		t.Error("spoolcast_sync_forwarded_total is not 1: a cancellation is not a forwarded event")
	}
}

func TestADeleteSpooledBeforeItsEventWasForwardedStillCancelsIt(t *testing.T) {
	t.Parallel()
	h := newCancelHarness(t)
	// No forwarder yet: the event and its cancellation wait in the spool,
	// and go out in one batch, the event first.
	h.post(scheduledBody("report:2", "u1", "u2"))
	h.cancel("report:2")
	h.startForwarder(forward.Config{})
	h.waitDrained()
	h.wantCancelled("report:2", 2)
	h.wantCancels(1, 0, 0)
}

func TestEachCancellationFollowsItsEventAcrossBatchesAndWorkers(t *testing.T) {
	t.Parallel()
	h := newCancelHarness(t)
	// Small batches on four workers: events and their cancellations spread
	// over many batches in flight at once.
	for i := range 60 {
		h.post(scheduledBody(fmt.Sprintf("job:%d", i), "u1"))
		if i%6 == 5 {
			h.cancel(fmt.Sprintf("job:%d", i))
		}
	}
	h.startForwarder(forward.Config{BatchSize: 3, Workers: 4})
	h.waitDrained()
	for i := 5; i < 60; i += 6 {
		h.wantCancelled(fmt.Sprintf("job:%d", i), 1)
	}
	if got := pgtest.Count(t, h.pool, `SELECT count(*) FROM scheduled_notifications WHERE cancelled_at IS NULL`); got != 50 {
		t.Errorf("%d scheduled rows left to send, want the 50 not cancelled", got)
	}
	h.wantCancels(10, 0, 0)
}

func TestDeletingAnEventWithoutSendAtCountsAlreadySent(t *testing.T) {
	t.Parallel()
	h := newCancelHarness(t)
	h.post(eventBody("now:1", "u1", "u2"))
	h.cancel("now:1")
	h.startForwarder(forward.Config{})
	h.waitDrained()
	h.wantCancels(0, 1, 0)
	if got := pgtest.Count(t, h.pool, `SELECT count(*) FROM notifications WHERE idempotency_key = 'now:1'`); got != 2 {
		t.Errorf("%d notifications of the sent event, want 2", got)
	}
	if got := pgtest.Count(t, h.pool, `SELECT count(*) FROM push_dispatches WHERE state = 'cancelled'`); got != 0 {
		t.Errorf("%d cancelled dispatches, want none", got)
	}
}

func TestDeletingAnUnknownKeyCountsUnknown(t *testing.T) {
	t.Parallel()
	h := newCancelHarness(t)
	h.cancel("never:posted")
	// A DELETE spooled before its POST finds nothing: cancellations follow
	// spool order, and the event after it is sent when due.
	h.cancel("late:1")
	h.post(scheduledBody("late:1", "u1"))
	h.startForwarder(forward.Config{})
	h.waitDrained()
	h.wantCancels(0, 0, 2)
	if got := pgtest.Count(t, h.pool, `SELECT count(*) FROM scheduled_notifications WHERE idempotency_key = 'late:1' AND cancelled_at IS NULL`); got != 1 {
		t.Errorf("%d scheduled rows of the event posted after its DELETE, want 1 still to send", got)
	}
	if got := pgtest.Count(t, h.pool, `SELECT count(*) FROM push_dispatches WHERE state = 'cancelled'`); got != 0 {
		t.Errorf("%d cancelled dispatches, want none", got)
	}
}

func TestARepeatedDeleteIsAnsweredAlikeAndCancelsOnce(t *testing.T) {
	t.Parallel()
	h := newCancelHarness(t)
	h.startForwarder(forward.Config{})
	h.post(scheduledBody("report:3", "u1", "u2"))
	h.waitDrained()
	h.cancel("report:3")
	h.cancel("report:3") // answered from the spool: the same claim
	h.waitDrained()
	h.cancel("report:3") // after forwarding: still the same claim, nothing new to forward
	if st, err := h.sp.Stats(context.Background()); err != nil || st.Pending != 0 || st.KeptKeys != 2 {
		t.Errorf("spool = %+v, %v; want the event and one cancellation, both forwarded", st, err)
	}
	h.wantCancelled("report:3", 2)
	h.wantCancels(1, 0, 0)
}

func TestACancellationSurvivesARelayRestartBeforeForwarding(t *testing.T) {
	t.Parallel()
	h := newCancelHarness(t)
	h.post(scheduledBody("report:4", "u1", "u2"))
	h.cancel("report:4")
	h.closeRelay()
	h.openRelay()
	h.cancel("report:4") // the reopened spool answers it as the same claim
	h.startForwarder(forward.Config{})
	h.waitDrained()
	h.wantCancelled("report:4", 2)
	h.wantCancels(1, 0, 0)
}

// An event to a topic goes through the relay like any other: the relay
// spools it as one row, central's Postgres gets its fan-out, and a DELETE
// through the relay stops that fan-out before its send_at.
func TestATopicEventIsForwardedAndItsFanoutCancelledThroughTheRelay(t *testing.T) {
	t.Parallel()
	h := newCancelHarness(t)
	h.startForwarder(forward.Config{})
	sendAt := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	h.post(`{"idempotency_key":"launch:1","type":"launch","title":"We launched","topics":["everyone","eu"],"send_at":"` + sendAt + `"}`)
	h.waitDrained()
	if got := pgtest.Count(t, h.pool, `SELECT count(*) FROM topic_fanouts WHERE idempotency_key = 'launch:1' AND state = 'pending' AND due_at = $1`, sendAt); got != 2 {
		t.Fatalf("%d pending fan-outs due at send_at; want one per topic", got)
	}
	h.cancel("launch:1")
	h.waitDrained()
	if got := pgtest.Count(t, h.pool, `SELECT count(*) FROM topic_fanouts WHERE idempotency_key = 'launch:1' AND state = 'cancelled'`); got != 2 {
		t.Errorf("%d fan-outs cancelled; want both", got)
	}
	h.wantCancels(1, 0, 0)
}
