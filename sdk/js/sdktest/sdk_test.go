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
	runNode(t, node, "client",
		"SPOOLCAST_SDK_CONTROL="+control,
		"SPOOLCAST_SDK_BASE="+r.proxy.URL(),
		"SPOOLCAST_SDK_LIMITED=http://"+r.limited.addr,
	)
}

// `npm pack` makes a tarball that installs into an empty project, where it
// imports and runs, and its types check under tsc --strict.
func TestThePackedClientInstallsIntoAnEmptyProject(t *testing.T) {
	if testing.Short() {
		t.Skip("runs npm and node")
	}
	node := built(t)
	packs := t.TempDir()
	out := npm(t, filepath.Join(sdkDir, "packages", "client"), "pack", "--pack-destination", packs)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	tarball := filepath.Join(packs, strings.TrimSpace(lines[len(lines)-1]))
	if _, err := os.Stat(tarball); err != nil {
		t.Fatalf("npm pack printed %q: %v", out, err)
	}
	app := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(app, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("package.json", `{"name":"empty-app","private":true,"type":"module"}`)
	// --offline: the client has no dependency, so nothing but the tarball is installed.
	npm(t, app, "install", "--offline", "--no-package-lock", tarball)
	write("app.ts", packedApp)
	write("run.mjs", packedRun)
	tsc, err := filepath.Abs(filepath.Join(sdkDir, "node_modules", "typescript", "bin", "tsc"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, tsc, "--strict", "--noEmit", "--target", "es2022", "--module", "nodenext",
		"--lib", "es2022,dom", "app.ts")
	cmd.Dir = app
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tsc --strict on an app using the packed client: %v\n%s", err, out)
	}
	cmd = exec.Command(node, "run.mjs")
	cmd.Dir = app
	out2, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out2)) != "ok" {
		t.Fatalf("node run.mjs: %v\n%s", err, out2)
	}
	files := npm(t, filepath.Join(app, "node_modules", "@spoolcast", "client"), "pack", "--dry-run", "--json")
	for _, unwanted := range []string{"src/", "test/", "dist-test", "tsconfig"} {
		if strings.Contains(files, unwanted) {
			t.Errorf("the tarball holds %s:\n%s", unwanted, files)
		}
	}
}

// packedApp uses the public surface as an app would; tsc must accept it.
const packedApp = `import {
  SpoolcastClient, RateLimitedError, InvalidCursorError, SpoolcastError,
  type Notification, type StreamStatus, type Subscription, type Page, type Preferences, type Device, type ResetInfo,
} from "@spoolcast/client";

const client = new SpoolcastClient({ baseUrl: "http://127.0.0.1:9", token: async () => "token", transport: "sse" });
// A browser's WebSocket class is one the client takes.
export const browser = () => new SpoolcastClient({ baseUrl: "https://api.example.com", token: () => "t", WebSocket, transport: "auto", appVersion: "1.4.2" });
export async function page(): Promise<Notification[]> {
  const p: Page = await client.notifications.list({ limit: 20, cursor: null });
  return p.hasMore ? p.data : [];
}
export async function rest(): Promise<number> {
  await client.notifications.markRead("id");
  const { readThrough } = await client.notifications.markAllRead();
  const prefs: Preferences = await client.preferences.update({ quietHours: null, categories: { sdk: { push: false } } });
  const device: Device = await client.devices.registerExpo("ExponentPushToken[x]", "ios");
  return (await client.notifications.unreadCount()).count + (readThrough ? 1 : 0) + Object.keys(prefs.categories).length + (device.enabled ? 1 : 0);
}
const sub: Subscription = client.subscribe({
  cursor: null,
  onNotification(n: Notification, info: { cursor: string }) { void n.createdAt.length; void info.cursor; },
  onStatus(s: StreamStatus) { if (s.state === "connected" && !s.resumed) void page(); },
  onReset(r: ResetInfo) { void r.cursor; },
});
export function classify(err: unknown): number {
  if (err instanceof RateLimitedError) return err.retryAfter ?? 0;
  if (err instanceof InvalidCursorError) return -1;
  return err instanceof SpoolcastError ? err.status : 0;
}
sub.close();
client.close();
`

// packedRun imports the installed package and uses it without a server.
const packedRun = `import { SpoolcastClient, RateLimitedError, ClientClosedError } from "@spoolcast/client";
const client = new SpoolcastClient({ baseUrl: "http://127.0.0.1:9", token: () => "t", transport: "sse" });
const statuses = [];
const sub = client.subscribe({ onNotification() {}, onStatus: (s) => statuses.push(s.state) });
sub.close();
client.close();
const closed = await client.notifications.list().catch((e) => e);
const ok = closed instanceof ClientClosedError && new RateLimitedError("x", { code: "rate-limited" }) instanceof Error && statuses.at(-1) === "disconnected";
console.log(ok ? "ok" : JSON.stringify({ statuses, closed: String(closed) }));
`
