package relay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/spool"
)

// TestKill9NeverLosesAnAcceptedEvent kills a relay under concurrent load with
// SIGKILL at random moments, restarts it on the same spool each time, and checks
// that every key answered 202 before a kill is still there, once.
func TestKill9NeverLosesAnAcceptedEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test runs subprocesses")
	}
	t.Parallel()
	spoolPath := filepath.Join(t.TempDir(), "spool.db")
	client := &http.Client{Timeout: 10 * time.Second}
	var mu sync.Mutex
	accepted := map[string]string{} // key → body

	const kills = 6
	for round := range kills {
		addr := proctest.FreeAddr(t)
		p := proctest.Start(t, nil, "relay", "--producer", "crash", "--listen", addr, "--spool", spoolPath, "--log-level", "warn")
		base := "http://" + addr
		p.WaitHealthy(base)

		stop := proctest.Load(16, func(g, n int) bool {
			key := fmt.Sprintf("r%d-g%d-n%d", round, g, n)
			body := event(key, "crash "+key)
			resp, err := client.Post(base+"/v1/events", "application/json", strings.NewReader(body))
			if err != nil {
				return false // the relay is gone; the outcome of this request is unknown
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusAccepted {
				mu.Lock()
				accepted[key] = body
				mu.Unlock()
			}
			return true
		})
		time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
		p.Kill()
		stop()
	}
	if len(accepted) < kills {
		t.Fatalf("only %d events accepted across %d runs; the load did not reach the relay", len(accepted), kills)
	}

	addr := proctest.FreeAddr(t)
	p := proctest.Start(t, nil, "relay", "--producer", "crash", "--listen", addr, "--spool", spoolPath, "--log-level", "warn")
	p.WaitHealthy("http://" + addr)
	for key, body := range accepted {
		resp, err := client.Post("http://"+addr+"/v1/events", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("after the kills, %s answers %d; want 200 duplicate", key, resp.StatusCode)
		}
	}
	p.Stop()

	r, err := spool.OpenReadOnly(spoolPath)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rows, err := r.List(context.Background(), spool.AllRows, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, row := range rows {
		seen[row.Key]++
	}
	for key := range accepted {
		if seen[key] != 1 {
			t.Errorf("accepted key %s is in the spool %d times, want once", key, seen[key])
		}
	}
	t.Logf("%d kills, %d events accepted, %d rows spooled (the rest were in flight at a kill)", kills, len(accepted), len(rows))
}
