package sdktest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// pack runs `npm pack` in the workspace package pkg and returns the tarball's path.
func pack(t *testing.T, pkg, dest string) string {
	t.Helper()
	out := npm(t, filepath.Join(sdkDir, "packages", pkg), "pack", "--pack-destination", dest)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	tarball := filepath.Join(dest, strings.TrimSpace(lines[len(lines)-1]))
	if _, err := os.Stat(tarball); err != nil {
		t.Fatalf("npm pack printed %q: %v", out, err)
	}
	return tarball
}

// reactPackages are React and its types as the workspace installed them:
// what an app brings to the hooks, its peer dependency.
var reactPackages = []string{"react", "react-dom", "scheduler", "@types/react", "@types/react-dom", "csstype"}

// `npm pack` makes tarballs of both packages that install into an empty
// project, where they import and run (the hooks rendered by React's
// server renderer), and where tsc --strict accepts an app using the
// client, an app using the hooks, and every ts and tsx block of
// docs/apps.md, whose React and Expo bells stay under 30 lines.
func TestThePackedPackagesInstallIntoAnEmptyProject(t *testing.T) {
	if testing.Short() {
		t.Skip("runs npm and node")
	}
	node := built(t)
	packs := t.TempDir()
	client, react := pack(t, "client", packs), pack(t, "react", packs)
	app := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(app, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("package.json", `{"name":"empty-app","private":true,"type":"module"}`)
	// --offline: the client has no dependency, and React, the hooks' peer,
	// is copied from the workspace below (--legacy-peer-deps: npm does not
	// fetch it), so nothing but the tarballs is installed.
	npm(t, app, "install", "--offline", "--no-package-lock", "--legacy-peer-deps", client, react)
	for _, pkg := range reactPackages {
		if err := os.CopyFS(filepath.Join(app, "node_modules", pkg), os.DirFS(filepath.Join(sdkDir, "node_modules", pkg))); err != nil {
			t.Fatal(err)
		}
	}
	tsc, err := filepath.Abs(filepath.Join(sdkDir, "node_modules", "typescript", "bin", "tsc"))
	if err != nil {
		t.Fatal(err)
	}
	run := func(what string, args ...string) string {
		t.Helper()
		cmd := exec.Command(node, args...)
		cmd.Dir = app
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, out)
		}
		return strings.TrimSpace(string(out))
	}

	write("app.ts", packedApp)
	run("tsc --strict on an app using the packed client", tsc, "--strict", "--noEmit", "--target", "es2022", "--module", "nodenext",
		"--lib", "es2022,dom", "app.ts")
	if out := run("node run.mjs", writeThen(write, "run.mjs", packedRun)); out != "ok" {
		t.Fatalf("node run.mjs: %s", out)
	}

	// The hooks and the guide, as a bundler (Vite, Metro) resolves them.
	write("hooks.tsx", packedHooksApp)
	write("auth.ts", "// The app's sign-in, which the guide's blocks import.\nexport async function getToken(): Promise<string> {\n  return \"token\";\n}\n")
	write("stubs.d.ts", expoStubs)
	files := []string{"hooks.tsx", "auth.ts", "stubs.d.ts"}
	for _, b := range docBlocks(t, filepath.Join(sdkDir, "..", "..", "docs", "apps.md")) {
		write(b.name, b.text)
		files = append(files, b.name)
	}
	run("tsc --strict on the hooks and on docs/apps.md's blocks", append([]string{tsc, "--strict", "--noEmit", "--target", "es2022",
		"--module", "esnext", "--moduleResolution", "bundler", "--jsx", "react-jsx", "--lib", "es2022,dom", "--skipLibCheck"}, files...)...)
	if out := run("node run-react.mjs", writeThen(write, "run-react.mjs", packedReactRun)); out != "ok" {
		t.Fatalf("node run-react.mjs: %s", out)
	}

	for _, pkg := range []string{"client", "react"} {
		files := npm(t, filepath.Join(app, "node_modules", "@spoolcast", pkg), "pack", "--dry-run", "--json")
		for _, unwanted := range []string{"src/", "test/", "dist-test", "tsconfig"} {
			if strings.Contains(files, unwanted) {
				t.Errorf("the tarball of %s holds %s:\n%s", pkg, unwanted, files)
			}
		}
	}
}

func writeThen(write func(name, text string), name, text string) string {
	write(name, text)
	return name
}

// docBlock is a ts or tsx block of a document, as a file: named by its
// first line when that is a comment naming one (`// spoolcast.ts`, which
// other blocks import), else by its place.
type docBlock struct{ name, text string }

var fence = regexp.MustCompile("(?ms)^```(ts|tsx)\n(.*?)^```")

// docBlocks extracts the ts and tsx blocks of the Markdown file at path.
// The first two tsx blocks are the guide's bells: each must stay under 30
// lines.
func docBlocks(t *testing.T, path string) []docBlock {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`^// (\w+\.tsx?)\n`)
	var blocks []docBlock
	bells := 0
	for i, m := range fence.FindAllStringSubmatch(string(doc), -1) {
		lang, text := m[1], m[2]
		name := fmt.Sprintf("doc%02d.%s", i, lang)
		if n := named.FindStringSubmatch(text); n != nil {
			name = n[1]
		}
		if lang == "tsx" && bells < 2 {
			bells++
			if lines := strings.Count(text, "\n"); lines >= 30 {
				t.Errorf("%s: the bell in block %d takes %d lines; the guide promises under 30", path, i, lines)
			}
		}
		blocks = append(blocks, docBlock{name, text})
	}
	if bells < 2 || len(blocks) < 4 {
		t.Fatalf("%s: %d blocks, %d of them bells; want the React and Expo bells and the rest", path, len(blocks), bells)
	}
	return blocks
}

// packedApp uses the public surface as an app would; tsc must accept it.
const packedApp = `import {
  SpoolcastClient, RateLimitedError, InvalidCursorError, SpoolcastError,
  type Notification, type StreamStatus, type Subscription, type Page, type Preferences, type Device, type ResetInfo,
  type Counts, type StateEvent,
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
  await client.notifications.markUnread("id");
  await client.notifications.archive("id");
  await client.notifications.unarchive("id");
  const { archivedThrough }: { archivedThrough: string | null } = await client.notifications.archiveAll();
  const counts: Counts = await client.notifications.counts({ archived: true });
  const archived: Page = await client.notifications.list({ status: "archived" });
  void [archivedThrough, counts.unseen.capped, counts.archived?.count, archived.data[0]?.archivedAt, archived.data[0]?.seenAt];
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
  onState(e: StateEvent, info: { cursor: string | null }) {
    if (e.type === "archived") void e.unarchived.length;
    if (e.type === "seen") void e.through;
    void info.cursor;
  },
  onRead(e) { void e.unread; },
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

// packedHooksApp uses the hooks' public surface as a React app would.
const packedHooksApp = `import { StrictMode, type ReactElement } from "react";
import { SpoolcastClient, type Notification, type StreamStatus } from "@spoolcast/client";
import {
  SpoolcastProvider, useNotifications, useUnreadCount, useCounts, useStreamStatus, useSpoolcastClient,
  type NotificationsResult, type NotificationsOptions, type UnreadState, type CountsState, type FeedState, type SpoolcastProviderProps,
} from "@spoolcast/react";

function Inbox(): ReactElement {
  const feed: NotificationsResult = useNotifications();
  const state: FeedState = feed;
  const options: NotificationsOptions = { status: "archived" };
  const archived: NotificationsResult = useNotifications(options);
  const counts: CountsState = useCounts();
  void archived.unarchive(state.items[0]?.id ?? "").catch(() => counts.archived.capped);
  const unread: UnreadState = useUnreadCount();
  const status: StreamStatus | null = useStreamStatus();
  const client: SpoolcastClient = useSpoolcastClient();
  const first: Notification | undefined = state.items[0];
  return (
    <div data-state={status?.state ?? "none"} onClick={() => void client.devices.list()}>
      {unread.loading ? "…" : unread.capped ? "99+" : unread.count}
      {feed.items.map((n) => <p key={n.id} onClick={() => feed.markRead(n.id).catch(() => {})}>{n.title}</p>)}
      {feed.hasMore && <button onClick={() => feed.loadMore()}>more</button>}
      <button onClick={() => feed.markAllRead()}>{first?.title}</button>
      {feed.error?.retryAfter}
    </div>
  );
}

const props: SpoolcastProviderProps = { client: new SpoolcastClient({ baseUrl: "https://api.example.com", token: () => "t" }), pageSize: 50 };
export const App = () => <StrictMode><SpoolcastProvider {...props}><Inbox /></SpoolcastProvider></StrictMode>;
`

// packedReactRun imports the installed hooks and renders them on the
// server (no effect runs there, so no stream opens).
const packedReactRun = `import { createElement } from "react";
import { renderToString } from "react-dom/server";
import { SpoolcastClient } from "@spoolcast/client";
import { SpoolcastProvider, useNotifications, useUnreadCount, useStreamStatus } from "@spoolcast/react";
const client = new SpoolcastClient({ baseUrl: "http://127.0.0.1:9", token: () => "t", transport: "sse" });
function Bell() {
  const { loading } = useUnreadCount();
  const { items } = useNotifications();
  const status = useStreamStatus();
  return createElement("b", null, [loading ? "loading" : "count", items.length, status === null ? "none" : status.state].join(" "));
}
const html = renderToString(createElement(SpoolcastProvider, { client }, createElement(Bell)));
client.close();
console.log(html === "<b>loading 0 none</b>" ? "ok" : html);
`

// expoStubs declares what the guide's Expo block uses of Expo and React
// Native, as they declare it, so that its types are checked without them.
const expoStubs = `declare module "expo-notifications" {
  export interface NotificationPermissionsStatus { granted: boolean; status: "granted" | "denied" | "undetermined"; canAskAgain: boolean }
  export interface ExpoPushToken { type: "expo"; data: string }
  export function requestPermissionsAsync(): Promise<NotificationPermissionsStatus>;
  export function getExpoPushTokenAsync(options?: { projectId?: string }): Promise<ExpoPushToken>;
  export interface NotificationContent { title: string | null; body: string | null; data: Record<string, any> }
  export interface NotificationRequest { identifier: string; content: NotificationContent }
  export interface Notification { date: number; request: NotificationRequest }
  export interface EventSubscription { remove(): void }
  export function getPresentedNotificationsAsync(): Promise<Notification[]>;
  export function dismissNotificationAsync(notificationIdentifier: string): Promise<void>;
  export function addNotificationReceivedListener(listener: (event: Notification) => void): EventSubscription;
}
declare module "react-native" {
  import type { ReactElement, ReactNode } from "react";
  export const Platform: { OS: "ios" | "android" | "macos" | "windows" | "web" };
  export function Text(props: { children?: ReactNode }): ReactElement;
}
`
