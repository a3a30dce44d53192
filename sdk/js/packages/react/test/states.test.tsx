// The hooks' tabs and counts against real replicas: useNotifications({status})
// gives each tab its own list, and a change made in one session (an
// archive, a mark unread, archive-all) moves the notification between
// another session's lists live, through another replica, in feed order,
// with useCounts following; marks shown at once and put back when refused;
// and a session away from the stream (its hooks unmounted, the provider
// kept) gets the changes made meanwhile replayed once, without reading a
// page again.
import assert from "node:assert/strict";
import { after, afterEach, describe, test } from "node:test";
import type { ReactNode } from "react";
import { closeDom } from "./dom.ts";
import { WebSocket } from "ws";
import { NetworkError, SpoolcastClient, type NotificationStatus } from "@spoolcast/client";
import { SpoolcastProvider, useCounts, useNotifications, type NotificationsResult } from "@spoolcast/react";
import { emit, env, mint, needsStates, range, user, waitFor } from "../../client/test/harness.ts";

const { act, cleanup, render } = await import("@testing-library/react");

afterEach(() => cleanup());
after(() => closeDom());

/** A client of user u over the ws package's WebSocket, through baseUrl (the proxy, or one replica's own address). */
function open(u: string, baseUrl = env.base, fetch?: typeof globalThis.fetch): SpoolcastClient {
  return new SpoolcastClient({ baseUrl, token: () => mint(u), transport: "websocket", WebSocket, ...(fetch ? { fetch } : {}) });
}

/** Each tab's hook, by status and session, for the test to call the marks. */
type Hooks = Partial<Record<NotificationStatus, NotificationsResult>>;

function Tab({ status, hooks }: { status: NotificationStatus; hooks: Hooks }) {
  const feed = useNotifications({ status });
  hooks[status] = feed;
  return (
    <ul data-status={status}>
      {feed.items.map((n) => (
        <li key={n.id} className={n.readAt ? "read" : "unread"}>
          {n.title}
        </li>
      ))}
    </ul>
  );
}

function Counts() {
  const c = useCounts();
  const show = (x: { count: number; capped: boolean }) => (x.capped ? "99+" : String(x.count));
  return <span id="counts">{c.loading ? "…" : `unread ${show(c.unread)} unseen ${show(c.unseen)} archived ${show(c.archived)}`}</span>;
}

function Inbox({ hooks, tabs = ["all", "unread", "archived"] }: { hooks: Hooks; tabs?: NotificationStatus[] }) {
  return (
    <>
      <Counts />
      {tabs.map((s) => (
        <Tab key={s} status={s} hooks={hooks} />
      ))}
    </>
  );
}

/** show renders children under a provider of client, and reads what it shows. */
function show(client: SpoolcastClient, children: ReactNode) {
  const view = render(<SpoolcastProvider client={client} pageSize={10}>{children}</SpoolcastProvider>);
  const q = (sel: string) => [...view.container.querySelectorAll(sel)].map((e) => e.textContent ?? "");
  return {
    view,
    tab: (s: NotificationStatus) => q(`ul[data-status="${s}"] li`),
    unread: (s: NotificationStatus) => q(`ul[data-status="${s}"] li.unread`),
    counts: () => view.container.querySelector("#counts")?.textContent ?? "",
  };
}

type Shown = ReturnType<typeof show>;

const describeShown = (s: Shown) =>
  `all ${JSON.stringify(s.tab("all"))}, unread ${JSON.stringify(s.tab("unread"))}, archived ${JSON.stringify(s.tab("archived"))}, ${s.counts()}`;

async function waitShown(what: string, s: Shown, cond: (s: Shown) => boolean, timeoutMs?: number) {
  await waitFor(what, () => cond(s), timeoutMs).catch((err: Error) => {
    throw new Error(`${err.message} (shows ${describeShown(s)})`);
  });
}

const join = (xs: string[]) => xs.join(",");

describe("the hooks' tabs against real replicas", needsStates, () => {
  test("an archive in one session leaves All and Unread and joins Archived in feed order in another session, through another replica, and the counts follow", async (t) => {
    const u = user("tabs");
    await emit(u, ...range("t", 1, 5)); // t5 the newest
    const mine = open(u); // through the proxy: replica 0
    const theirs = open(u, env.replicas[1]); // another session, on replica 1
    t.after(() => (mine.close(), theirs.close()));
    let subscriptions = 0;
    const subscribe = mine.subscribe.bind(mine);
    mine.subscribe = (o) => (subscriptions++, subscribe(o));
    const me: Hooks = {};
    const them: Hooks = {};
    const a = show(mine, <Inbox hooks={me} />);
    const b = show(theirs, <Inbox hooks={them} />);
    for (const s of [a, b]) {
      await waitShown("the three tabs", s, (s) => join(s.tab("all")) === "t5,t4,t3,t2,t1" && join(s.tab("unread")) === "t5,t4,t3,t2,t1" && s.tab("archived").length === 0);
      await waitShown("the counts", s, (s) => s.counts() === "unread 5 unseen 5 archived 0");
    }
    // Ids by title, taken while every one is in All.
    const ids = new Map(me.all!.items.map((n) => [n.title, n.id]));
    const id = (title: string) => ids.get(title)!;

    // Archived in b: at once there, live in a.
    let done!: Promise<void>;
    act(() => void (done = them.all!.archive(id("t4"))));
    assert.deepEqual([b.tab("all"), b.tab("archived")], [["t5", "t3", "t2", "t1"], ["t4"]], "at once where it was asked");
    await act(() => done);
    await waitShown("t4 gone from All and Unread, in Archived", a, (s) => join(s.tab("all")) === "t5,t3,t2,t1" && join(s.tab("unread")) === "t5,t3,t2,t1" && join(s.tab("archived")) === "t4");
    await waitShown("the counts following", a, (s) => s.counts() === "unread 4 unseen 4 archived 1");

    // Two more archived, older and newer: Archived keeps feed order, not the order archived.
    await act(() => them.all!.archive(id("t2")));
    await act(() => them.all!.archive(id("t5")));
    await waitShown("Archived in feed order", a, (s) => join(s.tab("archived")) === "t5,t4,t2" && join(s.tab("all")) === "t3,t1");
    // A read in a, an unarchive in b: the unarchived one comes back to its place, read.
    await act(() => me.archived!.markRead(id("t4")));
    await act(() => them.archived!.unarchive(id("t4")));
    await waitShown("t4 back in All at its place, read, not in Unread", a, (s) => join(s.tab("all")) === "t4,t3,t1" && join(s.unread("all")) === "t3,t1" && join(s.tab("unread")) === "t3,t1" && join(s.tab("archived")) === "t5,t2");
    await act(() => them.all!.markUnread(id("t4")));
    await waitShown("t4 unread again, back in Unread at its place", a, (s) => join(s.tab("unread")) === "t4,t3,t1" && s.counts() === "unread 3 unseen 3 archived 2");

    // A live arrival goes to All and Unread, not Archived.
    await emit(u, "t6");
    await waitShown("t6 at the top of All and Unread", a, (s) => join(s.tab("all")) === "t6,t4,t3,t1" && join(s.tab("unread")) === "t6,t4,t3,t1" && join(s.tab("archived")) === "t5,t2");
    await waitShown("the counts with it", a, (s) => s.counts() === "unread 4 unseen 4 archived 2");

    // Archive-all in b: everything leaves a's All at once it reaches it.
    await act(() => them.all!.archiveAll());
    await waitShown("All and Unread empty, Archived whole", a, (s) => s.tab("all").length === 0 && s.tab("unread").length === 0 && join(s.tab("archived")) === "t6,t5,t4,t3,t2,t1");
    await waitShown("the counts after archive-all", a, (s) => s.counts() === "unread 0 unseen 0 archived 6");
    // What the server says, each tab.
    for (const [status, want] of [["all", ""], ["unread", ""], ["archived", "t6,t5,t4,t3,t2,t1"]] as const) {
      assert.equal(join((await mine.notifications.list({ status })).data.map((n) => n.title)), want, status);
    }
    assert.deepEqual(b.tab("archived"), a.tab("archived"), "both sessions agree");
    assert.equal(subscriptions, 1, "three lists and the counts share one subscription");
  });

  test("marks are shown at once in every tab and put back when the server refuses, and markSeen zeroes unseen in every session", async (t) => {
    const u = user("marks");
    await emit(u, "m1", "m2", "m3");
    let fail = false;
    const failing: typeof fetch = async (input, init) => {
      if (fail && init?.method === "POST") throw new TypeError("fetch failed");
      return fetch(input, init);
    };
    const mine = open(u, env.base, failing);
    const theirs = open(u, env.replicas[1]);
    t.after(() => (mine.close(), theirs.close()));
    const me: Hooks = {};
    const them: Hooks = {};
    const a = show(mine, <Inbox hooks={me} />);
    const b = show(theirs, <Inbox hooks={them} tabs={["all"]} />);
    // Every tab loaded, All included: its items give the ids.
    await waitShown("three", a, (s) => join(s.tab("all")) === "m3,m2,m1" && join(s.tab("unread")) === "m3,m2,m1" && s.counts() === "unread 3 unseen 3 archived 0");
    const m2 = me.all!.items[1]!.id;

    fail = true;
    let refused!: Promise<unknown>;
    act(() => void (refused = me.unread!.archive(m2).catch((e: unknown) => e)));
    assert.deepEqual([a.tab("unread"), a.tab("archived")], [["m3", "m1"], ["m2"]], "moved at once");
    assert.ok((await refused) instanceof NetworkError);
    await waitShown("put back where it was", a, (s) => join(s.tab("unread")) === "m3,m2,m1" && s.tab("archived").length === 0 && s.counts() === "unread 3 unseen 3 archived 0");
    fail = false;

    await waitShown("b's count", b, (s) => s.counts() === "unread 3 unseen 3 archived 0");
    act(() => me.all!.markSeen());
    assert.match(a.counts(), /unseen 0/, "at once");
    await waitShown("unseen zero in the other session", b, (s) => s.counts() === "unread 3 unseen 0 archived 0");
    await emit(u, "m4");
    await waitShown("what comes after is unseen", b, (s) => s.counts() === "unread 4 unseen 1 archived 0");
  });

  test("a session away from the stream gets the changes made meanwhile replayed once, with no page read again", async (t) => {
    const u = user("away");
    await emit(u, ...range("w", 1, 4));
    const pages: string[] = [];
    const counting: typeof fetch = (input, init) => {
      if (/\/v1\/notifications(\?|$)/.test(String(input))) pages.push(String(input));
      return fetch(input, init);
    };
    const mine = open(u, env.base, counting);
    const theirs = open(u, env.replicas[1]);
    t.after(() => (mine.close(), theirs.close()));
    const me: Hooks = {};
    let shown = true;
    function App() {
      return <SpoolcastProvider client={mine} pageSize={10}>{shown ? <Inbox hooks={me} /> : null}</SpoolcastProvider>;
    }
    const view = render(<App />);
    const q = (status: NotificationStatus) => [...view.container.querySelectorAll(`ul[data-status="${status}"] li`)].map((e) => e.textContent ?? "");
    await waitFor("the tabs", () => join(q("all")) === "w4,w3,w2,w1" && q("archived").length === 0);
    assert.equal(pages.length, 3, `one first page per tab: ${pages}`);
    // Ids by title, taken while every one is in All.
    const ids = new Map(me.all!.items.map((n) => [n.title, n.id]));
    const id = (title: string) => ids.get(title)!;
    const [w1, w2, w3] = [id("w1"), id("w2"), id("w3")];

    // Unmounted: the provider's subscription closes, keeping its cursor and the lists.
    shown = false;
    view.rerender(<App />);
    await new Promise((r) => setTimeout(r, 50));
    await theirs.notifications.archive(w2);
    await theirs.notifications.markRead(w3);
    await emit(u, "w5");
    await theirs.notifications.archive(w1);

    shown = true;
    view.rerender(<App />);
    await waitFor(`the changes replayed (all ${JSON.stringify(q("all"))}, archived ${JSON.stringify(q("archived"))})`, () => join(q("all")) === "w5,w4,w3" && join(q("archived")) === "w2,w1");
    assert.deepEqual(me.all!.items.filter((n) => !n.readAt).map((n) => n.title), ["w5", "w4"], "w3 read");
    assert.equal(join(q("unread")), "w5,w4");
    assert.equal(pages.length, 3, `no page read again: ${pages}`);
    assert.equal(new Set(me.all!.items.map((n) => n.id)).size, 3, "once each");
  });
});
