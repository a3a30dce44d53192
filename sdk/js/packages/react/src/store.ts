// The state one provider shares among its hooks: one subscription of the
// client, a list per tab (all, unread, archived) that live notifications
// and state changes are merged into, the counts and the stream's status.
// Hooks read it with useSyncExternalStore and hold it while mounted; the
// subscription opens with the first hold and closes a moment after the
// last release, so that React's StrictMode (mount, unmount, mount again)
// keeps one subscription instead of opening two. Nothing here is React's:
// a page without React (the inbox) drives the same store.
//
// It keeps the client's promise on the screen: a list's first page is
// loaded once the stream is connected (everything committed before is in
// it, everything after comes live), each id is shown once, in feed order,
// in every list it belongs to, and a cursor the server refused (onReset)
// loads the lists again. A change (a frame, or a mark of this session)
// moves a notification between lists at once: an archive takes it out of
// `all` and `unread` and puts it in `archived`, where it belongs in feed
// order. A page answers as of when it was read, so the changes that came
// while it was on its way are applied to it again (they are idempotent).

import type { Notification, NotificationStatus, SpoolcastClient, SpoolcastError, StateEvent, StreamStatus, Subscription } from "@spoolcast/client";
import { belongs, merge, micros } from "./order.js";
import type { CountsState, FeedState, Need, UnreadState } from "./state.js";

export type { CountsState, FeedState, Need, UnreadState } from "./state.js";

// The timers of every platform React runs on; declared here so that the
// package compiles without the DOM's types (it uses no DOM API).
declare function setTimeout(fn: () => void, ms?: number): unknown;
declare function clearTimeout(handle: unknown): void;

/** A count refresh waits this long after a change, so that a burst costs one request (ms). */
const COUNT_DELAY = 250;
/** The most a failed first page waits before it is tried again (ms), unless the server asks for longer. */
const PAGE_RETRY_MAX = 30_000;
/** The server's cap: counted up to this, `capped` past it. */
const CAP = 100;


/** The list's query: `all` is the feed's default, and asked as such. */
const statusQuery = (status: NotificationStatus) => (status === "all" ? {} : { status });

/** What each count counts, as the server does. */
const COUNTED = {
  unread: (n: Notification) => !n.readAt && !n.archivedAt,
  unseen: (n: Notification) => !n.seenAt && !n.archivedAt,
  archived: (n: Notification) => !!n.archivedAt,
} as const;
type CountName = keyof typeof COUNTED;

/** A state a change sets: read, archived or seen (a time), or not (null). */
type Field = "readAt" | "archivedAt" | "seenAt";

/** A change to notifications, kept while pages are on their way, to be applied again to what they bring. */
type Entry = { seq: number; change?: (n: Notification) => Notification; moved?: readonly Notification[]; arrived?: Notification };

/** One list (a tab) of the feed. */
interface List {
  status: NotificationStatus;
  feed: FeedState;
  /** The feed's cursor for the next (older) page. */
  nextCursor: string | null;
  /** The createdAt (micros) of the last page's last item: what is older comes with the next page, not live. */
  edge: number;
  /** A first page came: items older than edge wait for their page. */
  loaded: boolean;
  /** Bumped by a reload: answers to pages asked before it are dropped. */
  gen: number;
  first?: Promise<void>;
  more?: Promise<void>;
  retry?: unknown;
  retries: number;
}

/** Store is one provider's shared state. @internal */
export class Store {
  counts: CountsState = { unread: { count: 0, capped: false }, unseen: { count: 0, capped: false }, archived: { count: 0, capped: false }, loading: true, error: null };
  unread: UnreadState = { count: 0, capped: false, loading: true, error: null };
  status: StreamStatus | null = null;

  private readonly listeners = new Set<() => void>();
  private readonly lists = new Map<NotificationStatus, List>();
  private sub?: Subscription;
  /** Where the next subscription resumes: the last one's cursor. */
  private cursor: string | null = null;
  private holds = 0;
  private readonly needs = new Map<Need, number>();
  private closeTimer?: unknown;
  /** The changes since the oldest page still on its way was asked, and where each page started. */
  private log: Entry[] = [];
  private seq = 0;
  private readonly pending = new Set<{ from: number }>();
  private countTimer?: unknown;
  /** Bumped by each counts request and each change that moves a count: an answer older than either is dropped. */
  private countSeq = 0;
  /** The last mark of each notification still on its way to the server. */
  private readonly marking = new Map<string, Promise<void>>();

  constructor(
    readonly client: SpoolcastClient,
    private readonly pageSize: number,
  ) {}

  // ---- what hooks call ------------------------------------------------------

  subscribe = (listener: () => void): (() => void) => {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  };

  getFeed = (status: NotificationStatus = "all"): FeedState => this.list(status).feed;
  getCounts = (): CountsState => this.counts;
  getUnread = (): UnreadState => this.unread;
  getStatus = (): StreamStatus | null => this.status;

  /** hold is a mounted hook's claim: the subscription stays open until every claim is released. */
  hold(need: Need): () => void {
    this.holds++;
    this.needs.set(need, (this.needs.get(need) ?? 0) + 1);
    if (this.closeTimer !== undefined) {
      clearTimeout(this.closeTimer);
      this.closeTimer = undefined;
    }
    if (!this.sub) {
      this.open();
    } else if (this.status?.state === "connected" || this.status?.reason === "fatal") {
      // The stream is live already: a page read now misses nothing.
      const list = need.startsWith("feed:") ? this.list(need.slice(5) as NotificationStatus) : undefined;
      if (list?.feed.loading) void this.loadFirst(list);
      if (need === "count" || need === "counts") this.refreshCounts(0);
    }
    let held = true;
    return () => {
      if (!held) return;
      held = false;
      this.holds--;
      this.needs.set(need, this.needs.get(need)! - 1);
      // Later, not now: StrictMode releases and holds again at once.
      if (this.holds === 0) this.closeTimer = setTimeout(() => this.close());
    };
  }

  /** loadMore loads the page after the last one of a list; concurrent calls share it. Failures are in the list's `error`. */
  loadMore = (status: NotificationStatus = "all"): Promise<void> => {
    const list = this.list(status);
    if (list.more) return list.more;
    if (list.feed.loading || !list.feed.hasMore || !list.nextCursor) return Promise.resolve();
    const gen = list.gen;
    const cursor = list.nextCursor;
    const req = this.begin();
    this.setFeed(list, { loadingMore: true });
    const p = this.client.notifications
      .list({ limit: this.pageSize, cursor, ...statusQuery(status) })
      .then(
        (page) => {
          if (gen !== list.gen) return;
          list.nextCursor = page.nextCursor;
          const edge = page.data.length ? micros(page.data.at(-1)!) : list.edge;
          // What is shown is as recent as anything: the page only adds.
          const more = this.replay(page.data, req.from, status, page.hasMore, edge);
          list.edge = edge;
          this.setFeed(list, { items: merge(list.feed.items, more, false), hasMore: page.hasMore, error: null });
        },
        (err: SpoolcastError) => {
          if (gen === list.gen) this.setFeed(list, { error: err });
        },
      )
      .finally(() => {
        this.end(req);
        if (list.more === p) list.more = undefined;
        if (gen === list.gen) this.setFeed(list, { loadingMore: false });
      });
    list.more = p;
    return p;
  };

  /** markRead shows the notification read at once (out of the Unread tab, the counts following), then tells the server; refused, it is put back and the error thrown. */
  markRead = (id: string): Promise<void> => this.mark(id, "readAt", true, () => this.client.notifications.markRead(id));
  /** markUnread shows it unread at once, then tells the server; refused, it is put back and the error thrown. */
  markUnread = (id: string): Promise<void> => this.mark(id, "readAt", false, () => this.client.notifications.markUnread(id));
  /** archive moves it to the Archived tab at once, then tells the server; refused, it is put back and the error thrown. */
  archive = (id: string): Promise<void> => this.mark(id, "archivedAt", true, () => this.client.notifications.archive(id));
  /** unarchive moves it back at once, then tells the server; refused, it is put back and the error thrown. */
  unarchive = (id: string): Promise<void> => this.mark(id, "archivedAt", false, () => this.client.notifications.unarchive(id));

  /**
   * markAllRead shows everything read and the unread count at zero at once,
   * then tells the server, which covers what had committed when it is
   * asked; what arrives meanwhile stays as the stream says. If the server
   * refuses, what was shown is put back and the error thrown.
   */
  markAllRead = (): Promise<void> => this.markAll("readAt", ["unread"], () => this.client.notifications.markAllRead());

  /** archiveAll moves everything to the Archived tab at once, then tells the server; refused, it is all put back and the error thrown. */
  archiveAll = (): Promise<void> => this.markAll("archivedAt", ["unread", "unseen"], () => this.client.notifications.archiveAll());

  /**
   * markSeen tells the server the user has seen everything delivered so far
   * (a bell opened), so that pushes of it may be suppressed: the unseen
   * count goes to zero at once, and every session of the user follows.
   */
  markSeen = (): void => {
    if (!this.sub) return;
    this.sub.seen();
    const at = new Date().toISOString();
    this.apply((n) => (n.seenAt ? n : { ...n, seenAt: at }));
    this.countSeq++;
    this.setCounts({ unseen: { count: 0, capped: false } });
  };

  // ---- the subscription -----------------------------------------------------

  private open(): void {
    try {
      this.sub = this.client.subscribe({
        cursor: this.cursor,
        onNotification: (n) => this.arrived(n),
        onStatus: (s) => this.statusChanged(s),
        onState: (e) => this.changed(e),
        onReset: () => this.reset(),
      });
    } catch (err) {
      // The client was closed by the app: nothing is live.
      const error = err as SpoolcastError;
      this.setStatus({ state: "disconnected", reason: "closed", transport: "websocket", attempt: 0, error });
    }
  }

  private close(): void {
    this.closeTimer = undefined;
    const sub = this.sub;
    if (!sub) return;
    this.sub = undefined;
    this.cursor = sub.cursor;
    for (const list of this.lists.values()) clearTimeout(list.retry);
    clearTimeout(this.countTimer);
    this.countTimer = undefined;
    sub.close();
  }

  private statusChanged(s: StreamStatus): void {
    if (!this.sub && s.reason !== "closed") return;
    this.setStatus(s);
    // A stream that cannot be had (403, stream-disabled, …) still shows the lists and the counts, without live.
    if (s.state === "connected" || (s.state === "disconnected" && s.reason === "fatal")) this.connected();
  }

  /**
   * connected loads what the hooks need now that the stream is live:
   * everything committed before this moment is in a page read from now on,
   * and a resume brought every change made meanwhile.
   */
  private connected(): void {
    for (const list of this.lists.values()) if (list.feed.loading && this.needed(list)) void this.loadFirst(list);
    this.refreshCounts(0);
  }

  private arrived(n: Notification): void {
    if (!this.sub) return;
    if (this.pending.size) this.log.push({ seq: ++this.seq, arrived: n });
    const known = this.find(n.id);
    for (const list of this.lists.values()) {
      if (!belongs(list.status, n) || !this.inRange(list, n)) continue;
      const items = merge(list.feed.items, [n], true);
      if (items !== list.feed.items) this.setFeed(list, { items });
    }
    if (!known) for (const name of ["unread", "unseen", "archived"] as const) if (COUNTED[name](n)) this.adjust(name, +1);
    this.refreshCounts();
  }

  /** changed applies a change of state that the stream told (made here or in another session). */
  private changed(e: StateEvent): void {
    if (!this.sub) return;
    const at = new Date().toISOString();
    switch (e.type) {
      case "read":
        if (e.id) this.one(e.id, "readAt", at);
        if (e.through) this.through(e.through, "readAt", at, e.unread);
        break;
      case "unread":
        this.one(e.id, "readAt", null);
        break;
      case "archived":
        if (e.id) this.one(e.id, "archivedAt", at);
        if (e.through) this.through(e.through, "archivedAt", at, e.unarchived);
        break;
      case "unarchived":
        this.one(e.id, "archivedAt", null);
        break;
      case "seen":
        this.through(e.through, "seenAt", at, []);
        break;
    }
    this.refreshCounts();
  }

  /** one sets field of notification id. One not loaded here may belong to a list now: the lists it may join are read again. */
  private one(id: string, field: Field, value: string | null): void {
    const known = this.find(id);
    this.apply((n) => (n.id === id && !n[field] !== !value ? { ...n, [field]: value } : n));
    if (known) return;
    const joins: NotificationStatus[] = field === "archivedAt" ? (value ? ["archived"] : ["all", "unread"]) : field === "readAt" && !value ? ["unread"] : [];
    for (const s of joins) this.reload(this.lists.get(s));
  }

  /**
   * through sets field of the notification id and of everything before it
   * in feed order, but for the ids in except (they committed after it was
   * asked). Without id loaded here there is no telling which are before it:
   * the lists are read again.
   */
  private through(id: string, field: Field, at: string, except: readonly string[]): void {
    const t = this.find(id);
    if (!t) {
      if (field !== "seenAt") for (const list of this.lists.values()) this.reload(list);
      return;
    }
    const tm = micros(t);
    const left = new Set(except);
    this.apply((n) => (!n[field] && !left.has(n.id) && micros(n) <= tm ? { ...n, [field]: at } : n));
  }

  /** reset: the server refused the cursor; the stream is live again from now. Every list is read again. */
  private reset(): void {
    for (const list of this.lists.values()) this.reload(list, true);
    if (this.needs.get("count") || this.needs.get("counts")) this.refreshCounts(0);
  }

  // ---- changes --------------------------------------------------------------

  /**
   * mark sets field (to now, or null) at once, asks the server, and puts it
   * back if refused. The server is asked even when it shows so already:
   * another session may have changed it a moment ago, and its frame not
   * have come yet.
   */
  private async mark(id: string, field: Field, on: boolean, ask: () => Promise<void>): Promise<void> {
    const item = this.find(id);
    const at = on ? new Date().toISOString() : null;
    const was = item?.[field] ?? null;
    if (!was !== !on) this.apply((n) => (n.id === id ? { ...n, [field]: at } : n));
    // One notification's marks reach the server in the order made: a read
    // then an unread sent together could arrive the other way round.
    const sent = (this.marking.get(id) ?? Promise.resolve()).then(ask, ask);
    this.marking.set(id, sent);
    try {
      await sent;
    } catch (err) {
      this.apply((n) => (n.id === id && n[field] === at ? { ...n, [field]: was } : n));
      this.refreshCounts(0);
      throw err;
    } finally {
      if (this.marking.get(id) === sent) this.marking.delete(id);
    }
    this.refreshCounts();
  }

  /** markAll sets field on everything shown at once, the counts it empties at zero, asks the server, and puts back what it set if refused. */
  private async markAll(field: Field, zero: CountName[], ask: () => Promise<unknown>): Promise<void> {
    const at = new Date().toISOString();
    const marked = new Set([...this.known().values()].filter((n) => !n[field]).map((n) => n.id));
    this.apply((n) => (marked.has(n.id) ? { ...n, [field]: at } : n));
    this.countSeq++;
    for (const name of zero) this.setCounts({ [name]: { count: 0, capped: false } });
    try {
      await ask();
    } catch (err) {
      this.apply((n) => (marked.has(n.id) && n[field] === at ? { ...n, [field]: null } : n));
      this.refreshCounts(0);
      throw err;
    }
    this.refreshCounts();
  }

  /**
   * apply changes every notification shown: each takes its new state in
   * every list, leaves the lists it no longer belongs to and joins those it
   * now does (in feed order, if the list's pages reach it), and the counts
   * move by what changed. Kept, while pages are on their way, to be
   * applied again to what they bring.
   */
  private apply(change: (n: Notification) => Notification): void {
    const changed = new Map<string, Notification>();
    for (const n of this.known().values()) {
      const m = change(n);
      if (m === n) continue;
      changed.set(n.id, m);
      for (const name of ["unread", "unseen", "archived"] as const) {
        const by = Number(COUNTED[name](m)) - Number(COUNTED[name](n));
        if (by) this.adjust(name, by);
      }
    }
    // What changed may join a list whose page is on its way: kept with the change.
    if (this.pending.size) this.log.push({ seq: ++this.seq, change, moved: [...changed.values()] });
    if (!changed.size) return;
    for (const list of this.lists.values()) {
      const kept = list.feed.items.flatMap((n) => {
        const m = changed.get(n.id);
        return !m ? [n] : belongs(list.status, m) ? [m] : [];
      });
      const shown = new Set(kept.map((n) => n.id));
      const joining = [...changed.values()].filter((m) => !shown.has(m.id) && belongs(list.status, m) && this.inRange(list, m));
      const items = merge(kept, joining, false);
      if (items.length !== list.feed.items.length || items.some((n, i) => n !== list.feed.items[i])) this.setFeed(list, { items });
    }
  }

  /** known is every notification shown in any list, by id. */
  private known(): Map<string, Notification> {
    const all = new Map<string, Notification>();
    for (const list of this.lists.values()) for (const n of list.feed.items) if (!all.has(n.id)) all.set(n.id, n);
    return all;
  }

  private find(id: string): Notification | undefined {
    for (const list of this.lists.values()) {
      const n = list.feed.items.find((x) => x.id === id);
      if (n) return n;
    }
    return undefined;
  }

  /** inRange: n is within what the list's pages reach, so it is shown live; an older one comes with its page. */
  private inRange(list: List, n: Notification): boolean {
    return !list.loaded || !list.feed.hasMore || micros(n) >= list.edge;
  }

  // ---- pages ----------------------------------------------------------------

  private list(status: NotificationStatus): List {
    let list = this.lists.get(status);
    if (!list) {
      list = {
        status,
        feed: { items: [], loading: true, loadingMore: false, hasMore: false, error: null },
        nextCursor: null,
        edge: -Infinity,
        loaded: false,
        gen: 0,
        retries: 0,
      };
      this.lists.set(status, list);
    }
    return list;
  }

  private needed(list: List): boolean {
    return (this.needs.get(`feed:${list.status}`) ?? 0) > 0;
  }

  /** begin notes a page request: the changes from here on are kept for its answer. */
  private begin(): { from: number } {
    const req = { from: this.seq };
    this.pending.add(req);
    return req;
  }

  private end(req: { from: number }): void {
    this.pending.delete(req);
    let from = Infinity;
    for (const r of this.pending) from = Math.min(from, r.from);
    this.log = this.log.filter((e) => e.seq > from);
  }

  /**
   * replay applies to a page's items the changes made since it was asked,
   * brings in what arrived meanwhile, and keeps what belongs to the list
   * and is within the page's reach (edge, when there is more).
   */
  private replay(items: readonly Notification[], from: number, status: NotificationStatus, hasMore: boolean, edge: number): readonly Notification[] {
    let out = items;
    for (const e of this.log) {
      if (e.seq <= from) continue;
      if (e.change) out = merge(out.map(e.change), e.moved!, false);
      else if (e.arrived) out = merge(out, [e.arrived], true);
    }
    return out.filter((n) => belongs(status, n) && (!hasMore || micros(n) >= edge));
  }

  /** reload reads a loaded list's first page again, in place of what it shows (kept on screen meanwhile). */
  private reload(list: List | undefined, always = false): void {
    if (!list || (!list.loaded && !list.first && !always)) return;
    list.gen++;
    list.first = list.more = undefined;
    clearTimeout(list.retry);
    list.retries = 0;
    this.setFeed(list, { loading: true, loadingMore: false, error: null });
    if (this.needed(list) || list.loaded) void this.loadFirst(list);
  }

  private loadFirst(list: List): Promise<void> {
    if (list.first) return list.first;
    const gen = list.gen;
    clearTimeout(list.retry);
    const req = this.begin();
    const p = this.client.notifications.list({ limit: this.pageSize, ...statusQuery(list.status) }).then(
      (page) => {
        if (gen !== list.gen) return;
        list.retries = 0;
        list.nextCursor = page.nextCursor;
        list.loaded = true;
        list.edge = page.data.length ? micros(page.data.at(-1)!) : -Infinity;
        this.setFeed(list, { items: this.replay(page.data, req.from, list.status, page.hasMore, list.edge), loading: false, hasMore: page.hasMore, error: null });
      },
      (err: SpoolcastError) => {
        if (gen !== list.gen || !this.sub) return;
        this.setFeed(list, { error: err });
        // Tried again by itself, with backoff, never sooner than Retry-After.
        const delay = Math.max((err.retryAfter ?? 0) * 1000, Math.random() * Math.min(PAGE_RETRY_MAX, 1000 * 2 ** list.retries++));
        list.retry = setTimeout(() => {
          list.retry = undefined;
          if (this.sub && gen === list.gen) void this.loadFirst(list);
        }, delay);
      },
    );
    list.first = p;
    void p.finally(() => {
      this.end(req);
      if (list.first === p) list.first = undefined;
    });
    return p;
  }

  // ---- counts ---------------------------------------------------------------

  /** adjust moves a count by a change, at once; a capped count is left to the server. */
  private adjust(name: CountName, by: number): void {
    const c = this.counts[name];
    if (this.counts.loading || c.capped) return;
    this.countSeq++;
    const count = Math.max(0, c.count + by);
    this.setCounts({ [name]: count > CAP ? { count: CAP, capped: true } : { count, capped: false } });
  }

  /** refreshCounts asks the server for the counts after delay; bursts fold into one request. */
  private refreshCounts(delay = COUNT_DELAY): void {
    const all = (this.needs.get("counts") ?? 0) > 0;
    if ((!all && !this.needs.get("count")) || !this.sub) return;
    clearTimeout(this.countTimer);
    this.countTimer = setTimeout(() => {
      this.countTimer = undefined;
      const seq = ++this.countSeq;
      this.client.notifications.counts({ archived: all }).then(
        (c) => seq === this.countSeq && this.setCounts({ ...c, loading: false, error: null }),
        (err: SpoolcastError) => seq === this.countSeq && this.setCounts({ error: err }),
      );
    }, delay);
  }

  // ---- state ----------------------------------------------------------------

  private emit(): void {
    for (const l of [...this.listeners]) l();
  }

  private setFeed(list: List, change: Partial<FeedState>): void {
    list.feed = { ...list.feed, ...change };
    this.emit();
  }

  private setCounts(change: Partial<CountsState>): void {
    const c = (this.counts = { ...this.counts, ...change });
    const u = this.unread;
    if (u.count !== c.unread.count || u.capped !== c.unread.capped || u.loading !== c.loading || u.error !== c.error) {
      this.unread = { count: c.unread.count, capped: c.unread.capped, loading: c.loading, error: c.error };
    }
    this.emit();
  }

  private setStatus(s: StreamStatus): void {
    this.status = s;
    this.emit();
  }
}
