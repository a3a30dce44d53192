package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/internal/pgtest"
)

func TestHelpListsTheCommandsAndEachCommandItsFlags(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"--help"}, &out, &out); code != 0 {
		t.Fatalf("--help exited %d", code)
	}
	for _, c := range commands() {
		if !strings.Contains(out.String(), "  "+c.name+" ") {
			t.Errorf("spoolcast --help lacks the command %s", c.name)
		}
	}
	if lines := strings.Count(out.String(), "\n"); lines > 24 {
		t.Errorf("spoolcast --help is %d lines; it should fit a screen", lines)
	}
	out.Reset()
	var errOut bytes.Buffer
	if code := run([]string{"relay", "--help"}, &out, &errOut); code != 0 || errOut.Len() != 0 {
		t.Fatalf("relay --help exited %d, wrote %q to stderr; want 0 and the help on stdout", code, errOut.String())
	}
	for _, want := range []string{
		"--listen", "default 127.0.0.1:7070, env SPOOLCAST_LISTEN",
		"--spool", "default ./data/spool.db",
		"--producer", "--max-body", "default 64KiB", "--spool-max-bytes", "default 1GiB", "SPOOLCAST_SPOOL_MAX_BYTES",
		"--sync", "default full", "--key-ttl", "default 24h0m0s", "--service-jwt-secret-file",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("spoolcast relay --help lacks %q", want)
		}
	}
}

func TestVersionNamesTheBuild(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"--version"}, &out, &out); code != 0 || !strings.HasPrefix(out.String(), "spoolcast ") || !strings.Contains(out.String(), "go1.") {
		t.Errorf("--version exited %d: %q", code, out.String())
	}
}

func TestRelayRefusesToStartWithoutWhatItNeeds(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"without a producer", []string{"relay", "--spool", dir + "/a.db"}, nil, "--producer is required"},
		{"on a public address without a secret", []string{"relay", "--producer", "p", "--listen", "0.0.0.0:0", "--spool", dir + "/b.db"}, nil, "not a loopback address"},
		{"with a bad size from the environment", []string{"relay", "--producer", "p"}, map[string]string{"SPOOLCAST_MAX_BODY": "lots"}, "SPOOLCAST_MAX_BODY"},
		{"with a bad sync mode", []string{"relay", "--producer", "p", "--sync", "sometimes", "--spool", dir + "/c.db"}, nil, "sync mode"},
		{"with a negative key TTL", []string{"relay", "--producer", "p", "--key-ttl", "-1h", "--spool", dir + "/d.db"}, nil, "must not be negative"},
		{"with a negative dead TTL", []string{"relay", "--producer", "p", "--dead-ttl", "-1h", "--spool", dir + "/d.db"}, nil, "must not be negative"},
		{"with a negative shutdown timeout", []string{"relay", "--producer", "p", "--shutdown-timeout", "-1s", "--spool", dir + "/d.db"}, nil, "must not be negative"},
		{"with a negative backoff", []string{"relay", "--producer", "p", "--max-backoff", "-1s", "--spool", dir + "/d.db"}, nil, "must not be negative"},
		{"with a negative batch size", []string{"relay", "--producer", "p", "--batch-size", "-5", "--spool", dir + "/d.db"}, nil, "at least 1"},
		{"with a negative size", []string{"relay", "--producer", "p", "--spool-max-bytes", "-5"}, nil, "byte size"},
		{"with a spool smaller than one event", []string{"relay", "--producer", "p", "--spool-max-bytes", "1KiB", "--spool", dir + "/d.db"}, nil, "not even one event"},
		{"with the profiler but no ops address", []string{"relay", "--producer", "p", "--pprof", "--spool", dir + "/d.db"}, nil, "--ops-listen"},
		{"central with a negative statement timeout", []string{"central", "--database-url", "postgres://x", "--db-statement-timeout", "-1s"}, nil, "must not be negative"},
		{"central with no connections", []string{"central", "--database-url", "postgres://x", "--db-max-conns", "0"}, nil, "--db-max-conns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var out bytes.Buffer
			if code := run(tc.args, &out, &out); code == 0 || !strings.Contains(out.String(), tc.want) {
				t.Errorf("exit %d, output %q; want an error naming %q", code, out.String(), tc.want)
			}
		})
	}
}

func TestByteSizesParseTheUnitsTheDocsName(t *testing.T) {
	for in, want := range map[string]int64{"65536": 65536, "64KiB": 64 << 10, "1GiB": 1 << 30, "10MB": 10e6, "3 MiB": 3 << 20} {
		var b byteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, b, err, want)
		}
	}
	var b byteSize
	if err := b.Set("-1"); err == nil {
		t.Error("a negative size was accepted")
	}
}

// relayFlags parses args as the relay's command line.
func relayFlags(t *testing.T, args ...string) relayOptions {
	t.Helper()
	var o relayOptions
	fs := newFlagSet("relay", "")
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o
}

func TestOpsListenerServesOnlyHealthAndMetrics(t *testing.T) {
	o := relayFlags(t, "--producer", "p", "--listen", "127.0.0.1:0", "--ops-listen", "127.0.0.1:0", "--spool", t.TempDir()+"/s.db")
	r, err := startRelay(context.Background(), o, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.shutdown(5 * time.Second)
	base := "http://" + r.opsAddr
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/v1/events": 404, "/debug/pprof/": 404} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s on the ops listener = %d, want %d", path, resp.StatusCode, want)
		}
	}
}

func TestTheProfilerIsServedOnlyOnTheOpsAddressWhenAskedFor(t *testing.T) {
	o := relayFlags(t, "--producer", "p", "--listen", "127.0.0.1:0", "--ops-listen", "127.0.0.1:0", "--pprof", "--spool", t.TempDir()+"/s.db")
	r, err := startRelay(context.Background(), o, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.shutdown(5 * time.Second)
	for base, want := range map[string]int{"http://" + r.opsAddr: 200, "http://" + r.addr: 404} {
		resp, err := http.Get(base + "/debug/pprof/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s/debug/pprof/ = %d, want %d", base, resp.StatusCode, want)
		}
	}
}

func TestASecondRelayOnTheSameSpoolRefusesToStart(t *testing.T) {
	spool := t.TempDir() + "/s.db"
	first, err := startRelay(context.Background(), relayFlags(t, "--producer", "p", "--listen", "127.0.0.1:0", "--spool", spool), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer first.shutdown(5 * time.Second)
	var out bytes.Buffer
	if code := run([]string{"relay", "--producer", "p", "--listen", "127.0.0.1:0", "--spool", spool}, &out, &out); code == 0 || !strings.Contains(out.String(), "in use by another process") {
		t.Errorf("second relay on one spool: exit %d, %q; want a refusal naming the owner", code, out.String())
	}
}

func TestARelayKeyTTLPastCentralsKeyWindowIsRefused(t *testing.T) {
	dbURL := pgtest.DB(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), `INSERT INTO spoolcast_settings (name, value) VALUES ('key_window', '48h0m0s')`); err != nil {
		t.Fatal(err)
	}
	o := relayFlags(t, "--producer", "p", "--listen", "127.0.0.1:0", "--spool", t.TempDir()+"/s.db", "--database-url", dbURL, "--key-ttl", "72h")
	if _, err := startRelay(context.Background(), o, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "key window") {
		t.Errorf("a relay keeping keys 72h beside a 48h key window started: %v", err)
	}
	o = relayFlags(t, "--producer", "p", "--listen", "127.0.0.1:0", "--spool", t.TempDir()+"/s.db", "--database-url", dbURL, "--key-ttl", "24h")
	r, err := startRelay(context.Background(), o, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("a relay keeping keys 24h beside a 48h key window: %v", err)
	}
	r.shutdown(5 * time.Second)
}

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestMaintainRunsOnePassAsOfAGivenTime(t *testing.T) {
	dbURL := pgtest.DB(t)
	later := time.Now().AddDate(0, 0, 100).UTC().Format(time.RFC3339)
	var out bytes.Buffer
	if code := run([]string{"maintain", "--database-url", dbURL, "--now", later, "--json"}, &out, &out); code != 0 {
		t.Fatalf("maintain exited %d: %s", code, out.String())
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var newest time.Time
	if err := pool.QueryRow(context.Background(), `SELECT max(to_date(right(c.relname, 8), 'YYYYMMDD'))::timestamptz
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'notifications'::regclass`).Scan(&newest); err != nil {
		t.Fatal(err)
	}
	if newest.Before(time.Now().AddDate(0, 0, 100)) {
		t.Errorf("newest partition starts %s; want partitions created ahead of the pass's time", newest.Format(time.DateOnly))
	}
	if code := run([]string{"maintain", "--database-url", dbURL, "--now", "yesterday"}, &out, &out); code == 0 {
		t.Error("maintain accepted --now yesterday")
	}
}
