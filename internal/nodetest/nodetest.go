// Package nodetest lets Go tests run Node.js programs: a reference
// implementation from npm to check ours against. Tests that need Node skip
// where it is not installed, unless SPOOLCAST_REQUIRE_NODE=1 (CI) makes that
// a failure, so that a missing Node cannot pass a build by skipping.
package nodetest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/filelock"
)

// RequireEnv is the environment variable that turns a missing node or npm
// from a skip into a failure.
const RequireEnv = "SPOOLCAST_REQUIRE_NODE"

// installWait bounds how long Install waits for another test process's
// npm ci: a cold npm cache downloads every package.
const installWait = 5 * time.Minute

// Node returns the path of node, skipping the test if it is not installed.
func Node(t testing.TB) string {
	t.Helper()
	return lookPath(t, "node")
}

// Install makes dir's node_modules match its package-lock.json: it runs
// `npm ci` there unless an earlier Install completed after the lock file last
// changed. Test processes (go test runs packages in parallel) take turns
// under a file lock, so one installs and the others find it done.
func Install(t testing.TB, dir string) {
	t.Helper()
	dir, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if installed(t, dir) {
		return
	}
	npm := lookPath(t, "npm")
	unlock := lock(t, dir)
	defer unlock()
	if installed(t, dir) { // the process we waited for did it
		return
	}
	cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "npm_config_update_notifier=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	// A package without dependencies gets no node_modules from npm.
	if err := os.MkdirAll(filepath.Dir(stampPath(dir)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stampPath(dir), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// stampPath marks a completed install. npm ci deletes node_modules first, so
// an install cut short leaves no stamp, and the next Install starts over.
func stampPath(dir string) string {
	return filepath.Join(dir, "node_modules", ".spoolcast-nodetest-installed")
}

// installed reports whether the stamp is at least as new as the lock file.
func installed(t testing.TB, dir string) bool {
	t.Helper()
	lockInfo, err := os.Stat(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatalf("npm install: %v", err)
	}
	stamp, err := os.Stat(stampPath(dir))
	return err == nil && !stamp.ModTime().Before(lockInfo.ModTime())
}

// lock takes the install lock of dir, waiting for another process holding
// it. The lock file lives in the temporary directory, not in the source tree.
func lock(t testing.TB, dir string) (unlock func()) {
	t.Helper()
	sum := sha256.Sum256([]byte(dir))
	path := filepath.Join(os.TempDir(), "spoolcast-nodetest-"+hex.EncodeToString(sum[:8])+".lock")
	deadline := time.Now().Add(installWait)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		f, err := filelock.Acquire(path)
		if err == nil {
			return func() { f.Close() }
		}
		if !errors.Is(err, filelock.ErrHeld) || time.Now().After(deadline) {
			t.Fatalf("npm install in %s: %v", dir, err)
		}
		<-tick.C
	}
}

// lookPath finds name on PATH; without it the test skips, or fails when
// RequireEnv is set.
func lookPath(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%s is required (%s=1): %v", name, RequireEnv, err)
	}
	t.Skipf("%s not installed (%v); set %s=1 to fail instead", name, err, RequireEnv)
	return ""
}
