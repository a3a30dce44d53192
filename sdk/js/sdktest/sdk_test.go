package sdktest

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/nodetest"
	"github.com/spoolcast/spoolcast/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// sdkDir is sdk/js, the npm workspace, from this package's folder.
const sdkDir = ".."

// npm runs `npm args...` in dir, failing the test with its output.
func npm(t *testing.T, dir string, args ...string) string {
	t.Helper()
	path, err := exec.LookPath("npm")
	if err != nil {
		t.Fatal(err) // nodetest.Install found it before
	}
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "npm_config_update_notifier=false", "npm_config_fund=false", "npm_config_audit=false")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("npm %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

var (
	buildOnce sync.Once
	buildOK   bool
)

// built installs the workspace from its lock file, builds every package and
// its tests, and type-checks them all (strict). Once per test process.
func built(t *testing.T) (node string) {
	t.Helper()
	node = nodetest.Node(t)
	nodetest.Install(t, sdkDir)
	buildOnce.Do(func() {
		npm(t, sdkDir, "run", "build")
		npm(t, sdkDir, "run", "typecheck")
		npm(t, sdkDir, "run", "build:test", "--workspaces", "--if-present")
		buildOK = true
	})
	if !buildOK {
		t.Fatal("building the SDK failed (see the test that tried first)")
	}
	return node
}

// runNode runs `node --test` on the compiled tests of a package, one file
// at a time (the files share the replicas they restart), streaming what it
// prints to t.Log, and fails the test on a non-zero exit.
func runNode(t *testing.T, node, pkg string, env ...string) {
	t.Helper()
	dir := filepath.Join(sdkDir, "packages", pkg)
	cmd := exec.Command(node, "--test", "--test-concurrency=1", "--test-timeout=120000", "--test-reporter=spec", "--enable-source-maps", "dist-test/")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	for lines.Scan() {
		t.Log(lines.Text())
	}
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("node --test in %s: %v", dir, err)
	}
}

// The client's own tests (the event-stream parser, tokens, errors, its size)
// and its tests against two real replicas behind one address and a
// rate-limited third: pages, marks and counts, devices and preferences,
// and the stream over the ws package's WebSocket and over server-sent
// events across a restart of every replica, a replica's kill with events
// posted while it was down, a refused cursor, an expired token and a 429.
func TestTheClientKeepsItsPromisesAgainstRealReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("runs npm, three central processes and node")
	}
	node := built(t)
	start := time.Now()
	r := newRig(t, pgtest.DB(t))
	control := r.serveControl()
	t.Logf("replicas ready in %s", time.Since(start).Round(time.Millisecond))
	runNode(t, node, "client", r.env(control)...)
}

// The React hooks (@spoolcast/react) rendered in a DOM with Testing Library
// against two real replicas behind one address and a third to post through
// while they are down: the first page, a live arrival at the top once,
// loadMore, marks shown at once and put back when refused, another
// session's reads through the stream, one subscription under StrictMode,
// a refused cursor reloading the first page, and a restart of every
// replica with notifications posted meanwhile, each rendered once, in order.
func TestTheReactHooksKeepThePromiseOnScreenAgainstRealReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("runs npm, three central processes and node")
	}
	node := built(t)
	r := newRig(t, pgtest.DB(t))
	control := r.serveControl()
	runNode(t, node, "react", r.env(control)...)
}
