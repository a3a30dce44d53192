// Package proctest runs the spoolcast binary as a real subprocess for tests
// that crash it (kill -9), restart it and talk to it over loopback.
package proctest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary builds cmd/spoolcast once per test process and returns its path.
// The binary is named by its content, in a folder of this checkout's own
// under the system's temporary directory: test processes of one checkout
// that build the same sources share one file, and a process never runs a
// binary that another checkout, or a build of sources edited meanwhile, put
// in its place. Each build goes to a temporary name and is renamed into
// place, which is atomic (a running copy keeps its own file); the Go build
// cache makes every build after the first cheap. A binary unused for a day
// is removed by the next build.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		binPath, buildErr = build(filepath.Join(filepath.Dir(file), "..", ".."))
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// binaryMaxIdle is how long a built binary is kept after its last use: far
// longer than a test process runs.
const binaryMaxIdle = 24 * time.Hour

// binaryDir is the folder the binaries of the checkout at root are built
// into: one per checkout, named by a hash of its path.
func binaryDir(root string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(root)))
	return filepath.Join(os.TempDir(), "spoolcast-proctest-"+hex.EncodeToString(sum[:8]))
}

// build builds the checkout at root into binaryDir(root), under a name of
// its content, and returns the binary's path.
func build(root string) (string, error) {
	dir := binaryDir(root)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, "build-*.tmp")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("go", "build", "-o", tmp.Name(), "./cmd/spoolcast")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	sum, err := fileSum(tmp.Name())
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "spoolcast-"+sum)
	if _, err := os.Stat(path); err == nil {
		// Built before, by this process's sources: keep that file, marked used.
		now := time.Now()
		err = os.Chtimes(path, now, now)
	} else {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return "", err
	}
	pruneBinaries(dir, path)
	return path, nil
}

// fileSum is the first 16 hex digits of the SHA-256 of the file at path.
func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)[:8]), nil
}

// pruneBinaries removes the binaries and abandoned builds in dir unused for
// binaryMaxIdle, but never keep.
func pruneBinaries(dir, keep string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		info, err := e.Info()
		if err != nil || path == keep || time.Since(info.ModTime()) < binaryMaxIdle {
			continue
		}
		os.Remove(path)
	}
}

// Free ports are chosen below Linux's ephemeral range (32768 and up by
// default): a port from that range can be handed to any client connection,
// of this test or of another package's running beside it, between the
// moment it was found free and the moment the process under test binds it
// ("address already in use").
const (
	freePortLow  = 20000
	freePortHigh = 32000
)

// FreeAddr returns a loopback address with a port that was free a moment
// ago, outside the range the kernel hands out to connections.
func FreeAddr(t testing.TB) string {
	t.Helper()
	for range 200 {
		addr := fmt.Sprintf("127.0.0.1:%d", freePortLow+rand.IntN(freePortHigh-freePortLow))
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			return addr
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Process is a running spoolcast subprocess.
type Process struct {
	t      testing.TB
	cmd    *exec.Cmd
	output *syncBuffer
	done   chan struct{}
	err    error
}

// Start runs `spoolcast args...` with env added to the test's environment.
// The process is killed when the test ends, if still running.
func Start(t testing.TB, env []string, args ...string) *Process {
	t.Helper()
	cmd := exec.Command(Binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Process{t: t, cmd: cmd, output: out, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("spoolcast %v output:\n%s", args, out.String())
		}
	})
	return p
}

// WaitHealthy polls baseURL/healthz until it answers 200 or the process exits.
func (p *Process) WaitHealthy(baseURL string) {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			p.t.Fatalf("spoolcast exited before becoming healthy: %v\n%s", p.err, p.output.String())
		default:
		}
		resp, err := http.Get(baseURL + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.t.Fatalf("spoolcast not healthy at %s after 30s\n%s", baseURL, p.output.String())
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM and waits for a clean exit; it fails the test otherwise.
func (p *Process) Stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			p.t.Fatalf("spoolcast exited with %v after SIGTERM\n%s", p.err, p.output.String())
		}
	case <-time.After(30 * time.Second):
		p.t.Fatalf("spoolcast still running 30s after SIGTERM\n%s", p.output.String())
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) {
	_ = p.cmd.Process.Signal(sig)
}

// PeakRSS returns the most resident memory the running process has used so
// far (VmHWM), in bytes.
func (p *Process) PeakRSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", p.cmd.Process.Pid)
}

// ExitCode is the exit status once Done is closed (-1 when killed by a signal).
func (p *Process) ExitCode() int { return p.cmd.ProcessState.ExitCode() }

// Output returns what the process has printed so far.
func (p *Process) Output() string { return p.output.String() }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Load runs workers goroutines, each calling fn(worker, n) for n = 0, 1, …
// until fn returns false or stop is called: producers sending while a
// process is killed under them. stop waits for every worker to return.
func Load(workers int, fn func(worker, n int) bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-done:
					return
				default:
				}
				if !fn(w, n) {
					return
				}
			}
		})
	}
	return func() { close(done); wg.Wait() }
}
