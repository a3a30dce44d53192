// Package pgcluster runs a local Postgres cluster from the installed initdb and
// pg_ctl: a throwaway one for tests, a kept one under ./data/pg for
// `spoolcast dev`. For failover tests a cluster can have a streaming standby
// (pg_basebackup -R), which can be promoted, and can be killed as a crash
// would. When run as root it runs Postgres as the postgres user, since
// Postgres refuses to run as root.
package pgcluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoPostgres: no initdb/pg_ctl could be found.
var ErrNoPostgres = errors.New("no Postgres server binaries (initdb, pg_ctl) found; install postgresql or set DATABASE_URL")

// Config describes a local cluster.
type Config struct {
	// Dir holds the cluster's data (Dir/data), socket and log. Required.
	Dir string
	// Port to listen on, on 127.0.0.1. Default: a free port, remembered in Dir for reuse.
	Port int
	// Durable keeps fsync on. Tests turn it off for speed; `spoolcast dev` keeps it.
	Durable bool
	// Settings are extra server settings, name=value.
	Settings []string
	// SynchronousStandby, when set, is the application_name of a standby
	// that must have flushed every commit before the commit returns
	// (synchronous_standby_names, synchronous_commit=on): until it streams,
	// writes wait. Default "": replication, if any, is asynchronous. It is a
	// setting of this server's command line only, so a standby made from it
	// does not inherit it and, once promoted, waits for nobody.
	SynchronousStandby string
}

// Cluster is a local Postgres cluster.
type Cluster struct {
	cfg  Config
	bin  string
	cred *syscall.Credential
	// URL is the connection URL of the cluster's postgres database.
	URL string
	// Started is true when Start started the server, false when it found it
	// already running (left by another process) and only connected to it.
	Started bool
}

// FindBinaries returns the directory holding initdb and pg_ctl: PATH first, then
// the newest /usr/lib/postgresql/*/bin.
func FindBinaries() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return cmp.Compare(versionOf(b), versionOf(a)) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoPostgres
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// Start initialises the cluster if Dir has none, starts it and waits until it
// accepts connections.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	cfg.Dir = dir
	if cfg.SynchronousStandby != "" && !isName(cfg.SynchronousStandby) {
		return nil, fmt.Errorf("synchronous standby %q: want letters, digits and underscores", cfg.SynchronousStandby)
	}
	c := &Cluster{cfg: cfg, bin: bin}
	if os.Geteuid() == 0 {
		if c.cred, err = postgresUser(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := c.chown(dir); err != nil {
		return nil, err
	}
	if err := c.checkReachable(dir); err != nil {
		return nil, err
	}
	choosePort := cfg.Port == 0
	if choosePort {
		cfg.Port, err = rememberedPort(dir)
		if err != nil {
			return nil, err
		}
		c.cfg.Port = cfg.Port
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "PG_VERSION")); err != nil {
		args := []string{"-D", filepath.Join(dir, "data"), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale"}
		if !cfg.Durable {
			args = append(args, "--no-sync")
		}
		if out, err := c.run(ctx, "initdb", args...); err != nil {
			return nil, fmt.Errorf("initdb: %w\n%s", err, out)
		}
		if err := allowReplication(filepath.Join(dir, "data", "pg_hba.conf")); err != nil {
			return nil, err
		}
	}
	if c.running() {
		// A server left by a run that did not stop cleanly, or run by another
		// process: use it, and leave stopping it to whoever started it.
		c.URL = c.url()
		return c, c.waitReady(ctx)
	}
	for attempt := 1; ; attempt++ {
		err := c.start(ctx)
		if err == nil || !choosePort || attempt == 5 || !strings.Contains(err.Error(), "Address already in use") {
			if err != nil {
				return nil, err
			}
			break
		}
		// The free port it chose was taken (by another test process) before
		// the server bound it: choose again.
		_ = os.Remove(filepath.Join(dir, "port"))
		if c.cfg.Port, err = rememberedPort(dir); err != nil {
			return nil, err
		}
	}
	c.URL, c.Started = c.url(), true
	return c, c.waitReady(ctx)
}

// start runs pg_ctl start with the cluster's settings.
func (c *Cluster) start(ctx context.Context) error {
	cfg, dir := c.cfg, c.cfg.Dir
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -c port=%d -c unix_socket_directories=%s -c max_connections=200", cfg.Port, dir)
	if !cfg.Durable {
		opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	}
	for _, s := range cfg.Settings {
		opts += " -c " + s
	}
	if cfg.SynchronousStandby != "" {
		// Last, so that no other setting turns the wait off.
		opts += " -c synchronous_commit=on -c synchronous_standby_names=" + cfg.SynchronousStandby
	}
	if out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(dir, "data"), "-l", filepath.Join(dir, "postgres.log"), "-o", opts, "-w", "-t", "60", "start"); err != nil {
		return fmt.Errorf("pg_ctl start: %w\n%s\n%s", err, out, tail(filepath.Join(dir, "postgres.log")))
	}
	return nil
}

// Stop stops the server (fast mode: connections are closed, data is kept).
func (c *Cluster) Stop() error {
	if !c.running() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.cfg.Dir, "data"), "-m", "fast", "-w", "stop"); err != nil {
		return fmt.Errorf("pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// Freeze stops every process of the running server with SIGSTOP, as a hung
// host or a stalled disk would: connections open but nothing answers. The
// returned function resumes them (SIGCONT).
func (c *Cluster) Freeze() (thaw func(), err error) {
	pids, err := c.processes()
	if err != nil {
		return nil, fmt.Errorf("freeze: %w", err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return nil, fmt.Errorf("freeze %d: %w", pid, err)
		}
	}
	return func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}, nil
}

// FreezeWALSenders stops, with SIGSTOP, the processes that stream WAL to
// standbys, as a slow link to them would: a standby falls behind while the
// primary goes on committing (asynchronous replication), or the primary's
// commits wait for it (synchronous). The returned function resumes them.
func (c *Cluster) FreezeWALSenders() (thaw func(), err error) {
	pids, err := c.processes()
	if err != nil {
		return nil, fmt.Errorf("freeze WAL senders: %w", err)
	}
	var senders []int
	for _, pid := range pids {
		title, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(title), "walsender") {
			senders = append(senders, pid)
		}
	}
	if len(senders) == 0 {
		return nil, errors.New("freeze WAL senders: no standby streams from this server")
	}
	for _, pid := range senders {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return nil, fmt.Errorf("freeze WAL sender %d: %w", pid, err)
		}
	}
	return func() {
		for _, pid := range senders {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}, nil
}

// Kill ends the running server as a crash of its host would: SIGKILL to the
// postmaster and every process it started, with no checkpoint, no
// shutdown record and no goodbye to clients (their connections see EOF or
// a reset). It returns once they are all gone, having removed the lock
// files the dead server left, so that Restart starts it again in crash
// recovery, as after a reboot.
func (c *Cluster) Kill() error {
	postmaster, err := c.postmasterPID()
	if err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	// Stopped first, the postmaster cannot start a process that the list
	// below would miss.
	if err := syscall.Kill(postmaster, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("kill %d: %w", postmaster, err)
	}
	pids, err := c.processes()
	if err != nil {
		_ = syscall.Kill(postmaster, syscall.SIGKILL)
		return fmt.Errorf("kill: %w", err)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("kill: process %d still runs 30s after SIGKILL", pid)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// A killed postmaster may stay a zombie nobody reaps, and pg_ctl and
	// Postgres take a lock file naming a live pid (a zombie's, too) for a
	// running server.
	for _, f := range []string{filepath.Join(c.cfg.Dir, "data", "postmaster.pid"), filepath.Join(c.cfg.Dir, fmt.Sprintf(".s.PGSQL.%d.lock", c.cfg.Port))} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("kill: %w", err)
		}
	}
	return nil
}

// alive reports whether pid is a process that has not exited: neither gone
// nor a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	state, _, _ := strings.Cut(rest, " ")
	return state != "Z" && state != "X"
}

// postmasterPID reads the running server's postmaster pid.
func (c *Cluster) postmasterPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(c.cfg.Dir, "data", "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid: %w", err)
	}
	return pid, nil
}

// processes lists the running server's postmaster and its children.
func (c *Cluster) processes() ([]int, error) {
	postmaster, err := c.postmasterPID()
	if err != nil {
		return nil, err
	}
	pids := []int{postmaster}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, stat := range stats {
		b, err := os.ReadFile(stat)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces, so read after ")".
		_, rest, ok := strings.Cut(string(b), ") ")
		fields := strings.Fields(rest)
		if !ok || len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == postmaster {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(stat)))
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Restart starts a stopped cluster again on the same port.
func (c *Cluster) Restart(ctx context.Context) error {
	_, err := Start(ctx, c.cfg)
	return err
}

// MultiHostURL names the postgres database of every cluster, in order, with
// target_session_attrs=read-write (libpq's syntax, which pgx follows).
func MultiHostURL(clusters ...*Cluster) string {
	hosts := make([]string, len(clusters))
	for i, c := range clusters {
		hosts[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port()))
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/postgres?sslmode=disable&target_session_attrs=read-write"
}

// Port is the port the cluster listens on, on 127.0.0.1.
func (c *Cluster) Port() int { return c.cfg.Port }

// LogFile is the server's log, kept across restarts.
func (c *Cluster) LogFile() string { return filepath.Join(c.cfg.Dir, "postgres.log") }

func (c *Cluster) url() string {
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.cfg.Port)), Path: "/postgres"}
	return u.String() + "?sslmode=disable"
}

func (c *Cluster) running() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.cfg.Dir, "data"), "status")
	return err == nil
}

func (c *Cluster) waitReady(ctx context.Context) error {
	if err := c.waitTrue(ctx, `SELECT true`); err != nil {
		return fmt.Errorf("postgres at %s not ready: %w", c.URL, err)
	}
	return nil
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.cfg.Dir
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
		cmd.Env = append(os.Environ(), "HOME="+c.cfg.Dir)
	}
	// pg_ctl start leaves the server running with our stdout open; a file keeps
	// the call from waiting on the server's lifetime.
	out, err := os.CreateTemp("", "pgcluster-*.out")
	if err != nil {
		return nil, err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Run()
	b, _ := os.ReadFile(out.Name())
	return b, err
}

func (c *Cluster) chown(path string) error {
	if c.cred == nil {
		return nil
	}
	return filepath.Walk(path, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(c.cred.Uid), int(c.cred.Gid))
	})
}

// checkReachable makes sure the postgres user can reach dir: every directory
// above it must be searchable by others.
func (c *Cluster) checkReachable(dir string) error {
	if c.cred == nil {
		return nil
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("postgres runs as the postgres user and cannot reach %s: %s is not searchable by others (chmod o+x %s)", dir, p, p)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs a postgres user to run Postgres as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// rememberedPort returns the port stored in dir/port, or a free one, stored.
func rememberedPort(dir string) (int, error) {
	file := filepath.Join(dir, "port")
	if b, err := os.ReadFile(file); err == nil {
		if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && p > 0 {
			return p, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port, os.WriteFile(file, []byte(strconv.Itoa(port)), 0o644)
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// StartTemp starts a throwaway cluster in a new temporary directory named
// after prefix (readable by Postgres when it runs as its own user); cleanup
// stops it and removes the directory. cfg.Dir is ignored.
func StartTemp(ctx context.Context, prefix string, cfg Config) (c *Cluster, cleanup func(), err error) {
	tmp, err := os.MkdirTemp("", prefix+"-")
	if err != nil {
		return nil, nil, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return nil, nil, err
	}
	cfg.Dir = filepath.Join(tmp, "pg")
	if c, err = Start(ctx, cfg); err != nil {
		os.RemoveAll(tmp)
		return nil, nil, err
	}
	return c, func() { _ = c.Stop(); _ = os.RemoveAll(tmp) }, nil
}

// CPU is the user and system CPU time the running cluster has used: its
// postmaster's own, its running children's, and that of the children it has
// reaped (backends of closed connections). Benchmarks read it before and
// after a run; 0 when the cluster is not running.
func (c *Cluster) CPU() time.Duration {
	pids, err := c.processes()
	if err != nil {
		return 0
	}
	var ticks int64
	for i, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		_, rest, _ := strings.Cut(string(b), ") ")
		f := strings.Fields(rest)
		fields := []int{11, 12} // utime, stime
		if i == 0 {
			fields = append(fields, 13, 14) // the postmaster's reaped children: cutime, cstime
		}
		for _, j := range fields {
			if j < len(f) {
				v, _ := strconv.ParseInt(f[j], 10, 64)
				ticks += v
			}
		}
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}
