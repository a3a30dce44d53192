package nodetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

func TestNodeRunsAProgram(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(Node(t), "-e", "process.stdout.write(String(6 * 7))").Output()
	if err != nil || string(out) != "42" {
		t.Fatalf("node -e: %q, %v", out, err)
	}
}

// A package with no dependencies: npm ci needs no network for it.
const (
	packageJSON = `{"name": "nodetest-empty", "version": "1.0.0", "private": true}`
	packageLock = `{"name": "nodetest-empty", "version": "1.0.0", "lockfileVersion": 3, "requires": true,
  "packages": {"": {"name": "nodetest-empty", "version": "1.0.0"}}}`
)

func TestInstallRunsNpmCiOnceUntilTheLockFileChanges(t *testing.T) {
	Node(t)
	dir := t.TempDir()
	for name, body := range map[string]string{"package.json": packageJSON, "package-lock.json": packageLock} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Parallel installs of one directory take turns: one runs npm ci, the
	// others find it done.
	t.Run("group", func(t *testing.T) {
		for range 4 {
			t.Run("installer", func(t *testing.T) {
				t.Parallel()
				Install(t, dir)
			})
		}
	})
	first, err := os.Stat(stampPath(dir))
	if err != nil {
		t.Fatalf("no stamp after Install: %v", err)
	}

	Install(t, dir)
	if again, _ := os.Stat(stampPath(dir)); !again.ModTime().Equal(first.ModTime()) {
		t.Error("Install ran npm ci again with the lock file unchanged")
	}

	// An older stamp stands for a lock file changed since the install.
	earlier := first.ModTime().Add(-time.Hour)
	if err := os.Chtimes(stampPath(dir), earlier, earlier); err != nil {
		t.Fatal(err)
	}
	Install(t, dir)
	if again, _ := os.Stat(stampPath(dir)); !again.ModTime().After(earlier) {
		t.Error("Install did not run npm ci after the lock file changed")
	}
}
