// The full page: three tabs (All, Unread, Archived), each its own list of
// the store, kept live, with the counts beside their names; mark all read
// and archive all; an infinite scroll per list; loading that never flashes
// (nothing for a fast first page, skeletons only past SKELETON_DELAY) and an
// empty state only once a list is known to be empty; arrivals said in the
// live region. Tabs follow the WAI-ARIA pattern: arrow keys, Home and End
// move between them (the selected one is the only tab stop), each controls
// its tabpanel.

import type { NotificationStatus, StreamStatus } from "@spoolcast/client";
import type { FeedState } from "@spoolcast/react/store";
import { ItemList, onceATurn, type View } from "./items.js";

/** A first page slower than this shows skeletons; a faster one shows nothing until it is in (ms). */
const SKELETON_DELAY = 300;

interface Tab {
  status: NotificationStatus;
  tab: HTMLButtonElement;
  panel: HTMLElement;
  list: ItemList;
  empty: HTMLElement;
  more: HTMLElement;
  skeletons: HTMLElement;
  skeletonTimer?: ReturnType<typeof setTimeout>;
  release?: () => void;
  last?: FeedState;
}

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

/** shownCount writes a count ("99+" when capped) into el, hidden at zero. */
export function shownCount(el: HTMLElement, c: { count: number; capped: boolean }, loading: boolean): string {
  const text = c.capped ? "99+" : String(c.count);
  el.hidden = loading || c.count === 0;
  el.textContent = el.hidden ? "" : text; // nothing to read out when hidden
  return text;
}

/** reason is what the server said of a refusal (its problem's detail), else the error's message. */
export const reason = (err: unknown) => {
  const e = err as { problem?: { detail?: string }; message?: string } | null;
  return e?.problem?.detail ?? e?.message ?? String(err);
};

/** mountPage draws the page for a signed-in session; the function it returns takes it down (sign-out). */
export function mountPage(view: View): () => void {
  const { store } = view;
  const ids: [NotificationStatus, string, string][] = [
    ["all", "", ""],
    ["unread", "-unread", "-unread"],
    ["archived", "-archived", "-archived"],
  ];
  const tabs: Tab[] = ids.map(([status, list, rest]) => {
    const panel = $(`panel-${status}`);
    return {
      status,
      tab: $<HTMLButtonElement>(`tab-${status}`),
      panel,
      list: new ItemList($<HTMLUListElement>(`feed${list}`), view),
      empty: $(`empty${rest}`),
      more: $(`more${rest}`),
      skeletons: panel.querySelector<HTMLElement>(".skeletons")!,
    };
  });
  let current = tabs[0]!;
  const releases = [store.hold("status"), store.hold("counts")];

  // ---- tabs -------------------------------------------------------------------

  function select(tab: Tab, focus: boolean) {
    current = tab;
    for (const t of tabs) {
      const on = t === tab;
      t.tab.setAttribute("aria-selected", String(on));
      t.tab.tabIndex = on ? 0 : -1;
      t.panel.hidden = !on;
    }
    // A list is read when its tab is first shown, and kept live from then on.
    tab.release ??= store.hold(`feed:${tab.status}`);
    $("archive-all").hidden = tab.status === "archived";
    if (focus) tab.tab.focus();
    render();
  }

  const onKey = (event: KeyboardEvent) => {
    const i = tabs.indexOf(current);
    const to = { ArrowRight: i + 1, ArrowLeft: i - 1 + tabs.length, Home: 0, End: tabs.length - 1 }[event.key];
    if (to === undefined) return;
    event.preventDefault();
    select(tabs[to % tabs.length]!, true);
  };
  const onClicks = tabs.map((t) => () => select(t, false));
  tabs.forEach((t, i) => t.tab.addEventListener("click", onClicks[i]!));
  $("tabs").addEventListener("keydown", onKey);

  const readAll = () => view.act(store.markAllRead(), "mark all read");
  const archiveAll = () => view.act(store.archiveAll(), "archive all");
  $("read-all").addEventListener("click", readAll);
  $("archive-all").addEventListener("click", archiveAll);

  // ---- infinite scroll ----------------------------------------------------------

  const visible = (el: HTMLElement) => {
    const r = el.getBoundingClientRect();
    return !el.closest("[hidden]") && r.top < window.innerHeight && r.bottom > 0;
  };
  const more = (t: Tab) => {
    const f = store.getFeed(t.status);
    if (!f.loading && !f.loadingMore && f.hasMore && !f.error) void store.loadMore(t.status);
  };
  const observer = new IntersectionObserver((entries) => {
    for (const e of entries) {
      const t = tabs.find((t) => t.more === e.target);
      if (e.isIntersecting && t) more(t);
    }
  });
  for (const t of tabs) observer.observe(t.more);

  // ---- drawing --------------------------------------------------------------------

  const unsubscribe = store.subscribe(onceATurn(() => render()));

  function renderTab(t: Tab) {
    if (!t.release) return;
    const f = store.getFeed(t.status);
    const before = t.last;
    // What any list showed before this render (All is drawn first, so each list's last is its previous one).
    const shownBefore = new Set<string>();
    if (t.status === "all") for (const u of tabs) for (const n of u.last?.items ?? []) shownBefore.add(n.id);
    t.last = f;
    const added = t.list.render(f.items, t.panel);
    // Arrivals: what joins a list that was in, not by its own next page, and was in no list before.
    if (t.status === "all" && before && !before.loading && !before.loadingMore && added.size) {
      const arrived = [...added].filter((id) => !shownBefore.has(id));
      t.list.highlight(arrived);
      const first = f.items.find((n) => n.id === arrived[0]);
      if (first) view.announce(arrived.length === 1 ? `New notification: ${first.title}` : `${arrived.length} new notifications`);
    }
    const waiting = f.loading && f.items.length === 0;
    t.panel.setAttribute("aria-busy", String(f.loading || f.loadingMore));
    if (waiting && !t.skeletons.hidden) {
      // shown already
    } else if (waiting) {
      t.skeletonTimer ??= setTimeout(() => {
        const now = store.getFeed(t.status);
        if (now.loading && now.items.length === 0) showSkeletons(t);
      }, SKELETON_DELAY);
    } else {
      clearTimeout(t.skeletonTimer);
      t.skeletonTimer = undefined;
      t.skeletons.hidden = true;
    }
    t.empty.hidden = f.loading || f.items.length > 0 || !!f.error;
    t.more.textContent = f.error
      ? f.loading
        ? `Could not load: ${reason(f.error)}. Trying again…`
        : `Could not load more: ${reason(f.error)}.`
      : f.loadingMore
        ? "Loading…"
        : !f.loading && !f.hasMore && f.items.length
          ? "That's everything."
          : "";
  }

  function showSkeletons(t: Tab) {
    t.skeletons.replaceChildren(
      ...Array.from({ length: 3 }, () => {
        const s = document.createElement("div");
        s.className = "skeleton";
        return s;
      }),
    );
    t.skeletons.hidden = false;
  }

  function render() {
    for (const t of tabs) renderTab(t);
    const c = store.getCounts();
    const unread = shownCount($("badge"), c.unread, c.loading);
    shownCount($("archived-count"), c.archived, c.loading);
    document.title = !c.loading && c.unread.count ? `(${unread}) Inbox · spoolcast` : "Inbox · spoolcast";
    showStatus(store.getStatus());
    // A short page may not fill the screen: the next one, while the end is in view.
    if (visible(current.more)) more(current);
  }

  select(current, false);
  return () => {
    unsubscribe();
    observer.disconnect();
    for (const t of tabs) {
      clearTimeout(t.skeletonTimer);
      t.release?.();
      t.list.render([]);
      t.skeletons.hidden = true;
      t.empty.hidden = true;
      t.more.textContent = "";
      t.tab.removeEventListener("click", onClicks[tabs.indexOf(t)]!);
    }
    $("tabs").removeEventListener("keydown", onKey);
    $("read-all").removeEventListener("click", readAll);
    $("archive-all").removeEventListener("click", archiveAll);
    for (const r of releases) r();
    $("badge").hidden = $("archived-count").hidden = true;
    document.title = "Inbox · spoolcast";
    select0(tabs); // the next sign-in starts on All
  };
}

/** select0 shows the All tab again, without holding anything (after a sign-out). */
function select0(tabs: Tab[]) {
  tabs.forEach((t, i) => {
    t.tab.setAttribute("aria-selected", String(i === 0));
    t.tab.tabIndex = i === 0 ? 0 : -1;
    t.panel.hidden = i !== 0;
  });
}

/** showStatus says the stream's state: live, reconnecting, or offline (before the first connection, and when it cannot be had). */
export function showStatus(s: StreamStatus | null) {
  const el = $("status");
  const state = !s ? "offline" : s.state === "connected" ? "live" : s.state === "connecting" && s.reason !== "connect" ? "reconnecting" : s.state === "disconnected" ? "offline" : el.dataset.state!;
  el.dataset.state = state;
  el.textContent = state;
}
