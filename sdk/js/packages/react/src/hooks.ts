import { createContext, createElement, useCallback, useContext, useEffect, useMemo, useSyncExternalStore, type ReactElement, type ReactNode } from "react";
import type { NotificationStatus, SpoolcastClient, StreamStatus } from "@spoolcast/client";
import { Store, type CountsState, type FeedState, type Need, type UnreadState } from "./store.js";

const Context = createContext<Store | null>(null);

/** The props of `<SpoolcastProvider>`. */
export interface SpoolcastProviderProps {
  /** The user's client. The provider never closes it: the app that made it does, after the provider is gone. */
  client: SpoolcastClient;
  /** How many notifications a page of useNotifications holds (1–100). Default 20. */
  pageSize?: number;
  children?: ReactNode;
}

/**
 * SpoolcastProvider shares one live subscription of `client` among the
 * hooks below it: it opens when the first of them mounts and closes when
 * the last unmounts, however many there are.
 */
export function SpoolcastProvider({ client, pageSize = 20, children }: SpoolcastProviderProps): ReactElement {
  const store = useMemo(() => new Store(client, pageSize), [client, pageSize]);
  return createElement(Context.Provider, { value: store }, children);
}

function useStore(hook: string): Store {
  const store = useContext(Context);
  if (!store) throw new Error(`${hook} must be used inside <SpoolcastProvider>`);
  return store;
}

/** useHold keeps the provider's subscription open while the calling component is mounted. */
function useHold(store: Store, need: Need): void {
  useEffect(() => store.hold(need), [store, need]);
}

/** The client given to the provider: for devices, preferences and anything the hooks do not cover. */
export function useSpoolcastClient(): SpoolcastClient {
  return useStore("useSpoolcastClient").client;
}

/** The options of useNotifications. */
export interface NotificationsOptions {
  /** Which list (a tab): `all` (the default: everything but the archived), `unread`, `archived`. */
  status?: NotificationStatus;
}

/** What useNotifications returns: the list, and the marks, which every list and count follow at once. */
export interface NotificationsResult extends FeedState {
  /** The list shown. */
  status: NotificationStatus;
  /** Loads the list's next (older) page and merges it in; concurrent calls share one request. Never rejects: a failure is in `error`. */
  loadMore(): Promise<void>;
  /**
   * Shows the notification read at once (it leaves the Unread list, the
   * unread count one lower), then tells the server; if the server refuses,
   * it is put back and the promise rejects with the SpoolcastError. The
   * same holds for each mark below.
   */
  markRead(id: string): Promise<void>;
  /** Shows it unread again (back in the Unread list, in feed order). */
  markUnread(id: string): Promise<void>;
  /**
   * Shows everything read and the unread count at zero at once; the server
   * covers what had committed when it was asked, and what arrives later
   * stays unread.
   */
  markAllRead(): Promise<void>;
  /** Moves it from All and Unread to Archived, in feed order. */
  archive(id: string): Promise<void>;
  /** Moves it back from Archived. */
  unarchive(id: string): Promise<void>;
  /** Moves everything to Archived, as markAllRead marks everything read. */
  archiveAll(): Promise<void>;
  /**
   * Tells the server the user has seen everything delivered (a bell was
   * opened): the unseen count goes to zero, in every session, and pushes
   * of what was seen may be suppressed.
   */
  markSeen(): void;
}

/**
 * useNotifications is one list of the user's feed (`status`: all, unread,
 * archived), newest first: the pages loaded so far and every notification
 * that arrived or moved into it live, each once and in the feed's order.
 * The first page is loaded once the stream is connected, and again when
 * the server refused the stream's cursor (a reset). A change of state, made
 * here or in any session of the user, moves a notification between lists
 * at once: an archive takes it out of `all` and `unread` and puts it into
 * `archived`. Each list is its own: hooks of different lists share the
 * provider's one subscription.
 */
export function useNotifications(options: NotificationsOptions = {}): NotificationsResult {
  const status = options.status ?? "all";
  const store = useStore("useNotifications");
  useHold(store, `feed:${status}`);
  const get = useCallback(() => store.getFeed(status), [store, status]);
  const feed = useSyncExternalStore(store.subscribe, get, get);
  return useMemo(
    () => ({
      ...feed,
      status,
      loadMore: () => store.loadMore(status),
      markRead: store.markRead,
      markUnread: store.markUnread,
      markAllRead: store.markAllRead,
      archive: store.archive,
      unarchive: store.unarchive,
      archiveAll: store.archiveAll,
      markSeen: store.markSeen,
    }),
    [feed, store, status],
  );
}

/**
 * useUnreadCount is the user's unread count, live: moved at once by
 * arrivals, marks and other sessions' changes, then confirmed by the
 * server, and read again after every reconnect. `capped`: there are more
 * than 100 (show "99+").
 */
export function useUnreadCount(): UnreadState {
  const store = useStore("useUnreadCount");
  useHold(store, "count");
  return useSyncExternalStore(store.subscribe, store.getUnread, store.getUnread);
}

/**
 * useCounts is every count in one (`GET /v1/notifications/counts`): unread
 * (the Unread tab), unseen (a bell's "new") and archived, live as
 * useUnreadCount is, each capped as the server caps it (`capped`: more
 * than 100, show "99+").
 */
export function useCounts(): CountsState {
  const store = useStore("useCounts");
  useHold(store, "counts");
  return useSyncExternalStore(store.subscribe, store.getCounts, store.getCounts);
}

/**
 * useStreamStatus is the live stream's state (`connecting`, `connected`,
 * `disconnected`) and why; null before the stream starts (the first render).
 */
export function useStreamStatus(): StreamStatus | null {
  const store = useStore("useStreamStatus");
  useHold(store, "status");
  return useSyncExternalStore(store.subscribe, store.getStatus, store.getStatus);
}
