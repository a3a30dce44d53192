import { createContext, createElement, useContext, useEffect, useMemo, useSyncExternalStore, type ReactElement, type ReactNode } from "react";
import type { SpoolcastClient, StreamStatus } from "@spoolcast/client";
import { Store, type FeedState, type Need, type UnreadState } from "./store.js";

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

/** What useNotifications returns. */
export interface NotificationsResult extends FeedState {
  /** Loads the next (older) page and merges it in; concurrent calls share one request. Never rejects: a failure is in `error`. */
  loadMore(): Promise<void>;
  /**
   * Shows the notification read, and the unread count one lower, at once,
   * then tells the server; if the server refuses, both are put back and the
   * promise rejects with the SpoolcastError.
   */
  markRead(id: string): Promise<void>;
  /**
   * Shows everything read and the count at zero at once, then tells the
   * server (which covers what had committed when it was asked; what
   * arrives later stays unread); if it refuses, both are put back and the
   * promise rejects.
   */
  markAllRead(): Promise<void>;
}

/**
 * useNotifications is the user's feed, newest first: the pages loaded so
 * far and every notification that arrived live, each once and in the
 * feed's order. The first page is loaded once the stream is connected, and
 * again when the server refused the stream's cursor (a reset); read state
 * follows this session's marks and other sessions' read frames, and is
 * read again after a reconnect.
 */
export function useNotifications(): NotificationsResult {
  const store = useStore("useNotifications");
  useHold(store, "feed");
  const feed = useSyncExternalStore(store.subscribe, store.getFeed, store.getFeed);
  return useMemo(
    () => ({ ...feed, loadMore: store.loadMore, markRead: store.markRead, markAllRead: store.markAllRead }),
    [feed, store],
  );
}

/**
 * useUnreadCount is the user's unread count, live: moved at once by
 * arrivals, marks and other sessions' read frames, then confirmed by the
 * server, and read again after every reconnect. `capped`: there are more
 * than 100 (show "99+").
 */
export function useUnreadCount(): UnreadState {
  const store = useStore("useUnreadCount");
  useHold(store, "count");
  return useSyncExternalStore(store.subscribe, store.getUnread, store.getUnread);
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
