package main

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/oidctest"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
)

// A central whose --database-url lists a primary and its standby is not
// ready while the primary is dead and the standby only reads, and is ready
// again, without a restart, once the standby is promoted.
func TestCentralIsNotReadyWithoutAPrimaryAndReadyAgainOnThePromotedStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a primary, a standby and central as a subprocess")
	}
	t.Parallel()
	pair := pgtest.Primary(t, false)
	pair.Migrate(t)
	iss := oidctest.New(t)
	addr := proctest.FreeAddr(t)
	p := proctest.Start(t, nil, "central", "--listen", addr, "--database-url", pair.URL, "--db-connect-timeout", "1s",
		"--oidc-issuer", iss.URL(), "--oidc-audience", oidctest.Audience, "--jwks-url", iss.JWKSURL(),
		"--push=false", "--maintenance-interval", "0", "--log-level", "error")
	base := "http://" + addr
	p.WaitHealthy(base)
	readyz := func() (int, string) {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	ready := func() bool { code, _ := readyz(); return code == http.StatusOK }
	testsignal.Eventually(t, "central to be ready on the primary", 30*time.Second, ready)

	if err := pair.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	testsignal.Eventually(t, "central to be not ready without a primary", 15*time.Second, func() bool { return !ready() })
	code, body := readyz()
	t.Logf("without a primary: /readyz %d %s", code, body)

	start := time.Now()
	if err := pair.Standby.Promote(context.Background()); err != nil {
		t.Fatal(err)
	}
	testsignal.Eventually(t, "central to be ready on the promoted standby", 30*time.Second, ready)
	t.Logf("ready again %s after the promotion began", time.Since(start).Round(time.Millisecond))
}
