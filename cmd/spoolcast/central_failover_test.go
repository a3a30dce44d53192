package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/pgtest"
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
	base, _ := startCentralProcess(t, pair.URL, "--db-connect-timeout", "1s")
	readyz := func() (int, string) { return readyz(t, base) }
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
