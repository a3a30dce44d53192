package main

// What the run starts: a durable Postgres cluster, the fake Expo behind a
// clock (expo.go), one relay and one or more central replicas, each a
// subprocess of the real binary.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spoolcast/spoolcast/channel/expo/expotest"
	"github.com/spoolcast/spoolcast/internal/devauth"
	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/migrations"
)

const (
	issuerName = "spoolcast-e2e"
	audience   = "spoolcast-e2e"
)

// proc is one spoolcast process of the run.
type proc struct {
	name, base, logPath string
	// ops is where /readyz, /metrics and /debug/pprof/ are served: base,
	// or a replica's --ops-listen address under -pprof.
	ops  string
	cmd  *exec.Cmd
	done chan struct{}
}

// startProc runs bin with args, its output into logPath, and waits until
// ops answers ready (200 on path).
func startProc(ctx context.Context, name, bin, base, ops, ready, logPath string, args ...string) (*proc, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, base: base, ops: ops, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); log.Close(); close(p.done) }()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case <-p.done:
			return p, fmt.Errorf("%s exited at start; see %s", name, logPath)
		case <-ctx.Done():
			return p, ctx.Err()
		default:
		}
		if resp, err := http.Get(ops + ready); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
	}
	return p, fmt.Errorf("%s did not answer %s within 60s; see %s", name, ready, logPath)
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop sends SIGTERM and waits, then SIGKILL.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// world is everything the run started.
type world struct {
	cluster  *pgcluster.Cluster
	issuer   *devauth.Issuer
	relay    *proc
	centrals []*proc
	stops    []func()
}

func (w *world) tearDown() {
	for i := len(w.stops) - 1; i >= 0; i-- {
		w.stops[i]()
	}
}

// setUp starts Postgres, the fake Expo (timed by l), the relay and the
// central replicas, all on loopback.
func setUp(ctx context.Context, dir, bin string, cfg config, l *ledger) (*world, error) {
	replicas, expoRate := cfg.replicas, cfg.expoRate
	w := &world{}
	var err error
	settings := []string{"max_connections=200"}
	if cfg.pgStats {
		settings = append(settings, "shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all")
	}
	w.cluster, err = pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(dir, "pg"), Durable: true, Settings: settings})
	if err != nil {
		return w, fmt.Errorf("start Postgres: %w", err)
	}
	w.stops = append(w.stops, func() { _ = w.cluster.Stop() })
	if _, err := migrations.Up(ctx, w.cluster.URL, nil); err != nil {
		return w, fmt.Errorf("migrate: %w", err)
	}
	if cfg.pgStats {
		if err := execOnce(ctx, w.cluster.URL, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
			return w, err
		}
	}
	expo := httptest.NewServer(&expoClock{next: expotest.New(), l: l})
	w.stops = append(w.stops, expo.Close)
	if w.issuer, err = devauth.LoadIssuer(filepath.Join(dir, "issuer-key.pem"), issuerName, audience); err != nil {
		return w, err
	}
	jwks := httptest.NewServer(w.issuer.JWKS())
	w.stops = append(w.stops, jwks.Close)

	addr := freeAddr()
	relayArgs := append([]string{"relay", "--producer", "e2e", "--listen", addr, "--spool", filepath.Join(dir, "spool.db"),
		"--database-url", w.cluster.URL, "--log-level", "warn"}, cfg.relayArgs...)
	w.relay, err = startProc(ctx, "relay", bin, "http://"+addr, "http://"+addr, "/healthz", filepath.Join(dir, "relay.log"), relayArgs...)
	if w.relay != nil {
		w.stops = append(w.stops, w.relay.stop)
	}
	if err != nil {
		return w, err
	}
	for i := range replicas {
		addr := freeAddr()
		args := append([]string{"central", "--listen", addr, "--database-url", w.cluster.URL,
			"--oidc-issuer", issuerName, "--oidc-audience", audience, "--jwks-url", jwks.URL,
			// Push on, nothing held: no throttle, no suppress-if-seen, no
			// preference service; --expo-rate 0 lifts the send cap (the
			// fake answers at once), unless -expo-rate sets one.
			"--push=true", "--expo-url", expo.URL, "--expo-rate", strconv.Itoa(expoRate),
			"--maintenance-interval", "0", "--log-level", "warn"}, cfg.centralArgs...)
		ops := addr
		if cfg.pprof {
			ops = freeAddr()
			args = append(args, "--ops-listen", ops, "--pprof")
		}
		c, err := startProc(ctx, fmt.Sprintf("central-%d", i), bin, "http://"+addr, "http://"+ops, "/readyz", filepath.Join(dir, fmt.Sprintf("central-%d.log", i)), args...)
		if c != nil {
			w.stops = append(w.stops, c.stop)
			w.centrals = append(w.centrals, c)
		}
		if err != nil {
			return w, err
		}
	}
	return w, nil
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// raiseFileLimit lifts the open-file limit (inherited by the subprocesses)
// to at least want when it can: to the hard limit, and past it as root.
func raiseFileLimit(want uint64) (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	if l.Cur >= want {
		return l.Cur, nil
	}
	if l.Max < want {
		raised := syscall.Rlimit{Cur: want, Max: want}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			return want, nil
		}
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	if l.Cur < want {
		return l.Cur, errors.New("the hard limit is lower and cannot be raised by this user")
	}
	return l.Cur, nil
}

// procCPU is a process's user and system CPU time so far, from /proc.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// selfCPU is this process's user and system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procRSS is a process's resident set, from /proc/<pid>/status.
func procRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return kb << 10
		}
	}
	return 0
}
