package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/internal/proctest"
)

// devStack is a `spoolcast dev` subprocess on ports of its own.
type devStack struct {
	*proctest.Process
	relay string
}

func startDev(t *testing.T, dataDir string) *devStack {
	t.Helper()
	relay, central := proctest.FreeAddr(t), proctest.FreeAddr(t)
	p := proctest.Start(t, []string{"DATABASE_URL="}, "dev", "--data-dir", dataDir, "--listen", relay, "--central-listen", central,
		"--central-ops-listen", proctest.FreeAddr(t), "--log-level", "warn")
	return &devStack{Process: p, relay: "http://" + relay}
}

func postgresAnswers(t *testing.T, dataDir string) bool {
	t.Helper()
	port, err := os.ReadFile(filepath.Join(dataDir, "pg", "port"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:"+strings.TrimSpace(string(port))+"/postgres?sslmode=disable")
	if err != nil {
		return false
	}
	conn.Close(ctx)
	return true
}

func TestDevLeavesARunningStackAndAForeignPostgresAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("runs spoolcast dev with a Postgres of its own")
	}
	if _, err := pgcluster.FindBinaries(); err != nil {
		if os.Getenv("SPOOLCAST_REQUIRE_PG") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dataDir, err := os.MkdirTemp("", "spoolcast-devtest-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dataDir, 0o755) // Postgres runs as its own user when the tests run as root
	t.Cleanup(func() {
		// Stop whatever Postgres the test left running, then remove it all.
		if c, err := pgcluster.Start(context.Background(), pgcluster.Config{Dir: filepath.Join(dataDir, "pg")}); err == nil {
			c.Stop()
		}
		os.RemoveAll(dataDir)
	})

	first := startDev(t, dataDir)
	first.WaitHealthy(first.relay)

	second := startDev(t, dataDir)
	select {
	case <-second.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("a second dev stack on the same data directory kept running")
	}
	if second.ExitCode() == 0 || !strings.Contains(second.Output(), "in use by another spoolcast dev") {
		t.Errorf("second dev: exit %d, output %q; want a refusal naming the first", second.ExitCode(), second.Output())
	}
	resp, err := http.Post(first.relay+"/v1/events", "application/json", strings.NewReader(`{"idempotency_key":"still-here","type":"t","recipients":["u"],"title":"t"}`))
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("the first stack after the refused second: %v %v", resp, err)
	}
	resp.Body.Close()
	if !postgresAnswers(t, dataDir) {
		t.Fatal("the refused second dev stopped the first stack's Postgres")
	}

	// A dev stack killed outright leaves its Postgres running. The next one
	// uses it and, not having started it, leaves it running when it stops.
	first.Kill()
	third := startDev(t, dataDir)
	third.WaitHealthy(third.relay)
	third.Signal(syscall.SIGTERM)
	select {
	case <-third.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("dev did not stop on SIGTERM")
	}
	if code := third.ExitCode(); code != 0 {
		t.Errorf("dev exited %d after SIGTERM\n%s", code, third.Output())
	}
	if !postgresAnswers(t, dataDir) {
		t.Error("dev stopped a Postgres it did not start")
	}
}

// A dev token must be valid for some time: a TTL of zero or less would mint
// a token already expired, which the stack then refuses with a puzzling 401.
func TestDevTokenRefusesATTLThatIsNotPositive(t *testing.T) {
	t.Parallel()
	for _, ttl := range []string{"-1h", "0s"} {
		for _, who := range [][]string{{"--user", "alice"}, {"--service", "billing"}} {
			dir := t.TempDir()
			var stdout, stderr bytes.Buffer
			args := append([]string{"dev", "token", "--data-dir", dir, "--token-ttl", ttl}, who...)
			code := run(args, &stdout, &stderr)
			if code == 0 || !strings.Contains(stderr.String(), "--token-ttl") || !strings.Contains(stderr.String(), "must be positive") {
				t.Errorf("spoolcast %s: exit %d, stderr %q; want a refusal naming --token-ttl", strings.Join(args, " "), code, stderr.String())
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("spoolcast %s wrote %d files before refusing", strings.Join(args, " "), len(entries))
			}
		}
	}
}
