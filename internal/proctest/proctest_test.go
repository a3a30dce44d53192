package proctest

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Two checkouts testing at once, or two test processes of one checkout
// whose sources changed in between, each run the binary they built: it
// lies in a folder of its checkout's own, under a name of its content.
func TestTheBinaryIsTheCheckoutsOwnAndNamedByItsContent(t *testing.T) {
	path := Binary(t)
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	checkout := sha256.Sum256([]byte(root))
	if dir := filepath.Base(filepath.Dir(path)); !strings.Contains(dir, hex.EncodeToString(checkout[:8])) {
		t.Errorf("the binary is built into %s, a folder not named for the checkout at %s", filepath.Dir(path), root)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	content := sha256.Sum256(b)
	if name := filepath.Base(path); !strings.Contains(name, hex.EncodeToString(content[:8])) {
		t.Errorf("the binary %s is not named by its content (%x…)", path, content[:8])
	}
}

// A build removes the binaries and abandoned builds nobody used for a day,
// and keeps the rest.
func TestABuildRemovesOnlyBinariesUnusedForADay(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	old := time.Now().Add(-binaryMaxIdle - time.Hour)
	files := map[string]time.Time{
		"spoolcast-stale":   old,
		"build-1.tmp":       old,
		"spoolcast-recent":  time.Now().Add(-time.Hour),
		"spoolcast-current": old, // this process's own, even if its time is old
	}
	for name, at := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	pruneBinaries(dir, filepath.Join(dir, "spoolcast-current"))
	for name, kept := range map[string]bool{"spoolcast-stale": false, "build-1.tmp": false, "spoolcast-recent": true, "spoolcast-current": true} {
		if _, err := os.Stat(filepath.Join(dir, name)); (err == nil) != kept {
			t.Errorf("%s: kept = %v, want %v", name, err == nil, kept)
		}
	}
}
