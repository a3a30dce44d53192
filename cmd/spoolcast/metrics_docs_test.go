package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/wsclient"
)

var metricName = regexp.MustCompile(`\bspoolcast_[a-z0-9_]+`)

// exported scrapes base/metrics and returns its spoolcast_ metric families
// with their types.
func exported(t *testing.T, base string) map[string]string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]string{}
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" && strings.HasPrefix(f[2], "spoolcast_") {
			out[f[2]] = f[3]
		}
	}
	return out
}

// namesIn lists the spoolcast_ metric names a file mentions.
func namesIn(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	names := metricName.FindAllString(string(raw), -1)
	slices.Sort(names)
	return slices.Compact(names)
}

// family maps a series name in an expression to its family: a histogram's
// _bucket, _sum and _count belong to it.
func family(name string, families map[string]string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && families[base] == "histogram" {
			return base
		}
	}
	return name
}

// TestEveryMetricDashboardsAndAlertsUseIsExportedAndDocumented runs the dev
// stack (relay, central with push through the fake Expo), drives an event
// through it, and holds the deploy files and the docs to what the two
// processes export.
func TestEveryMetricDashboardsAndAlertsUseIsExportedAndDocumented(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the dev stack")
	}
	dataDir := t.TempDir()
	relay, central, ops := proctest.FreeAddr(t), proctest.FreeAddr(t), proctest.FreeAddr(t)
	dev := proctest.Start(t, nil, "dev", "--data-dir", dataDir, "--database-url", pgtest.DB(t),
		"--listen", relay, "--central-listen", central, "--central-ops-listen", ops, "--log-level", "warn")
	relayURL, centralURL, opsURL := "http://"+relay, "http://"+central, "http://"+ops
	dev.WaitHealthy(relayURL)
	dev.WaitHealthy(opsURL)
	t.Cleanup(http.DefaultClient.CloseIdleConnections)

	// Drive the path once, so that every labelled metric has its series:
	// a device, an event pushed to it, the feed, a socket.
	var token string
	testsignal.Eventually(t, "spoolcast dev token to mint a token", 10*time.Second, func() bool {
		out, err := exec.Command(proctest.Binary(t), "dev", "token", "--data-dir", dataDir, "--user", "u_123").Output()
		token = strings.TrimSpace(string(out))
		return err == nil && token != ""
	})
	call := func(method, url, body string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			t.Fatalf("%s %s: %d", method, url, resp.StatusCode)
		}
	}
	// /healthz answers before the stream is ready (503 "starting" until the
	// live reader's first read): dial until it takes the socket.
	var socket *wsclient.Conn
	testsignal.Eventually(t, "the stream to take a socket", 20*time.Second, func() bool {
		var err error
		socket, err = wsclient.Dial(context.Background(), centralURL, token, "")
		return err == nil
	})
	defer socket.Close()
	call(http.MethodPut, centralURL+"/v1/devices", `{"token":"ExponentPushToken[metrics]","platform":"ios"}`)
	req, _ := http.NewRequest(http.MethodPost, relayURL+"/v1/events", strings.NewReader(`{"idempotency_key":"metrics:1","type":"t","category":"c","recipients":["u_123"],"title":"t"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("post: %d", resp.StatusCode)
	}
	for m, err := socket.Next(20 * time.Second); m.Type != "notification"; m, err = socket.Next(20 * time.Second) {
		if err != nil {
			t.Fatal(err)
		}
	}
	call(http.MethodGet, centralURL+"/v1/notifications", "")

	// The partition gauges describe what central's first maintenance pass
	// saw; that pass runs beside startup and can finish after the event.
	testsignal.Eventually(t, "central's first maintenance pass", 30*time.Second, func() bool {
		_, ok := exported(t, opsURL)["spoolcast_partitions"]
		return ok
	})
	families := exported(t, relayURL)
	for name, typ := range exported(t, opsURL) {
		families[name] = typ
	}
	if len(families) < 30 {
		t.Fatalf("only %d spoolcast_ metric families exported", len(families))
	}
	root := filepath.Join("..", "..")
	for _, file := range []string{"deploy/grafana/spoolcast.json", "deploy/prometheus/rules.yaml"} {
		for _, name := range namesIn(t, filepath.Join(root, file)) {
			if _, ok := families[family(name, families)]; !ok {
				t.Errorf("%s uses %s, which neither the relay nor central exports", file, name)
			}
		}
	}
	documented := namesIn(t, filepath.Join(root, "docs/metrics.md"))
	for name := range families {
		if !slices.Contains(documented, name) {
			t.Errorf("%s is exported but not in docs/metrics.md", name)
		}
	}
	for _, name := range documented {
		if _, ok := families[family(name, families)]; !ok {
			t.Errorf("docs/metrics.md names %s, which neither the relay nor central exports", name)
		}
	}
	// The dashboard is valid JSON, as Grafana will read it.
	raw, _ := os.ReadFile(filepath.Join(root, "deploy/grafana/spoolcast.json"))
	if !json.Valid(raw) {
		t.Error("deploy/grafana/spoolcast.json is not valid JSON")
	}
}

// TestEveryAlertHasARunbook holds docs/operations.md to the rules: each
// alert has a section saying what it means and what to do.
func TestEveryAlertHasARunbook(t *testing.T) {
	rules, err := os.ReadFile("../../deploy/prometheus/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\S+)`).FindAllStringSubmatch(string(rules), -1)
	if len(alerts) < 10 {
		t.Fatalf("only %d alerts found in rules.yaml", len(alerts))
	}
	for _, a := range alerts {
		if !strings.Contains(string(ops), "\n### "+a[1]+"\n") {
			t.Errorf("alert %s has no section in docs/operations.md", a[1])
		}
	}
}
