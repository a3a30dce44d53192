package live_test

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/spoolcast/spoolcast/internal/oidctest"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/wsclient"
)

// replica starts a central subprocess on dbURL trusting iss.
func replica(t *testing.T, dbURL string, iss *oidctest.Issuer) (*proctest.Process, string) {
	t.Helper()
	addr := proctest.FreeAddr(t)
	p := proctest.Start(t, nil, "central", "--listen", addr, "--database-url", dbURL,
		"--oidc-issuer", iss.URL(), "--oidc-audience", oidctest.Audience, "--jwks-url", iss.JWKSURL(),
		"--push=false", "--maintenance-interval", "0", "--log-level", "warn")
	base := "http://" + addr
	p.WaitHealthy(base)
	testsignal.Eventually(t, "central at "+base+" to be ready", 30*time.Second, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p, base
}

func TestAnEventPostedToARelayReachesTheUsersSocketOnEachReplicaOnce(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.DB(t)
	iss := oidctest.New(t)
	_, a := replica(t, dbURL, iss)
	b, bBase := replica(t, dbURL, iss)
	relayAddr := proctest.FreeAddr(t)
	relay := proctest.Start(t, nil, "relay", "--producer", "p", "--listen", relayAddr, "--spool", filepath.Join(t.TempDir(), "spool.db"),
		"--database-url", dbURL, "--log-level", "warn")
	relay.WaitHealthy("http://" + relayAddr)

	var sockets []*wsclient.Conn
	for _, base := range []string{a, bBase} {
		c, err := wsclient.Dial(context.Background(), base, iss.Token("u1"), "")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if m, err := c.Next(10 * time.Second); err != nil || m.Type != "ready" {
			t.Fatalf("first frame from %s: %v %v", base, m.Raw, err)
		}
		sockets = append(sockets, c)
	}
	start := time.Now()
	resp, err := http.Post("http://"+relayAddr+"/v1/events", "application/json",
		strings.NewReader(`{"idempotency_key":"deploy:42","type":"deploy.finished","recipients":["u1"],"title":"Deploy 42 finished"}`))
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("post to the relay: %v %v", resp, err)
	}
	resp.Body.Close()
	for i, c := range sockets {
		m, err := c.Next(10 * time.Second)
		if err != nil || m.Type != "notification" {
			t.Fatalf("replica %d: %s %v; want the notification", i, m.Raw, err)
		}
		if it, _ := m.Item(); it.Title != "Deploy 42 finished" {
			t.Errorf("replica %d sent %s", i, m.Raw)
		}
		if m, err := c.Next(500 * time.Millisecond); err == nil {
			t.Errorf("replica %d sent a second frame %s", i, m.Raw)
		}
	}
	t.Logf("relay POST to frames on both replicas (including the 500ms quiet check of the first): %v", time.Since(start))

	// SIGTERM: the replica closes its sockets with 1001, so apps reconnect
	// to another one at once.
	b.Signal(syscall.SIGTERM)
	_, err = sockets[1].Next(10 * time.Second)
	if code, ok := wsclient.Closed(err); !ok || code != ws.StatusGoingAway {
		t.Errorf("on SIGTERM: %v, want a 1001 close frame", err)
	}
	select {
	case <-b.Done():
		if code := b.ExitCode(); code != 0 {
			t.Errorf("exit code %d after SIGTERM, want 0", code)
		}
	case <-time.After(15 * time.Second):
		t.Error("the replica did not exit after SIGTERM")
	}
}
