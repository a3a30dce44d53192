package main

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// env holds the binaries every target runs from.
type env struct {
	self, spoolcast, redisServer, natsServer, pgBin string
	pgCred                                          *syscall.Credential // Postgres refuses to run as root
	pool                                            int
}

// prepare builds or finds every binary the chosen targets need, so that a
// missing one fails the run before any measuring.
func prepare(cfg config, work string) (*env, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	e := &env{self: self, pool: cfg.pool}
	bin := filepath.Join(work, "bin")
	wants := func(name string) bool { return slices.Contains(cfg.targets, name) }
	if wants("relay") {
		e.spoolcast = cfg.spoolcast
		if e.spoolcast == "" {
			e.spoolcast = filepath.Join(bin, "spoolcast")
			if err := goBuild(cfg.repo, e.spoolcast, "./cmd/spoolcast"); err != nil {
				return nil, fmt.Errorf("build spoolcast from %s: %w", cfg.repo, err)
			}
		}
	}
	if wants("redis") {
		if e.redisServer, err = exec.LookPath(cfg.redisServer); err != nil {
			return nil, fmt.Errorf("redis-server not found (install it with: apt-get install -y redis-server): %w", err)
		}
	}
	if wants("nats") {
		e.natsServer = cfg.natsServer
		if e.natsServer == "" {
			// The version is pinned by this module's go.mod (a tool dependency).
			e.natsServer = filepath.Join(bin, "nats-server")
			if err := goBuild(".", e.natsServer, "github.com/nats-io/nats-server/v2"); err != nil {
				return nil, fmt.Errorf("build nats-server (run from benchmarks/peers): %w", err)
			}
		}
	}
	if wants("postgres") {
		if e.pgBin = cfg.pgBin; e.pgBin == "" {
			if e.pgBin, err = newestPostgres(); err != nil {
				return nil, err
			}
		}
		if os.Geteuid() == 0 {
			u, err := user.Lookup("postgres")
			if err != nil {
				return nil, fmt.Errorf("running as root needs a postgres user to run Postgres as: %w", err)
			}
			uid, _ := strconv.Atoi(u.Uid)
			gid, _ := strconv.Atoi(u.Gid)
			e.pgCred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		}
	}
	return e, nil
}

func goBuild(dir, out, pkg string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

func newestPostgres() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(d string) int { v, _ := strconv.Atoi(filepath.Base(filepath.Dir(d))); return v }
	slices.SortFunc(dirs, func(a, b string) int { return cmp.Compare(version(b), version(a)) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("no Postgres server binaries under /usr/lib/postgresql/*/bin (install postgresql)")
}

// target is one way to ingest events durably behind the HTTP contract.
type target struct {
	name, label string
	// init prepares an empty data directory, when the store needs it.
	init func(dir string) error
	// start runs the target over the data in dir, serving the contract on
	// addr. durable=false relaxes fsync, for the prefill only.
	start func(dir, addr string, durable bool) (*instance, error)
}

// instance is a running target.
type instance struct {
	url string
	// storage are the processes that write the data, each counted with its
	// descendants (Postgres's backends, Redis's rewrite children).
	storage []*exec.Cmd
	// all are every process serving the target, storage and front-end, in
	// start order; CPU is summed over them.
	all []*exec.Cmd
	// settle makes the store write what it deferred (nil: nothing).
	settle func() error
}

// stop ends the processes in reverse start order: the front-end first, so
// that nothing is in flight when the store shuts down.
func (in *instance) stop() error {
	var first error
	for _, cmd := range slices.Backward(in.all) {
		if err := stopProcess(cmd); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (e *env) target(name string) (*target, error) {
	switch name {
	case "relay":
		return e.relay(), nil
	case "redis":
		return e.redis(), nil
	case "nats":
		return e.nats(), nil
	case "postgres":
		return e.postgres(), nil
	}
	return nil, fmt.Errorf("unknown target %q: want relay, redis, nats or postgres", name)
}

// relay is the product: it decodes and checks the event, claims its key and
// spools it into SQLite, answering once the commit is fsync'd (--sync full).
func (e *env) relay() *target {
	return &target{name: "relay", label: "spoolcast relay, --sync full (SQLite WAL, fsync per group commit)",
		start: func(dir, addr string, durable bool) (*instance, error) {
			sync := "full"
			if !durable {
				sync = "normal"
			}
			cmd, err := startProcess(dir, "relay.log", nil, e.spoolcast, "relay", "--producer", "peers", "--listen", addr,
				"--spool", filepath.Join(dir, "spool.db"), "--sync", sync, "--log-level", "warn", "--spool-max-bytes", "8GiB")
			if err != nil {
				return nil, err
			}
			in := &instance{url: "http://" + addr + "/v1/events", storage: []*exec.Cmd{cmd}, all: []*exec.Cmd{cmd}}
			if err := waitListening(addr, in.all, filepath.Join(dir, "relay.log")); err != nil {
				in.stop()
				return nil, err
			}
			return in, nil
		}}
}

// redis is Redis with an append-only file fsync'd before every reply
// (appendfsync always; Redis writes and syncs the file once per event-loop
// pass, before answering the clients of that pass), and no RDB snapshots.
func (e *env) redis() *target {
	return &target{name: "redis", label: "Redis 7, appendonly yes, appendfsync always (Lua: SET NX EX + XADD)",
		start: func(dir, addr string, durable bool) (*instance, error) {
			fsync := "always"
			if !durable {
				fsync = "no"
			}
			port := freePort()
			server, err := startProcess(dir, "redis.log", nil, e.redisServer, "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
				"--dir", dir, "--appendonly", "yes", "--appendfsync", fsync, "--save", "", "--daemonize", "no")
			if err != nil {
				return nil, err
			}
			return e.withFrontEnd(dir, addr, "redis", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), server, nil)
		}}
}

// nats is a JetStream server whose file store syncs every write
// (sync_interval: always) and a stream deduplicating on Nats-Msg-Id.
func (e *env) nats() *target {
	return &target{name: "nats", label: "NATS JetStream, file store, sync_interval: always (Nats-Msg-Id dedup)",
		start: func(dir, addr string, durable bool) (*instance, error) {
			port := freePort()
			sync := "sync_interval: always"
			if !durable {
				sync = "" // the default: a sync every two minutes
			}
			conf := fmt.Sprintf("listen: \"127.0.0.1:%d\"\njetstream {\n  store_dir: %q\n  %s\n}\n", port, filepath.Join(dir, "jetstream"), sync)
			confPath := filepath.Join(dir, "nats.conf")
			if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
				return nil, err
			}
			server, err := startProcess(dir, "nats.log", nil, e.natsServer, "-c", confPath)
			if err != nil {
				return nil, err
			}
			return e.withFrontEnd(dir, addr, "nats", fmt.Sprintf("nats://127.0.0.1:%d", port), server, nil)
		}}
}

// postgres is a Postgres cluster with its durable defaults (fsync on,
// synchronous_commit on, full_page_writes on), one committed INSERT per event.
func (e *env) postgres() *target {
	return &target{name: "postgres", label: "Postgres 15, one INSERT … ON CONFLICT DO NOTHING transaction per event, synchronous_commit on",
		init: func(dir string) error {
			if err := e.chownToPostgres(dir); err != nil {
				return err
			}
			cmd := exec.Command(filepath.Join(e.pgBin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale")
			cmd.Dir = dir
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: e.pgCred}
			cmd.Env = append(os.Environ(), "HOME="+dir)
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("initdb: %w\n%s", err, out)
			}
			return nil
		},
		start: func(dir, addr string, durable bool) (*instance, error) {
			port := freePort()
			commit := "on"
			if !durable {
				commit = "off"
			}
			// The postmaster is our child (no pg_ctl), so that its pid is
			// known and its backends are its children.
			server, err := startProcess(dir, "postgres.log", e.pgCred, filepath.Join(e.pgBin, "postgres"), "-D", filepath.Join(dir, "data"),
				"-c", "listen_addresses=127.0.0.1", "-c", "port="+strconv.Itoa(port), "-c", "unix_socket_directories="+dir,
				"-c", "max_connections=200", "-c", "fsync=on", "-c", "full_page_writes=on", "-c", "synchronous_commit="+commit)
			if err != nil {
				return nil, err
			}
			url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
			checkpoint := func() error {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				conn, err := pgx.Connect(ctx, url)
				if err != nil {
					return err
				}
				defer conn.Close(ctx)
				_, err = conn.Exec(ctx, "CHECKPOINT")
				return err
			}
			return e.withFrontEnd(dir, addr, "postgres", url, server, checkpoint)
		}}
}

// withFrontEnd starts this program as the HTTP front-end of a store that
// server runs, and waits for it to listen (it listens once its backend
// answers).
func (e *env) withFrontEnd(dir, addr, kind, backend string, server *exec.Cmd, settle func() error) (*instance, error) {
	in := &instance{url: "http://" + addr + "/v1/events", storage: []*exec.Cmd{server}, all: []*exec.Cmd{server}, settle: settle}
	front, err := startProcess(dir, "front.log", nil, e.self, "-serve", kind, "-listen", addr, "-backend", backend, "-pool", strconv.Itoa(e.pool))
	if err != nil {
		in.stop()
		return nil, err
	}
	in.all = append(in.all, front)
	if err := waitListening(addr, in.all, filepath.Join(dir, "front.log"), filepath.Join(dir, kind+".log")); err != nil {
		in.stop()
		return nil, err
	}
	return in, nil
}

func (e *env) chownToPostgres(dir string) error {
	if e.pgCred == nil {
		return nil
	}
	return os.Chown(dir, int(e.pgCred.Uid), int(e.pgCred.Gid))
}

// startProcess starts bin with its output in dir/logName. The child is
// killed if this program dies, so that no server outlives a run.
func startProcess(dir, logName string, cred *syscall.Credential, bin string, args ...string) (*exec.Cmd, error) {
	logFile, err := os.Create(filepath.Join(dir, logName))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
	if cred != nil {
		cmd.Env = append(os.Environ(), "HOME="+dir)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	return cmd, nil
}

// stopProcess asks for a clean shutdown (Postgres: fast mode, on SIGINT)
// and kills the process if it has not exited within a minute.
func stopProcess(cmd *exec.Cmd) error {
	sig := syscall.SIGTERM
	if filepath.Base(cmd.Path) == "postgres" {
		sig = syscall.SIGINT
	}
	_ = cmd.Process.Signal(sig)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s: %w", filepath.Base(cmd.Path), err)
		}
		return nil
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s did not stop within a minute; killed", filepath.Base(cmd.Path))
	}
}

// waitListening waits until addr accepts connections, failing early with
// the logs' tails if any of procs exits first (they are not waited for
// until stopped, so an exited child stays a zombie).
func waitListening(addr string, procs []*exec.Cmd, logs ...string) error {
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return nil
		}
		for _, cmd := range procs {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)); err != nil || processState(b) == "Z" {
				return fmt.Errorf("%s exited before %s listened%s", filepath.Base(cmd.Path), addr, tails(logs))
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("nothing listened on %s within 3 minutes%s", addr, tails(logs))
}

func processState(stat []byte) string {
	_, rest, _ := strings.Cut(string(stat), ") ")
	state, _, _ := strings.Cut(rest, " ")
	return state
}

func tails(logs []string) string {
	var b strings.Builder
	for _, path := range logs {
		data, _ := os.ReadFile(path)
		if len(data) > 2000 {
			data = data[len(data)-2000:]
		}
		fmt.Fprintf(&b, "\n--- %s:\n%s", path, data)
	}
	return b.String()
}

func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func freeAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort())) }
