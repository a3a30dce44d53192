package sdktest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/oidctest"
	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/live"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/topics"
)

// replica is one central process the rig can stop, kill and start again
// on the same address.
type replica struct {
	addr string
	args []string
	proc *proctest.Process // nil while down
}

// rig is what the Node tests drive through the control server: the
// replicas behind the proxy, the rate-limited one, the issuer of user
// tokens and the service token of the internal ingress.
type rig struct {
	t       *testing.T
	db      *pgxpool.Pool
	iss     *oidctest.Issuer
	service string
	proxy   *proxy
	limited *replica

	mu       sync.Mutex // held by every replica operation, and around replicas' procs
	replicas []*replica
}

// centralArgs are the flags of every replica: no push, no maintenance,
// the test issuer, the rig's service secret.
func centralArgs(addr, dbURL, secretFile string, iss *oidctest.Issuer, flags ...string) []string {
	return append([]string{"central", "--listen", addr, "--database-url", dbURL,
		"--oidc-issuer", iss.URL(), "--oidc-audience", oidctest.Audience, "--jwks-url", iss.JWKSURL(),
		"--service-jwt-secret-file", secretFile,
		"--push=false", "--maintenance-interval", "0", "--shutdown-timeout", "5s", "--log-level", "warn"}, flags...)
}

func newRig(t *testing.T, dbURL string) *rig {
	t.Helper()
	iss := oidctest.New(t)
	// Hex: a secret file's trailing line ending is not the secret's, so
	// raw random bytes ending in \r or \n came out a byte short (1 run in 128).
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	secret := []byte(hex.EncodeToString(raw))
	secretFile := filepath.Join(t.TempDir(), "service.secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	service, err := auth.SignServiceToken(secret, "sdktest", []string{auth.ScopeEmit}, time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	db, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	r := &rig{t: t, db: db, iss: iss, service: service}
	for range 2 {
		addr := proctest.FreeAddr(t)
		r.replicas = append(r.replicas, &replica{addr: addr, args: centralArgs(addr, dbURL, secretFile, iss, "--rate-limit-user", "200/s")})
	}
	addr := proctest.FreeAddr(t)
	r.limited = &replica{addr: addr, args: centralArgs(addr, dbURL, secretFile, iss, "--rate-limit-user", "1/s")}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, rep := range append([]*replica{r.limited}, r.replicas...) {
		wg.Go(func() { errs[i] = r.start(rep) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	r.proxy, err = newProxy(r.liveAddrs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.proxy.Close)
	return r
}

// liveAddrs are the addresses of the replicas up, in order.
func (r *rig) liveAddrs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var addrs []string
	for _, rep := range r.replicas {
		if rep.proc != nil {
			addrs = append(addrs, rep.addr)
		}
	}
	return addrs
}

// start runs rep and waits until it is ready (its stream included).
func (r *rig) start(rep *replica) error {
	p := proctest.Start(r.t, nil, rep.args...)
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-p.Done():
			return fmt.Errorf("central %s exited while starting:\n%s", rep.addr, p.Output())
		default:
		}
		resp, err := http.Get("http://" + rep.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			p.Kill()
			return fmt.Errorf("central %s not ready after 30 s:\n%s", rep.addr, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.mu.Lock()
	rep.proc = p
	r.mu.Unlock()
	return nil
}

// down takes rep down: SIGTERM (a deploy) waiting for it to exit, or
// SIGKILL (a crash).
func (r *rig) down(rep *replica, sig syscall.Signal) error {
	r.mu.Lock()
	p := rep.proc
	rep.proc = nil
	r.mu.Unlock()
	if p == nil {
		return nil
	}
	p.Signal(sig)
	select {
	case <-p.Done():
	case <-time.After(20 * time.Second):
		p.Kill()
		return fmt.Errorf("central %s still running 20 s after %v:\n%s", rep.addr, sig, p.Output())
	}
	if sig == syscall.SIGTERM && p.ExitCode() != 0 {
		return fmt.Errorf("central %s exited %d after SIGTERM:\n%s", rep.addr, p.ExitCode(), p.Output())
	}
	return nil
}

// emit posts one event per title to user through the internal ingress of
// the first replica up, each after the one before was answered 202, so
// that they commit in the order given.
func (r *rig) emit(user string, titles []string) error {
	for _, title := range titles {
		body, _ := json.Marshal(map[string]any{
			"idempotency_key": rand.Text(), "type": "sdk.test", "category": "sdk",
			"recipients": []string{user}, "title": title,
		})
		var err error
		for _, addr := range append(r.liveAddrs(), r.limited.addr) {
			var req *http.Request
			req, err = http.NewRequest(http.MethodPost, "http://"+addr+"/internal/v1/events", bytes.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+r.service)
			req.Header.Set("Content-Type", "application/json")
			var resp *http.Response
			resp, err = http.DefaultClient.Do(req)
			if err != nil {
				continue // a replica going down: the next one
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				return fmt.Errorf("emit %q: HTTP %d", title, resp.StatusCode)
			}
			break
		}
		if err != nil {
			return fmt.Errorf("emit %q: %w", title, err)
		}
	}
	return nil
}

// emitTogether writes one notification per title for user in one
// transaction, as ingest writes a batch: they share a created_at (the
// transaction's start) and follow each other in id, which is how the feed
// orders them; then it wakes the replicas' streams, as ingest does.
func (r *rig) emitTogether(ctx context.Context, user string, titles []string) error {
	if _, err := r.db.Exec(ctx, `INSERT INTO notifications (user_id, type, category, producer, idempotency_key, notification_key, title)
		SELECT $1, 'sdk.test', 'sdk', 'sdktest', k, k, t
		FROM unnest($2::text[]) WITH ORDINALITY AS x(t, i), LATERAL (SELECT 'together-' || gen_random_uuid() || i AS k) g
		ORDER BY i`, user, titles); err != nil {
		return fmt.Errorf("emit together: %w", err)
	}
	return ingest.WakeUp(ctx, r.db)
}

// token mints a token for user that expires ttl from now (negative: already).
func (r *rig) token(user string, ttl time.Duration) string {
	c := r.iss.Claims(user)
	c["exp"] = time.Now().Add(ttl).Unix()
	return r.iss.Sign(c)
}

// foreignCursor is a well-formed stream cursor from another history of the
// database (another cluster), which the server must refuse.
func foreignCursor() string {
	return live.Cursor{
		Position: live.Position{Tx: 1000, ID: 1},
		At:       time.Now().UTC(),
		History:  live.History{System: 4242, Timeline: 1},
		WAL:      1 << 20,
	}.String()
}

// control serves the rig to the Node tests. Every route is a POST with a
// JSON body, answering JSON (or 500 with the error's text).
func (r *rig) control() http.Handler {
	mux := http.NewServeMux()
	answer := func(w http.ResponseWriter, v any, err error) {
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	var body struct {
		User   string   `json:"user"`
		TTL    float64  `json:"ttl"` // seconds
		Titles []string `json:"titles"`
		On     bool     `json:"on"`
		// Members are added to a topic (/topics/{topic}).
		Members []string `json:"members"`
	}
	decode := func(req *http.Request) error {
		body.User, body.TTL, body.Titles, body.On, body.Members = "", 0, nil, false, nil
		return json.NewDecoder(req.Body).Decode(&body)
	}
	var one sync.Mutex // one request at a time: the tests drive a single story
	handle := func(pattern string, fn func(req *http.Request) (any, error)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, req *http.Request) {
			one.Lock()
			defer one.Unlock()
			if err := decode(req); err != nil {
				answer(w, nil, err)
				return
			}
			v, err := fn(req)
			answer(w, v, err)
		})
	}
	handle("POST /token", func(*http.Request) (any, error) {
		return map[string]string{"token": r.token(body.User, time.Duration(body.TTL*float64(time.Second)))}, nil
	})
	handle("POST /emit", func(*http.Request) (any, error) {
		return map[string]int{"emitted": len(body.Titles)}, r.emit(body.User, body.Titles)
	})
	handle("POST /emit-together", func(req *http.Request) (any, error) {
		return map[string]int{"emitted": len(body.Titles)}, r.emitTogether(req.Context(), body.User, body.Titles)
	})
	handle("POST /topics/{topic}", func(req *http.Request) (any, error) {
		// A service's doing: the topic opened (on) or closed, members added.
		store := topics.NewStore(r.db)
		if _, _, err := store.Set(req.Context(), req.PathValue("topic"), body.On); err != nil {
			return nil, err
		}
		c, err := store.ChangeMembers(req.Context(), req.PathValue("topic"), body.Members, nil)
		return c, err
	})
	handle("POST /foreign-cursor", func(*http.Request) (any, error) {
		return map[string]string{"cursor": foreignCursor()}, nil
	})
	handle("POST /replicas/{i}/{op}", func(req *http.Request) (any, error) {
		i, err := strconv.Atoi(req.PathValue("i"))
		if err != nil || i < 0 || i >= len(r.replicas) {
			return nil, fmt.Errorf("no replica %q", req.PathValue("i"))
		}
		rep := r.replicas[i]
		switch op := req.PathValue("op"); op {
		case "stop":
			err = r.down(rep, syscall.SIGTERM)
		case "kill":
			err = r.down(rep, syscall.SIGKILL)
		case "start":
			r.mu.Lock()
			up := rep.proc != nil
			r.mu.Unlock()
			if !up {
				err = r.start(rep)
			}
		default:
			err = fmt.Errorf("no operation %q", op)
		}
		return map[string]bool{"ok": err == nil}, err
	})
	handle("POST /proxy/drop", func(*http.Request) (any, error) {
		r.proxy.drop()
		return map[string]bool{"ok": true}, nil
	})
	handle("POST /proxy/refuse-upgrades", func(*http.Request) (any, error) {
		r.proxy.refuseUpgrades.Store(body.On)
		return map[string]bool{"on": body.On}, nil
	})
	return mux
}

// env is what the Node tests are told: the control server, the proxy (the
// app's one address), the rate-limited replica, and each replica behind the
// proxy by its own address, for a session that must write through another
// replica than the one holding the stream.
func (r *rig) env(control string) []string {
	replicas := make([]string, len(r.replicas))
	for i, rep := range r.replicas {
		replicas[i] = "http://" + rep.addr
	}
	return []string{
		"SPOOLCAST_SDK_CONTROL=" + control,
		"SPOOLCAST_SDK_BASE=" + r.proxy.URL(),
		"SPOOLCAST_SDK_LIMITED=http://" + r.limited.addr,
		"SPOOLCAST_SDK_REPLICAS=" + strings.Join(replicas, ","),
	}
}

// serveControl starts the control server, closed when the test ends.
func (r *rig) serveControl() string {
	s := httptest.NewServer(r.control())
	r.t.Cleanup(s.Close)
	return s.URL
}
