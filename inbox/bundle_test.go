package inbox_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/spoolcast/spoolcast/internal/nodetest"
)

// The committed script, static/inbox.js, is what build.mjs makes of
// src/inbox.ts and the SDK's client, byte for byte (its types checked
// under strict on the way), so it never goes stale: `make inbox` rebuilds
// it. Without Node this skips, unless SPOOLCAST_REQUIRE_NODE=1 makes that a
// failure.
func TestTheCommittedBundleIsWhatItsSourcesBuild(t *testing.T) {
	node := nodetest.Node(t)
	nodetest.Install(t, filepath.Join("..", "sdk", "js"))
	out := filepath.Join(t.TempDir(), "inbox.js")
	if b, err := exec.Command(node, "build.mjs", out).CombinedOutput(); err != nil {
		t.Fatalf("node build.mjs: %v\n%s", err, b)
	}
	built, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join("static", "inbox.js"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(built, committed) {
		t.Errorf("static/inbox.js (%d bytes) is not what src/inbox.ts and the SDK's client build (%d bytes): run make inbox, and commit the result", len(committed), len(built))
	}
}
