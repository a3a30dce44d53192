package main

// The world the run drives: Postgres (a primary with a synchronous streaming
// standby), two relays, two central replicas, and the outside services as
// small HTTP servers that speak their protocols (Expo, an OIDC issuer's
// JWKS, a preference service).

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/channel/expo/expotest"
	"github.com/spoolcast/spoolcast/internal/devauth"
	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/migrations"
)

// proc is one spoolcast process the run starts, kills and starts again.
type proc struct {
	name, binary string
	args         []string
	base         string // its HTTP base URL
	logPath      string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	started time.Time
	starts  int
	// baseline is what the process held under traffic, warmed up, after its
	// latest start (see sampler).
	baseline *sample
}

// start runs the process and waits until it answers /healthz.
func (p *proc) start(ctx context.Context) error {
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.binary, p.args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); log.Close(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done, p.started, p.baseline = cmd, done, time.Now(), nil
	p.starts++
	p.mu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("%s exited at start; see %s", p.name, p.logPath)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if resp, err := http.Get(p.base + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer /healthz within 60s; see %s", p.name, p.logPath)
}

// signal sends sig and waits up to wait for the process to exit.
func (p *proc) signal(sig syscall.Signal, wait time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return nil
	case <-time.After(wait):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s did not exit within %s of %s", p.name, wait, sig)
	}
}

func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// world holds everything the run started.
type world struct {
	dir, binary string
	// primary and standby are the roles of the moment: each failover
	// promotes the standby, and the first makes a new standby of the new
	// primary on the old primary's port, which the relays' and replicas'
	// multi-host URL names.
	primary, standby *pgcluster.Cluster
	clusters         []*pgcluster.Cluster // every cluster started, for tearDown
	dbURL            string
	// loss is when commits may have been lost by the asynchronous
	// failover (zero without one): checks allow what the design says such
	// a failover cannot keep.
	loss lossWindow
	// centralKilled is when a central replica was killed (-9): a push it
	// had recorded and not yet sent ends failed as interrupted, at most
	// once by design, never having reached Expo.
	centralKilled killWindows
	// apnsKilled is when the fake APNs killed its connections: a request
	// whose headers had begun to go out is unknown to the channel (some
	// bytes may have left), though the fake never read it.
	apnsKilled  killWindows
	relays      []*proc
	centrals    []*proc
	spoolMounts []string
	expo        *expotest.Server
	// handovers: when app users' phones were taken over by others.
	handovers *handovers
	// channels are the fake APNs and FCM.
	channels *directChannels
	// strays are the devices the providers refuse one by one.
	strays strays
	// web is the Web Push service browsers' subscriptions name.
	web      *webPushService
	arrivals *expoArrivals
	expoURL  string
	prefs    *prefsService
	issuer   *devauth.Issuer
	servers  []*http.Server
	receiver *receiver // the webhook subscriber
	// serviceToken is the producers' token for central's internal ingress.
	serviceToken string
	receiverURL  string
	// ledger is every answer producers got (the broadcast fault sends too).
	ledger *ledger
}

// current is the primary of the moment.
func (w *world) current() *pgcluster.Cluster { return w.primary }

// lossWindow is the span in which commits may have been lost.
type lossWindow struct {
	mu       sync.Mutex
	from, to time.Time
}

func (l *lossWindow) set(from, to time.Time) { l.mu.Lock(); l.from, l.to = from, to; l.mu.Unlock() }

// holds reports whether t lies in the window.
func (l *lossWindow) holds(t time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.from.IsZero() && !t.Before(l.from) && !t.After(l.to)
}

// overlaps reports whether the window and [from, to] share a moment.
func (l *lossWindow) overlaps(from, to time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.from.IsZero() && !to.Before(l.from) && !from.After(l.to)
}

func (l *lossWindow) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.from.IsZero() {
		return "no asynchronous failover"
	}
	return fmt.Sprintf("commits from %s to %s may be lost", l.from.Format("15:04:05.000"), l.to.Format("15:04:05.000"))
}

// killWindows are the windows around each kill of a central replica: a
// run kills more than one (the kill fault, the broadcast's), and each
// leaves its own unrecorded sends.
type killWindows struct {
	mu      sync.Mutex
	windows [][2]time.Time
}

func (k *killWindows) add(from, to time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.windows = append(k.windows, [2]time.Time{from, to})
}

// holds reports whether t lies in any window.
func (k *killWindows) holds(t time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, w := range k.windows {
		if !t.Before(w[0]) && !t.After(w[1]) {
			return true
		}
	}
	return false
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// serve runs h on a free loopback port and returns its base URL.
func (w *world) serve(h http.Handler) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	w.servers = append(w.servers, srv)
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String(), nil
}

// setUp starts the whole system.
func setUp(ctx context.Context, dir, binary string, seed uint64) (*world, error) {
	w := &world{dir: dir, binary: binary, receiver: newReceiver(seed), handovers: newHandovers()}
	if err := w.startPostgres(ctx); err != nil {
		return w, err
	}
	if _, err := migrations.Up(ctx, w.dbURL, nil); err != nil {
		return w, fmt.Errorf("migrate: %w", err)
	}
	w.expo = expotest.New()
	w.arrivals = newExpoArrivals(w.expo)
	var err error
	if w.expoURL, err = w.serve(w.arrivals); err != nil {
		return w, err
	}
	if w.receiverURL, err = w.serve(w.receiver); err != nil {
		return w, err
	}
	channelArgs, err := w.startChannels()
	if err != nil {
		return w, fmt.Errorf("fake APNs and FCM: %w", err)
	}
	webArgs, err := w.startWebPush()
	if err != nil {
		return w, fmt.Errorf("fake Web Push service: %w", err)
	}
	channelArgs = append(channelArgs, webArgs...)
	w.prefs = &prefsService{}
	prefsURL, err := w.serve(w.prefs)
	if err != nil {
		return w, err
	}
	if w.issuer, err = devauth.LoadIssuer(filepath.Join(dir, "issuer-key.pem"), "spoolcast-chaos", audience); err != nil {
		return w, err
	}
	jwksURL, err := w.serve(w.issuer.JWKS())
	if err != nil {
		return w, err
	}
	secret := filepath.Join(dir, "service-secret")
	secretBytes := []byte(strings.Repeat("chaos-service-secret-", 3))
	if err := os.WriteFile(secret, secretBytes, 0o600); err != nil {
		return w, err
	}
	if w.serviceToken, err = auth.SignServiceToken(secretBytes, "chaos", []string{auth.ScopeEmit}, time.Now(), 24*time.Hour); err != nil {
		return w, err
	}
	for i := range 2 {
		spoolDir := filepath.Join(dir, fmt.Sprintf("relay-%d", i))
		if err := os.MkdirAll(spoolDir, 0o755); err != nil {
			return w, err
		}
		// Each spool on a volume of its own, which the disk-full fault fills.
		if err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", spoolDir).Run(); err != nil {
			return w, fmt.Errorf("mount the spool volume of relay %d (the disk-full fault needs root): %w", i, err)
		}
		w.spoolMounts = append(w.spoolMounts, spoolDir)
		addr, err := freeAddr()
		if err != nil {
			return w, err
		}
		w.relays = append(w.relays, &proc{
			name: fmt.Sprintf("relay-%d", i), binary: binary, base: "http://" + addr,
			logPath: filepath.Join(dir, fmt.Sprintf("relay-%d.log", i)),
			args: []string{"relay", "--producer", "chaos", "--listen", addr,
				"--spool", filepath.Join(spoolDir, "spool.db"), "--database-url", w.dbURL, "--sync", "full",
				"--spool-max-bytes", "128MiB", "--refeed-max-bytes", "32MiB", "--log-level", "warn"},
		})
	}
	for i := range 2 {
		addr, err := freeAddr()
		if err != nil {
			return w, err
		}
		w.centrals = append(w.centrals, &proc{
			name: fmt.Sprintf("central-%d", i), binary: binary, base: "http://" + addr,
			logPath: filepath.Join(dir, fmt.Sprintf("central-%d.log", i)),
			args: append([]string{"central", "--listen", addr, "--database-url", w.dbURL,
				"--oidc-issuer", w.issuer.Issuer, "--oidc-audience", audience, "--jwks-url", jwksURL,
				"--push=true", "--expo-url", w.expoURL, "--receipt-interval", "1s",
				// A replica killed mid-send leaves its dispatches queued
				// for this long: within the run's settling.
				"--push-interrupted-after", "3m",
				"--prefs-url", prefsURL, "--service-jwt-secret-file", secret, "--prefs-timeout", "300ms", "--prefs-cache-ttl", "2s",
				"--maintenance-interval", "0", "--db-connect-timeout", "2s", "--shutdown-timeout", "20s", "--log-level", "warn",
				"--webhook-allow-private",
				// Small batches, so that the broadcast's fan-out spans its kills.
				"--topic-batch-size", "200"}, channelArgs...),
		})
	}
	for _, p := range append(append([]*proc{}, w.relays...), w.centrals...) {
		if err := p.start(ctx); err != nil {
			return w, err
		}
	}
	return w, w.subscribe(ctx)
}

// startPostgres starts a primary whose commits wait for its standby
// (synchronous_standby_names, the zero-loss setting) and the standby.
func (w *world) startPostgres(ctx context.Context) error {
	var err error
	w.primary, err = pgcluster.Start(ctx, pgcluster.Config{
		Dir:                filepath.Join(w.dir, "primary"),
		Durable:            true,
		Settings:           []string{"wal_level=replica", "max_wal_senders=10", "synchronous_commit=on", "max_connections=300"},
		SynchronousStandby: "chaos_standby",
	})
	if err != nil {
		return fmt.Errorf("start the primary: %w", err)
	}
	w.clusters = append(w.clusters, w.primary)
	w.standby, err = w.primary.Standby(ctx, pgcluster.StandbyConfig{Dir: filepath.Join(w.dir, "standby"), Name: "chaos_standby"})
	if err != nil {
		return fmt.Errorf("start the standby: %w", err)
	}
	w.clusters = append(w.clusters, w.standby)
	w.dbURL = pgcluster.MultiHostURL(w.primary, w.standby)
	return nil
}

// tearDown stops everything the run started.
func (w *world) tearDown() {
	for _, p := range append(append([]*proc{}, w.relays...), w.centrals...) {
		_ = p.signal(syscall.SIGKILL, 10*time.Second)
	}
	for _, s := range w.servers {
		_ = s.Close()
	}
	w.channels.close()
	for _, c := range w.clusters {
		_ = c.Stop()
	}
	for _, m := range w.spoolMounts {
		_ = exec.Command("umount", "-l", m).Run()
	}
}

// prefsService is the product's preference service: every category pushes,
// or, while down, 503 to every request.
type prefsService struct {
	down  atomic.Bool
	asked atomic.Int64
}

func (s *prefsService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.asked.Add(1)
	if s.down.Load() {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"categories":{}}`)
}

const audience = "spoolcast-chaos"

// token is a valid token for user, good for a day.
func token(iss *devauth.Issuer, user string) string {
	t, err := iss.Mint(user, nil, 24*time.Hour)
	if err != nil {
		panic(err) // a key of our own always signs
	}
	return t
}

// expoArrivals stands in front of the fake Expo and notes, for every
// message that reached it, when its request arrived, how it was answered
// and how long the answer took: a dispatch may end "outcome unknown" only
// where its request arrived and its answer came too late for the client.
type expoArrivals struct {
	next http.Handler
	mu   sync.Mutex
	seen map[string][]arrival // "token notification-id" →
}

// arrival is one request that carried a message.
type arrival struct {
	at     time.Time
	status int
	took   time.Duration
}

// expoClientTimeout is how long central's Expo client waits for an answer.
const expoClientTimeout = 10 * time.Second

func newExpoArrivals(next http.Handler) *expoArrivals {
	return &expoArrivals{next: next, seen: map[string][]arrival{}}
}

func (e *expoArrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasSuffix(r.URL.Path, "/send") {
		e.next.ServeHTTP(w, r)
		return
	}
	at := time.Now()
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	plain := raw
	if r.Header.Get("Content-Encoding") == "gzip" {
		if zr, err := gzip.NewReader(bytes.NewReader(raw)); err == nil {
			plain, _ = io.ReadAll(zr)
		}
	}
	var msgs []struct {
		To   string         `json:"to"`
		Data map[string]any `json:"data"`
	}
	_ = json.Unmarshal(plain, &msgs)
	r.Body = io.NopCloser(bytes.NewReader(raw))
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	e.next.ServeHTTP(rec, r)
	a := arrival{at: at, status: rec.status, took: time.Since(at)}
	e.mu.Lock()
	for _, m := range msgs {
		if m.Data["type"] == "clear" {
			ids, _ := m.Data["ids"].([]any)
			for _, id := range ids {
				k := fmt.Sprint(clearKey(m.To), " ", id)
				e.seen[k] = append(e.seen[k], a)
			}
			continue
		}
		k := fmt.Sprint(m.To, " ", m.Data["notification_id"])
		e.seen[k] = append(e.seen[k], a)
	}
	e.mu.Unlock()
}

// answerLost reports whether a request carrying the message arrived and its
// answer came after the client had given up (or never).
func (e *expoArrivals) answerLost(token, notificationID string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, a := range e.seen[token+" "+notificationID] {
		if a.took >= expoClientTimeout-time.Second {
			return true
		}
	}
	return false
}

// arrived reports whether a request carrying the message reached Expo.
func (e *expoArrivals) arrived(token, notificationID string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.seen[token+" "+notificationID]) > 0
}

// arrivedIn reports whether a request carrying the message arrived inside
// the loss window.
func (e *expoArrivals) arrivedIn(token, notificationID string, loss *lossWindow) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, a := range e.seen[token+" "+notificationID] {
		if loss.holds(a.at) {
			return true
		}
	}
	return false
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) { s.status = code; s.ResponseWriter.WriteHeader(code) }
