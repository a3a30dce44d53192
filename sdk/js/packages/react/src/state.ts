// The states the hooks show, as the store keeps them: one list's, the
// unread count's, the counts'; and what a hook holds the store for.

import type { Count, Notification, NotificationStatus, SpoolcastError } from "@spoolcast/client";

/** What useNotifications shows of one list. */
export interface FeedState {
  /** Newest first (the feed's order), once per id: the pages loaded and the notifications that arrived or moved here live. */
  items: readonly Notification[];
  /** The first page is not in yet (before the stream connects, and again after a reset, while what was shown stays). */
  loading: boolean;
  /** loadMore's page is on its way. */
  loadingMore: boolean;
  /** There are older notifications than the last page loaded: loadMore loads them. */
  hasMore: boolean;
  /** The last page load that failed (a first page is tried again by itself); null after one succeeds. */
  error: SpoolcastError | null;
}

/** What useUnreadCount shows. */
export interface UnreadState extends Count {
  /** No count has been read yet. */
  loading: boolean;
  /** The last count that could not be read; null after one could. */
  error: SpoolcastError | null;
}

/** What useCounts shows: each count as the server caps it (up to 100; `capped`: more, show "99+"). */
export interface CountsState {
  /** Unread and not archived: the Unread tab's. */
  unread: Count;
  /** Not seen yet: a bell's "new". */
  unseen: Count;
  /** Archived. */
  archived: Count;
  /** No counts have been read yet. */
  loading: boolean;
  /** The last counts that could not be read; null after they could. */
  error: SpoolcastError | null;
}

/** What a hook holds the store for: each opens the subscription; a list, and the counts, also load theirs. */
export type Need = "count" | "counts" | "status" | `feed:${NotificationStatus}`;
