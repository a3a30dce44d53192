package main

import (
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
)

var servedByReplica = regexp.MustCompile(`(?m)^spoolcast_feed_reads_total\{reason="current",target="replica"\} [1-9]`)

// A central given --database-read-url reads the feed from that standby.
func TestCentralReadsTheFeedFromTheDatabaseReadURL(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a primary, a standby and central as a subprocess")
	}
	t.Parallel()
	pair := pgtest.Primary(t, false)
	pair.Migrate(t)
	base, iss := startCentralProcess(t, pair.URL, "--database-read-url", pair.Standby.URL, "--max-replica-lag", "1m")
	get := func(path, token string) string {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s = %d %s", path, resp.StatusCode, body)
		}
		return string(body)
	}
	token := iss.Token("alice")
	testsignal.Eventually(t, "a feed read served by the standby", 30*time.Second, func() bool {
		get("/v1/notifications", token)
		return servedByReplica.MatchString(get("/metrics", ""))
	})
}

func TestCentralRefusesANegativeMaxReplicaLag(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(proctest.Binary(t), "central", "--database-url", "postgres://x/y", "--oidc-issuer", "i", "--oidc-audience", "a",
		"--jwks-url", "http://127.0.0.1:1/jwks", "--max-replica-lag", "-1s").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--max-replica-lag") {
		t.Errorf("central --max-replica-lag -1s: %v %s; want a refusal naming the flag", err, out)
	}
}

func TestCentralRefusesAnInterruptedAfterWithinTheLease(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(proctest.Binary(t), "central", "--database-url", "postgres://x/y", "--oidc-issuer", "i", "--oidc-audience", "a",
		"--jwks-url", "http://127.0.0.1:1/jwks", "--push-interrupted-after", "1m").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--push-interrupted-after") {
		t.Errorf("central --push-interrupted-after 1m: %v %s; want a refusal naming the flag", err, out)
	}
}
