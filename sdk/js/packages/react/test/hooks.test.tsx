// The hooks in a DOM (happy-dom), rendered with Testing Library, against
// real central replicas behind one address (sdk/js/sdktest): the first
// page, a live arrival at the top once, loadMore, marks shown at once and
// put back when refused, another session's reads through the stream, one
// subscription under StrictMode, a refused cursor reloading the first
// page, and a restart of every replica with notifications posted while
// they were down, each rendered once, in order.
import assert from "node:assert/strict";
import { after, afterEach, describe, test } from "node:test";
import { StrictMode, type ReactNode } from "react";
import { closeDom } from "./dom.ts";
import { WebSocket } from "ws";
import { NetworkError, SpoolcastClient, type Subscription, type SubscribeOptions } from "@spoolcast/client";
import { SpoolcastProvider, useNotifications, useStreamStatus, useUnreadCount, type NotificationsResult } from "@spoolcast/react";
import { emit, env, foreignCursor, mint, proxy, range, replica, user, waitFor } from "../../client/test/harness.ts";

// After dom.ts: React DOM looks for a document as it loads.
const { act, cleanup, render } = await import("@testing-library/react");

afterEach(() => cleanup());
after(() => closeDom());

/** emitTogether writes one notification per title in one transaction, as ingest writes a batch: they share a created_at. */
async function emitTogether(u: string, ...titles: string[]) {
  const res = await fetch(env.control + "/emit-together", { method: "POST", body: JSON.stringify({ user: u, titles }) });
  if (!res.ok) throw new Error(`emit-together: HTTP ${res.status}: ${await res.text()}`);
}

const skip = env.control ? false : "no central: run through go test ./sdk/js/sdktest";

/** A real client of user u over the ws package's WebSocket; fetch, when given, sees every request. */
function open(u: string, fetch?: typeof globalThis.fetch): SpoolcastClient {
  return new SpoolcastClient({ baseUrl: env.base, token: () => mint(u), transport: "websocket", WebSocket, ...(fetch ? { fetch } : {}) });
}

/** subscriptions counts the client's subscriptions, opened and still open, and keeps the last one. */
function subscriptions(client: SpoolcastClient) {
  const counts = { opened: 0, open: 0, last: undefined as Subscription | undefined };
  const subscribe = client.subscribe.bind(client);
  client.subscribe = (o: SubscribeOptions) => {
    const sub = subscribe(o);
    counts.opened++;
    counts.open++;
    counts.last = sub;
    const close = sub.close.bind(sub);
    let closed = false;
    sub.close = () => {
      if (!closed) counts.open--;
      closed = true;
      close();
    };
    return sub;
  };
  return counts;
}

/** The hook's last result, for the test to call loadMore and the marks. */
const hook: { current?: NotificationsResult } = {};

function Feed() {
  const feed = useNotifications();
  hook.current = feed;
  return (
    <ul>
      {feed.items.map((n) => (
        <li key={n.id} data-id={n.id} className={n.readAt ? "read" : "unread"}>
          {n.title}
        </li>
      ))}
    </ul>
  );
}

function Bell() {
  const { count, capped, loading } = useUnreadCount();
  return <span id="badge">{loading ? "…" : capped ? "99+" : String(count)}</span>;
}

function Status() {
  const status = useStreamStatus();
  return <span id="status">{status ? `${status.state}/${status.reason}` : "none"}</span>;
}

/** show renders children under a provider of client (in StrictMode, as an app's root would be, when strict). */
function show(client: SpoolcastClient, children: ReactNode, { strict = false } = {}) {
  const tree = <SpoolcastProvider client={client} pageSize={10}>{children}</SpoolcastProvider>;
  const view = render(strict ? <StrictMode>{tree}</StrictMode> : tree);
  const $ = (sel: string) => view.container.querySelector(sel);
  return {
    view,
    titles: () => [...view.container.querySelectorAll("li")].map((li) => li.textContent ?? ""),
    unread: () => [...view.container.querySelectorAll("li.unread")].map((li) => li.textContent ?? ""),
    badge: () => $("#badge")?.textContent ?? "",
    status: () => $("#status")?.textContent ?? "",
  };
}

type Shown = ReturnType<typeof show>;

async function waitShown(what: string, shown: Shown, cond: (s: Shown) => boolean, timeoutMs?: number) {
  await waitFor(`${what} (shows ${JSON.stringify(shown.titles())}, unread ${JSON.stringify(shown.unread())}, badge ${shown.badge()}, status ${shown.status()})`, () => cond(shown), timeoutMs);
}

const once = (titles: string[]) => new Set(titles).size === titles.length;

test("a hook outside a <SpoolcastProvider> says where it must be", () => {
  function Lonely() {
    useUnreadCount();
    return null;
  }
  const error = console.error;
  console.error = () => {}; // React reports the error too
  try {
    assert.throws(() => render(<Lonely />), /useUnreadCount must be used inside <SpoolcastProvider>/);
  } finally {
    console.error = error;
  }
});

describe("the hooks against real replicas", { skip }, () => {
  test("useNotifications shows the first page, a notification emitted now at the top once, loadMore appends the next pages without duplicates, and markAllRead shows all read at once", async (t) => {
    const u = user("feed");
    await emit(u, ...range("p", 10, 34)); // 25, p10 the oldest
    const client = open(u);
    t.after(() => client.close());
    const shown = show(client, <><Bell /><Feed /></>);
    await waitShown("the first page", shown, (s) => s.titles().length === 10);
    assert.deepEqual(shown.titles(), range("p", 25, 34).reverse());
    assert.equal(hook.current!.hasMore, true);
    await waitShown("the count", shown, (s) => s.badge() === "25");

    await emit(u, "live");
    await waitShown("the live one at the top", shown, (s) => s.titles()[0] === "live");
    await waitShown("the count with it", shown, (s) => s.badge() === "26");
    assert.deepEqual(shown.titles(), ["live", ...range("p", 25, 34).reverse()]);

    const more = hook.current!.loadMore();
    assert.equal(hook.current!.loadMore(), more, "a second call while the page is on its way shares it");
    await act(() => more);
    assert.deepEqual(shown.titles(), ["live", ...range("p", 15, 34).reverse()]);
    await act(() => hook.current!.loadMore());
    assert.deepEqual(shown.titles(), ["live", ...range("p", 10, 34).reverse()]);
    assert.equal(hook.current!.hasMore, false);
    assert.ok(once(shown.titles()));
    await act(() => hook.current!.loadMore()); // nothing more: no change
    assert.equal(shown.titles().length, 26);

    let all!: Promise<void>;
    act(() => void (all = hook.current!.markAllRead()));
    assert.deepEqual([shown.unread().length, shown.badge()], [0, "0"], "all read at once");
    await act(() => all);
    assert.equal((await client.notifications.unreadCount()).count, 0);
  });

  test("markRead shows the item read and the count lower at once, puts both back when refused, and another session's marks arrive through the stream", async (t) => {
    const u = user("marks");
    await emit(u, "a1", "a2", "a3");
    // Holds each mark's request until the test lets it go, or fails it.
    let gate: { release(): void; fail(): void } | undefined;
    const held: typeof fetch = async (input, init) => {
      if (init?.method === "POST" && String(input).endsWith("/read")) {
        const go = await new Promise<boolean>((resolve) => (gate = { release: () => resolve(true), fail: () => resolve(false) }));
        if (!go) throw new TypeError("fetch failed");
      }
      return fetch(input, init);
    };
    const client = open(u, held);
    const other = open(u);
    t.after(() => (client.close(), other.close()));
    const shown = show(client, <><Bell /><Feed /></>);
    await waitShown("three unread", shown, (s) => s.unread().length === 3 && s.badge() === "3");
    const [a3, a2, a1] = hook.current!.items.map((n) => n.id);

    let marked!: Promise<void>;
    act(() => void (marked = hook.current!.markRead(a3!)));
    await waitFor("the request on its way", () => gate !== undefined);
    assert.deepEqual(shown.unread(), ["a2", "a1"], "read at once, before the server answers");
    assert.equal(shown.badge(), "2");
    gate!.release();
    await act(() => marked);
    assert.equal((await other.notifications.unreadCount()).count, 2, "the server has it");

    gate = undefined;
    let refused!: Promise<unknown>;
    act(() => void (refused = hook.current!.markRead(a2!).catch((e: unknown) => e)));
    await waitFor("the second request", () => gate !== undefined);
    assert.deepEqual(shown.unread(), ["a1"]);
    gate!.fail();
    assert.ok((await refused) instanceof NetworkError, "the promise rejects with the SDK's error");
    await waitShown("a2 unread again", shown, (s) => s.unread().join() === "a2,a1" && s.badge() === "2");

    await other.notifications.markRead(a2!);
    await waitShown("another session's mark", shown, (s) => s.unread().join() === "a1" && s.badge() === "1");
    await other.notifications.markAllRead();
    await waitShown("another session's read-all", shown, (s) => s.unread().length === 0 && s.badge() === "0");
    assert.ok(a1);
  });

  test("under StrictMode every hook shares one subscription, which unmounting closes", async (t) => {
    const u = user("strict");
    await emit(u, "s1");
    const client = open(u);
    t.after(() => client.close());
    const subs = subscriptions(client);
    const shown = show(
      client,
      <>
        <Status />
        <Bell />
        <Feed />
        <Bell />
        <Feed />
      </>,
      { strict: true },
    );
    await waitShown("connected, the page and the count", shown, (s) => s.status() === "connected/ready" && s.titles().length === 2 && s.badge() === "1");
    assert.deepEqual({ opened: subs.opened, open: subs.open }, { opened: 1, open: 1 }, "one subscription for five hooks, mounted twice");

    await emit(u, "s2");
    await waitShown("the arrival in both lists", shown, (s) => s.titles().join() === "s2,s1,s2,s1" && s.badge() === "2");
    shown.view.unmount();
    await waitFor("the subscription closed", () => subs.open === 0 && subs.last?.status.state === "disconnected");
    assert.equal(subs.opened, 1);
    assert.equal((await client.notifications.unreadCount()).count, 2, "the client is the app's: still open");
  });

  test("a cursor the server refuses resets the stream, and useNotifications loads the first page again", async (t) => {
    const u = user("reset");
    await emit(u, "b1", "b2");
    let firstPages = 0;
    const counting: typeof fetch = (input, init) => {
      if (/\/v1\/notifications\?limit=10$/.test(String(input))) firstPages++;
      return fetch(input, init);
    };
    const client = open(u, counting);
    t.after(() => client.close());
    const subs = subscriptions(client);
    const shown = show(client, <><Status /><Bell /><Feed /></>);
    await waitShown("the first page", shown, (s) => s.titles().join() === "b2,b1" && s.status() === "connected/ready");
    assert.equal(firstPages, 1);

    // As if the database were restored while the app was away: the cursor
    // the stream resumes from is one of another history.
    (subs.last as { cursor: string | null }).cursor = await foreignCursor();
    await proxy.drop();
    await emit(u, "b3");
    await waitFor("the first page again", () => firstPages === 2);
    await waitShown("the three once each", shown, (s) => s.titles().join() === "b3,b2,b1" && s.badge() === "3" && s.status() === "connected/ready");
    assert.equal(subs.opened, 1, "the same subscription, reset");
    await emit(u, "b4");
    await waitShown("live after the reset", shown, (s) => s.titles().join() === "b4,b3,b2,b1" && s.badge() === "4");
  });

  test("notifications written in one transaction share a created_at, and are shown in the feed's order, paged and live", async (t) => {
    const u = user("together");
    await emitTogether(u, ...range("g", 10, 21));
    const client = open(u);
    t.after(() => client.close());
    const shown = show(client, <><Status /><Feed /></>);
    await waitShown("the first page", shown, (s) => s.titles().length === 10 && s.status() === "connected/ready");
    await act(() => hook.current!.loadMore());
    await emitTogether(u, ...range("h", 10, 21));
    await waitShown("the second batch, live", shown, (s) => s.titles().length === 24);
    const feed = (await client.notifications.list({ limit: 100 })).data.map((n) => n.title);
    assert.deepEqual(feed, [...range("h", 10, 21).reverse(), ...range("g", 10, 21).reverse()], "the feed lists a batch in the order it was written, newest first");
    assert.deepEqual(shown.titles(), feed);
  });

  test("across a restart of every replica, notifications posted while they were down are rendered once each, in order", async (t) => {
    const u = user("restart");
    const client = open(u);
    t.after(() => client.close());
    const shown = show(client, <><Status /><Bell /><Feed /></>);
    await waitShown("live", shown, (s) => s.status() === "connected/ready" && s.badge() === "0");
    await emit(u, "r1", "r2");
    await waitShown("two", shown, (s) => s.titles().join() === "r2,r1");

    await Promise.all([replica.stop(0), replica.stop(1)]);
    await waitShown("reconnecting", shown, (s) => s.status().startsWith("connecting/"));
    await emit(u, "r3", "r4", "r5"); // through the third replica, while the app's two are down
    await Promise.all([replica.start(0), replica.start(1)]);
    await emit(u, "r6");
    await waitShown("all six", shown, (s) => s.titles().length === 6 && s.status() === "connected/ready", 30_000);
    assert.deepEqual(shown.titles(), range("r", 1, 6).reverse());
    await waitShown("the count", shown, (s) => s.badge() === "6");
    const feed = (await client.notifications.list({ limit: 100 })).data.map((n) => n.title);
    assert.deepEqual(shown.titles(), feed, "what is shown is the feed");
  });
});
