// The state one provider shares among its hooks: one subscription of the
// client, the feed it merges live notifications into, the unread count and
// the stream's status. Hooks read it with useSyncExternalStore and hold it
// while mounted; the subscription opens with the first hold and closes a
// moment after the last release, so that React's StrictMode (mount,
// unmount, mount again) keeps one subscription instead of opening two.
//
// It keeps the client's promise on the screen: the first page is loaded
// once the stream is connected (everything committed before is in it,
// everything after comes live), each id is shown once, in feed order, and a
// cursor the server refuses (onReset) reloads the first page.

import type { Notification, ReadEvent, SpoolcastClient, SpoolcastError, StreamStatus, Subscription, UnreadCount } from "@spoolcast/client";

// The timers of every platform React runs on; declared here so that the
// package compiles without the DOM's types (it uses no DOM API).
declare function setTimeout(fn: () => void, ms?: number): unknown;
declare function clearTimeout(handle: unknown): void;

/** What useNotifications shows. */
export interface FeedState {
  /** Newest first (the feed's order), once per id: the pages loaded and the notifications that arrived live. */
  items: readonly Notification[];
  /** The first page is not in yet (before the stream connects, and again after a reset). */
  loading: boolean;
  /** loadMore's page is on its way. */
  loadingMore: boolean;
  /** There are older notifications than the last page loaded: loadMore loads them. */
  hasMore: boolean;
  /** The last page load that failed (a first page is tried again by itself); null after one succeeds. */
  error: SpoolcastError | null;
}

/** What useUnreadCount shows. */
export interface UnreadState extends UnreadCount {
  /** No count has been read yet. */
  loading: boolean;
  /** The last count that could not be read; null after one could. */
  error: SpoolcastError | null;
}

/** What a hook holds the store for: each opens the subscription; the feed and the count also load theirs. */
export type Need = "feed" | "count" | "status";

/** A count refresh waits this long after a frame, so that a burst costs one request (ms). */
const COUNT_DELAY = 250;
/** The most a failed first page waits before it is tried again (ms), unless the server asks for longer. */
const PAGE_RETRY_MAX = 30_000;
/** Read state is re-read this many notifications a page after a resume. */
const SYNC_PAGE = 100;

/**
 * createdMicros orders notifications as the feed does: `createdAt` carries
 * microseconds, which a Date drops, and the server trims trailing zeros,
 * so neither a Date nor comparing the strings would do.
 */
function createdMicros(iso: string): number {
  const m = /^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$/.exec(iso);
  if (!m) return Date.parse(iso) * 1000;
  return Date.parse(m[1]! + m[3]!) * 1000 + Number((m[2] ?? "").padEnd(6, "0").slice(0, 6));
}

/**
 * merge puts each notification not yet in items at its place in feed order,
 * newest first by createdAt. A live notification is almost always the
 * newest, but one whose transaction committed late goes below newer ones,
 * as the feed lists it. Ties are common: a notification's createdAt is its
 * ingest transaction's start, shared by a batch. The feed breaks them by
 * the order of persistence, which the stream follows and pages show, so a
 * live one goes above those of its time (it committed after them) and a
 * page's go below (a page is newest first); ids, opaque, are never compared.
 * @internal
 */
export function merge(items: readonly Notification[], more: readonly Notification[], live: boolean): readonly Notification[] {
  const ids = new Set(items.map((n) => n.id));
  let out: Notification[] | undefined;
  for (const n of more) {
    if (ids.has(n.id)) continue;
    ids.add(n.id);
    out ??= items.slice();
    const t = createdMicros(n.createdAt);
    let lo = 0;
    let hi = out.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      const m = createdMicros(out[mid]!.createdAt);
      if (m > t || (m === t && !live)) lo = mid + 1;
      else hi = mid;
    }
    out.splice(lo, 0, n);
  }
  return out ?? items;
}

/** The notification as read now, unless it is already. */
const asRead = (n: Notification, at: string): Notification => (n.readAt ? n : { ...n, readAt: at });

/** Store is one provider's shared state. @internal */
export class Store {
  feed: FeedState = { items: [], loading: true, loadingMore: false, hasMore: false, error: null };
  unread: UnreadState = { count: 0, capped: false, loading: true, error: null };
  status: StreamStatus | null = null;

  private readonly listeners = new Set<() => void>();
  private sub?: Subscription;
  /** Where the next subscription resumes: the last one's cursor. */
  private cursor: string | null = null;
  private holds = 0;
  private readonly needs = { feed: 0, count: 0, status: 0 };
  private closeTimer?: unknown;
  /** The feed's cursor for the next (older) page. */
  private nextCursor: string | null = null;
  /** Bumped by a reset: answers to pages asked before it are dropped. */
  private feedGen = 0;
  private firstPage?: Promise<void>;
  private morePage?: Promise<void>;
  private pageRetry?: unknown;
  private pageRetries = 0;
  private syncing = false;
  private countTimer?: unknown;
  /** Bumped by each count request and each frame that changes the count: an answer older than either is dropped. */
  private countSeq = 0;

  constructor(
    readonly client: SpoolcastClient,
    private readonly pageSize: number,
  ) {}

  // ---- what hooks call ------------------------------------------------------

  subscribe = (listener: () => void): (() => void) => {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  };

  getFeed = (): FeedState => this.feed;
  getUnread = (): UnreadState => this.unread;
  getStatus = (): StreamStatus | null => this.status;

  /** hold is a mounted hook's claim: the subscription stays open until every claim is released. */
  hold(need: Need): () => void {
    this.holds++;
    this.needs[need]++;
    if (this.closeTimer !== undefined) {
      clearTimeout(this.closeTimer);
      this.closeTimer = undefined;
    }
    if (!this.sub) {
      this.open();
    } else if (this.status?.state === "connected" || this.status?.reason === "fatal") {
      // The stream is live already: a page read now misses nothing.
      if (need === "feed" && this.feed.loading) void this.loadFirst();
      if (need === "count") this.refreshCount(0);
    }
    let held = true;
    return () => {
      if (!held) return;
      held = false;
      this.holds--;
      this.needs[need]--;
      // Later, not now: StrictMode releases and holds again at once.
      if (this.holds === 0) this.closeTimer = setTimeout(() => this.close());
    };
  }

  /** loadMore loads the page after the last one; concurrent calls share it. Failures are in `feed.error`. */
  loadMore = (): Promise<void> => {
    if (this.morePage) return this.morePage;
    if (this.feed.loading || !this.feed.hasMore || !this.nextCursor) return Promise.resolve();
    const gen = this.feedGen;
    const cursor = this.nextCursor;
    this.setFeed({ loadingMore: true });
    const p = this.client.notifications
      .list({ limit: this.pageSize, cursor })
      .then(
        (page) => {
          if (gen !== this.feedGen) return;
          this.nextCursor = page.nextCursor;
          this.setFeed({ items: merge(this.feed.items, page.data, false), hasMore: page.hasMore, error: null });
        },
        (err: SpoolcastError) => {
          if (gen === this.feedGen) this.setFeed({ error: err });
        },
      )
      .finally(() => {
        if (this.morePage === p) this.morePage = undefined;
        if (gen === this.feedGen) this.setFeed({ loadingMore: false });
      });
    this.morePage = p;
    return p;
  };

  /**
   * markRead shows the notification read and the count one lower at once,
   * then tells the server; if the server refuses, both are put back and
   * the error thrown. Marking a notification read again asks nothing.
   */
  markRead = async (id: string): Promise<void> => {
    const item = this.feed.items.find((n) => n.id === id);
    if (item?.readAt) return;
    const at = new Date().toISOString();
    if (item) {
      this.setItems((n) => (n.id === id ? asRead(n, at) : n));
      this.adjustCount(-1);
    }
    try {
      await this.client.notifications.markRead(id);
    } catch (err) {
      this.setItems((n) => (n.id === id && n.readAt === at ? { ...n, readAt: null } : n));
      this.refreshCount(0);
      throw err;
    }
    this.refreshCount();
  };

  /**
   * markAllRead shows everything read and the count at zero at once, then
   * tells the server, which covers what had committed when it is asked;
   * what arrives meanwhile stays as the stream says. If the server
   * refuses, what was shown is put back and the error thrown.
   */
  markAllRead = async (): Promise<void> => {
    const at = new Date().toISOString();
    const marked = new Set(this.feed.items.filter((n) => !n.readAt).map((n) => n.id));
    this.setItems((n) => (marked.has(n.id) ? asRead(n, at) : n));
    this.countSeq++;
    this.setUnread({ count: 0, capped: false });
    try {
      await this.client.notifications.markAllRead();
    } catch (err) {
      this.setItems((n) => (marked.has(n.id) && n.readAt === at ? { ...n, readAt: null } : n));
      this.refreshCount(0);
      throw err;
    }
    this.refreshCount();
  };

  // ---- the subscription -----------------------------------------------------

  private open(): void {
    try {
      this.sub = this.client.subscribe({
        cursor: this.cursor,
        onNotification: (n) => this.arrived(n),
        onStatus: (s) => this.statusChanged(s),
        onRead: (e) => this.read(e),
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
    clearTimeout(this.pageRetry);
    clearTimeout(this.countTimer);
    this.pageRetry = this.countTimer = undefined;
    sub.close();
  }

  private statusChanged(s: StreamStatus): void {
    if (!this.sub && s.reason !== "closed") return;
    this.setStatus(s);
    if (s.state === "connected") this.connected(s.resumed === true);
    // A stream that cannot be had (403, stream-disabled, …) still shows the feed and the count, without live.
    else if (s.state === "disconnected" && s.reason === "fatal") this.connected(false);
  }

  /**
   * connected loads what the hooks need now that the stream is live:
   * everything committed before this moment is in a page read from now on.
   * After a resume, the read state of what is shown is read again: read
   * frames are live only, and some may have been missed meanwhile.
   */
  private connected(resumed: boolean): void {
    if (this.needs.feed > 0) {
      if (this.feed.loading) void this.loadFirst();
      else if (resumed) void this.syncReadState();
    }
    this.refreshCount(0);
  }

  private arrived(n: Notification): void {
    if (!this.sub) return;
    const items = merge(this.feed.items, [n], true);
    if (items !== this.feed.items) {
      this.setFeed({ items });
      if (!n.readAt) this.adjustCount(+1);
    }
    this.refreshCount();
  }

  private read(e: ReadEvent): void {
    if (!this.sub) return;
    const at = new Date().toISOString();
    if (e.id) {
      const item = this.feed.items.find((n) => n.id === e.id);
      if (item && !item.readAt) {
        this.setItems((n) => (n.id === e.id ? asRead(n, at) : n));
        this.adjustCount(-1);
      }
    }
    if (e.through) {
      const through = this.feed.items.find((n) => n.id === e.through);
      if (through) {
        // The notification and everything older in feed order, but for
        // what committed after the read-all was asked.
        const unread = new Set(e.unread);
        const t = createdMicros(through.createdAt);
        this.setItems((n) => (!unread.has(n.id) && createdMicros(n.createdAt) <= t ? asRead(n, at) : n));
      } else {
        void this.syncReadState(); // newer than anything loaded here: ask
      }
    }
    this.refreshCount();
  }

  /** reset: the server refused the cursor; the stream is live again from now. Show the first page again. */
  private reset(): void {
    this.feedGen++;
    this.firstPage = this.morePage = undefined;
    clearTimeout(this.pageRetry);
    this.nextCursor = null;
    this.pageRetries = 0;
    this.setFeed({ items: [], loading: true, loadingMore: false, hasMore: false, error: null });
    if (this.needs.feed > 0) void this.loadFirst();
    if (this.needs.count > 0) this.refreshCount(0);
  }

  // ---- pages and counts -----------------------------------------------------

  private loadFirst(): Promise<void> {
    if (this.firstPage) return this.firstPage;
    const gen = this.feedGen;
    clearTimeout(this.pageRetry);
    const p = this.client.notifications.list({ limit: this.pageSize }).then(
      (page) => {
        if (gen !== this.feedGen) return;
        this.pageRetries = 0;
        this.nextCursor = page.nextCursor;
        this.setFeed({ items: merge(this.feed.items, page.data, false), loading: false, hasMore: page.hasMore, error: null });
      },
      (err: SpoolcastError) => {
        if (gen !== this.feedGen || !this.sub) return;
        this.setFeed({ error: err });
        // Tried again by itself, with backoff, never sooner than Retry-After.
        const delay = Math.max((err.retryAfter ?? 0) * 1000, Math.random() * Math.min(PAGE_RETRY_MAX, 1000 * 2 ** this.pageRetries++));
        this.pageRetry = setTimeout(() => {
          this.pageRetry = undefined;
          if (this.sub && this.needs.feed > 0) void this.loadFirst();
        }, delay);
      },
    );
    this.firstPage = p;
    void p.finally(() => {
      if (this.firstPage === p) this.firstPage = undefined;
    });
    return p;
  }

  /** syncReadState reads again the read state of what is shown, down to the oldest one. */
  private async syncReadState(): Promise<void> {
    if (this.syncing || this.feed.loading) return;
    this.syncing = true;
    const gen = this.feedGen;
    const oldest = this.feed.items.at(-1);
    try {
      let cursor: string | null = null;
      for (;;) {
        const page = await this.client.notifications.list({ limit: SYNC_PAGE, cursor });
        if (gen !== this.feedGen) return;
        const read = new Map(page.data.filter((n) => n.readAt).map((n) => [n.id, n.readAt!]));
        this.setItems((n) => (!n.readAt && read.has(n.id) ? { ...n, readAt: read.get(n.id)! } : n));
        const last = page.data.at(-1);
        if (!page.hasMore || !oldest || !last || createdMicros(last.createdAt) < createdMicros(oldest.createdAt)) break;
        cursor = page.nextCursor;
      }
    } catch {
      // The next resume, or a read frame, tries again.
    } finally {
      this.syncing = false;
    }
  }

  /** adjustCount moves the count by a frame or a mark, at once; a capped count is left to the server. */
  private adjustCount(by: number): void {
    if (this.unread.loading || this.unread.capped) return;
    this.countSeq++;
    const count = Math.max(0, this.unread.count + by);
    this.setUnread(count > 100 ? { count: 100, capped: true } : { count });
  }

  /** refreshCount asks the server for the count after delay; bursts fold into one request. */
  private refreshCount(delay = COUNT_DELAY): void {
    if (this.needs.count === 0 || !this.sub) return;
    clearTimeout(this.countTimer);
    this.countTimer = setTimeout(() => {
      this.countTimer = undefined;
      const seq = ++this.countSeq;
      this.client.notifications.unreadCount().then(
        ({ count, capped }) => seq === this.countSeq && this.setUnread({ count, capped, loading: false, error: null }),
        (err: SpoolcastError) => seq === this.countSeq && this.setUnread({ error: err }),
      );
    }, delay);
  }

  // ---- state ----------------------------------------------------------------

  private emit(): void {
    for (const l of [...this.listeners]) l();
  }

  private setFeed(change: Partial<FeedState>): void {
    this.feed = { ...this.feed, ...change };
    this.emit();
  }

  private setItems(fn: (n: Notification) => Notification): void {
    let changed = false;
    const items = this.feed.items.map((n) => {
      const m = fn(n);
      changed ||= m !== n;
      return m;
    });
    if (changed) this.setFeed({ items });
  }

  private setUnread(change: Partial<UnreadState>): void {
    this.unread = { ...this.unread, ...change };
    this.emit();
  }

  private setStatus(s: StreamStatus): void {
    this.status = s;
    this.emit();
  }
}
