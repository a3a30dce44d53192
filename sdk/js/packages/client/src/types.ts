// The SDK's types, in camelCase. The server's JSON is snake_case
// (docs/api.md); each type's comment names the wire fields it maps, and the
// mappers below are the only place that knows both. Producer-owned content
// (a notification's `data`, category names) is passed through unchanged.

/**
 * A notification, as the feed and the stream carry it.
 * Wire: `{id, type, category, title, body, data, producer, created_at, received_at, read_at, seen_at, archived_at}`.
 */
export interface Notification {
  /** Opaque and stable; compare for equality only. The stream's dedupe key. */
  id: string;
  type: string;
  category: string;
  title: string;
  body: string;
  /** The producer's `data` object, exactly as sent (its keys are not renamed). */
  data: Record<string, unknown>;
  producer: string;
  /** `created_at`: when central persisted it (the feed's order). RFC 3339 with microseconds, kept as a string: a Date would drop them. */
  createdAt: string;
  /** `received_at`: when the first ingress point took the event. */
  receivedAt: string | null;
  /** `read_at`: null while unread. */
  readAt: string | null;
  /** `seen_at`: null until the user was shown it (a `seen` up to a cursor at or after it). */
  seenAt: string | null;
  /** `archived_at`: null unless archived (archived notifications are left out of the `all` and `unread` lists). */
  archivedAt: string | null;
}

/** The feed's lists: `all` (everything not archived), `unread` (of those, the unread), `archived`. */
export type NotificationStatus = "all" | "unread" | "archived";

/** A page of the feed. Wire: `{data, has_more, next_cursor, refresh_cursor}`. */
export interface Page {
  /** Newest first (oldest first for a `since` read). */
  data: Notification[];
  hasMore: boolean;
  /** Pass as `cursor` for the next (older) page; null on the last. */
  nextCursor: string | null;
  /** On a first page and on `since` reads: pass as `since` later for what committed after this answer (pull to refresh). */
  refreshCursor?: string;
}

/** Options of `notifications.list`. */
export interface ListOptions {
  /** 1–100; the server's default is 20. */
  limit?: number;
  /** A page's `nextCursor`: the page after it. */
  cursor?: string | null;
  /** Which list: `all` (the default: everything but the archived), `unread` or `archived`. */
  status?: NotificationStatus;
  /** Only unread notifications (as `status: "unread"`). */
  unread?: boolean;
  /** A `refreshCursor` or a stream cursor: what committed after it, oldest first. Not with `cursor`, `status` or `unread`. */
  since?: string;
}

/** Wire: `{count, capped}`. Counted up to 100; `capped` when there are more (show "99+"). */
export interface Count {
  count: number;
  capped: boolean;
}

/** The unread count. */
export type UnreadCount = Count;

/** Every count in one answer, each capped at 100. Wire: `{unread, unseen, archived?}`. */
export interface Counts {
  /** Unread and not archived: the Unread tab. */
  unread: Count;
  /** Not yet seen: what a bell shows as new. */
  unseen: Count;
  /** Archived: only when asked for (`counts({ archived: true })`). */
  archived?: Count;
}

/** Wire: `{read_through}`: the newest notification now read, and everything before it; null for an empty feed. */
export interface ReadAllResult {
  readThrough: string | null;
}

/** Wire: `{archived_through}`: the newest notification now archived, and everything before it; null for an empty feed. */
export interface ArchiveAllResult {
  archivedThrough: string | null;
}

/** A push device. Wire: `{token, platform, provider, enabled, disabled_reason, disabled_at, created_at, last_seen_at}`. */
export interface Device {
  /** `ExponentPushToken[…]`, `WebPush[…]` for a browser, an APNs or FCM token: what `devices.unregister` takes. */
  token: string;
  platform: "ios" | "android" | "web";
  /** Who reaches it: `expo`, `webpush`, `apns`, `fcm`. */
  provider: string;
  enabled: boolean;
  /** `user_request`, `device_not_registered` (Expo, APNs or FCM: the app is gone), `subscription_gone`, `invalid_token`, `another_app` (a valid token of another app: another Expo project's, bundle id's, Firebase project's, or a subscription made with another VAPID key), `replaced`. */
  disabledReason: string | null;
  disabledAt: string | null;
  createdAt: string;
  lastSeenAt: string;
}

/** One of the user's topics (`GET /v1/topics`). */
export interface TopicSubscription {
  topic: string;
  /** The user may leave it (`topics.unsubscribe`); a closed topic's members are managed by a service. */
  open: boolean;
  /** When the current subscription began: an event to the topic reaches the members subscribed when it was accepted. */
  subscribedAt: string;
}

/** A page of the user's topics, by name. */
export interface TopicPage {
  data: TopicSubscription[];
  /** The `after` of the next page, or null on the last. */
  nextAfter: string | null;
}

export interface WireTopicSubscription {
  topic: string;
  open: boolean;
  subscribed_at: string;
}

export const toTopicSubscription = (t: WireTopicSubscription): TopicSubscription => ({ topic: t.topic, open: t.open, subscribedAt: t.subscribed_at });

/** What `PushSubscription.toJSON()` gives (wire: the same shape). */
export interface WebPushSubscriptionJSON {
  endpoint?: string;
  expirationTime?: number | null;
  keys?: Record<string, string>;
}

/** A daily window without pushes. Wire: `{start, end, time_zone}`. */
export interface QuietHours {
  /** `HH:MM` */
  start: string;
  /** `HH:MM`; may be before start (the window crosses midnight). */
  end: string;
  /** An IANA zone (`time_zone`). */
  timeZone: string;
}

/** Push preferences. Wire: `{categories, quiet_hours}`; category names are kept as they are. */
export interface Preferences {
  /** The categories the user set; a category not listed pushes. */
  categories: Record<string, { push: boolean }>;
  quietHours: QuietHours | null;
}

/** A change to the preferences: named categories are set, others kept; `quietHours` absent keeps them, null removes them. */
export interface PreferencesUpdate {
  categories?: Record<string, { push: boolean }>;
  quietHours?: QuietHours | null;
}

/**
 * A session of the user marked one notification read (`id`), or
 * everything through `through` (read-all), except `unread`, which committed
 * after the read-all was asked. Wire: `{type: "read", id}` /
 * `{type: "read", through, unread}`.
 */
export interface ReadEvent {
  id?: string;
  through?: string;
  unread: string[];
}

/**
 * A change of state made by any session of the user (this one too), as the
 * stream tells it to every open stream of theirs, in the order they were
 * made; a resume replays those made after its cursor. `through` is a
 * watermark: that notification and everything before it in feed order,
 * except the ids listed (they committed after it was asked).
 * Wire: `{type, id | through, unread?, unarchived?, cursor}`.
 */
export type StateEvent =
  | ({ type: "read" } & ReadEvent)
  | { type: "unread"; id: string }
  | { type: "archived"; id?: string; through?: string; unarchived: string[] }
  | { type: "unarchived"; id: string }
  | { type: "seen"; through: string };

// ---- wire shapes and mappers (internal) -----------------------------------

/** @internal */
export interface WireNotification {
  id: string;
  type: string;
  category: string;
  title: string;
  body: string;
  data: Record<string, unknown> | null;
  producer: string;
  created_at: string;
  received_at: string | null;
  read_at: string | null;
  seen_at?: string | null;
  archived_at?: string | null;
}

/** @internal */
export interface WireDevice {
  token: string;
  platform: Device["platform"];
  provider: string;
  enabled: boolean;
  disabled_reason: string | null;
  disabled_at: string | null;
  created_at: string;
  last_seen_at: string;
}

/** @internal */
export interface WirePreferences {
  categories: Record<string, { push: boolean }> | null;
  quiet_hours: { start: string; end: string; time_zone: string } | null;
}

/** @internal */
export const toNotification = (n: WireNotification): Notification => ({
  id: n.id,
  type: n.type,
  category: n.category,
  title: n.title,
  body: n.body,
  data: n.data ?? {},
  producer: n.producer,
  createdAt: n.created_at,
  receivedAt: n.received_at ?? null,
  readAt: n.read_at ?? null,
  seenAt: n.seen_at ?? null,
  archivedAt: n.archived_at ?? null,
});

/** @internal */
export const toDevice = (d: WireDevice): Device => ({
  token: d.token,
  platform: d.platform,
  provider: d.provider,
  enabled: d.enabled,
  disabledReason: d.disabled_reason,
  disabledAt: d.disabled_at,
  createdAt: d.created_at,
  lastSeenAt: d.last_seen_at,
});

/** @internal */
export const toPreferences = (p: WirePreferences): Preferences => ({
  categories: p.categories ?? {},
  quietHours: p.quiet_hours && { start: p.quiet_hours.start, end: p.quiet_hours.end, timeZone: p.quiet_hours.time_zone },
});
