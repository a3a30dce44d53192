import { ClientClosedError, errorFromResponse, NetworkError, SpoolcastError } from "./errors.js";
import { Stream, type StreamHost, type SubscribeOptions, type Subscription } from "./stream.js";
import { Tokens, type TokenFunction } from "./tokens.js";
import type { WebSocketConstructor } from "./transports.js";
import {
  toDevice,
  toNotification,
  toPreferences,
  toTopicSubscription,
  type ArchiveAllResult,
  type Count,
  type Counts,
  type Device,
  type ListOptions,
  type Page,
  type Preferences,
  type PreferencesUpdate,
  type ReadAllResult,
  type TopicPage,
  type TopicSubscription,
  type UnreadCount,
  type WebPushSubscriptionJSON,
  type WireDevice,
  type WireNotification,
  type WirePreferences,
  type WireTopicSubscription,
} from "./types.js";

/** count keeps a count's two fields (a missing one is zero). */
const count = (c: Count | undefined): Count => ({ count: c?.count ?? 0, capped: c?.capped ?? false });

/** The API version the SDK's types follow, sent as `Spoolcast-Version` (docs/api.md, Versions). */
export const API_VERSION = "2026-11-30";

/** How long a write's position (`Spoolcast-Written-At`) is sent back on reads, so a read replica shows the user's own writes (ms). */
const WRITTEN_AT_MS = 10_000;

/** The options of `new SpoolcastClient`. */
export interface SpoolcastClientOptions {
  /** Central's public address, `https://api.example.com` (a path prefix is kept). */
  baseUrl: string;
  /**
   * Gives the user's token (an OIDC JWT). Called at first use, again when the
   * server answers 401, and ahead of the token's `exp` (read without
   * verifying); one call at a time, shared by every caller waiting.
   */
  token: TokenFunction;
  /** A WebSocket class; by default `globalThis.WebSocket`. In Node 20 pass the `ws` package's. */
  WebSocket?: WebSocketConstructor;
  /**
   * `auto` (the default): a WebSocket when there is a class, falling back to
   * server-sent events when WebSocket handshakes fail three times in a row
   * while the API answers (a proxy that refuses upgrades); a WebSocket is
   * tried again at a reconnect 5 minutes later. Without a WebSocket class,
   * server-sent events. `websocket` or `sse`: that one only.
   */
  transport?: "auto" | "websocket" | "sse";
  /** A fetch; by default `globalThis.fetch`. Server-sent events need one whose response bodies stream. */
  fetch?: typeof fetch;
  /** The app's version, sent as `Spoolcast-App-Version` (a server with `--min-app-version` answers older apps 426). */
  appVersion?: string;
  /** The platform `devices.registerExpo` registers by default (React Native: `Platform.OS`). */
  platform?: "ios" | "android";
  /** Reconnection backoff, in ms: full jitter between 0 and min·2^attempt, capped at max. Defaults 500 and 20,000. */
  reconnect?: { minDelay?: number; maxDelay?: number };
  /**
   * Reconnect after this long without a frame (ms): an event stream gets the server's heartbeats; a WebSocket
   * quiet for a third of it asks the server for a pong. Default 75,000; 0: never.
   */
  idleTimeout?: number;
}

/** `client.notifications`: the feed and its states (seen, read, archived). */
export interface NotificationsApi {
  /** `GET /v1/notifications`: a page of a list (`status`: all, unread, archived), newest first. */
  list(options?: ListOptions): Promise<Page>;
  /** `POST /v1/notifications/{id}/read` (again is fine). Another user's id is a NotFoundError. */
  markRead(id: string): Promise<void>;
  /** `POST /v1/notifications/{id}/unread`: unread again. */
  markUnread(id: string): Promise<void>;
  /** `POST /v1/notifications/read-all`: everything up to the newest, as committed now. */
  markAllRead(): Promise<ReadAllResult>;
  /** `POST /v1/notifications/{id}/archive`: out of the `all` and `unread` lists, into `archived`. */
  archive(id: string): Promise<void>;
  /** `POST /v1/notifications/{id}/unarchive`: back into `all`. */
  unarchive(id: string): Promise<void>;
  /** `POST /v1/notifications/archive-all`: everything up to the newest, as committed now. */
  archiveAll(): Promise<ArchiveAllResult>;
  /** `GET /v1/notifications/counts`: unread and unseen (and archived, when asked) in one round trip. */
  counts(options?: { archived?: boolean }): Promise<Counts>;
  /** `GET /v1/notifications/unread-count` */
  unreadCount(): Promise<UnreadCount>;
}

/** `client.devices`: where pushes go. */
export interface DevicesApi {
  /** `PUT /v1/devices` with an Expo push token (`ExponentPushToken[…]`): again at every start, to say "still here". */
  registerExpo(expoPushToken: string, platform?: "ios" | "android"): Promise<Device>;
  /** `PUT /v1/devices` with an APNs device token (hex, from `didRegisterForRemoteNotificationsWithDeviceToken`), for an iOS app that is not built with Expo. The deployment needs APNs set up (`--apns-key-file`). */
  registerApns(deviceToken: string): Promise<Device>;
  /** `PUT /v1/devices` with an FCM registration token (`getToken()`), for an app that is not built with Expo; Android by default. The deployment needs FCM set up (`--fcm-credentials-file`). */
  registerFcm(registrationToken: string, platform?: "android" | "ios"): Promise<Device>;
  /** `PUT /v1/devices` with a browser's `PushSubscription` (or its `toJSON()`). */
  registerWebPush(subscription: WebPushSubscriptionJSON | { toJSON(): WebPushSubscriptionJSON }): Promise<Device>;
  /** `DELETE /v1/devices/{token}`: push off for that device. */
  unregister(token: string): Promise<void>;
  /** `GET /v1/devices`: the user's devices, enabled or not. */
  list(): Promise<Device[]>;
  /** `GET /v1/push/vapid-public-key`: the `applicationServerKey` (base64url) for `pushManager.subscribe`. */
  vapidPublicKey(): Promise<string>;
}

/** `client.preferences`: which categories push, and quiet hours. */
export interface PreferencesApi {
  /** `GET /v1/preferences` */
  get(): Promise<Preferences>;
  /** `PUT /v1/preferences`: merges, and answers the result. */
  update(changes: PreferencesUpdate): Promise<Preferences>;
}

/** `client.topics`: the topics the user is in, and joining and leaving the open ones. */
export interface TopicsApi {
  /** `GET /v1/topics`: a page of the user's topics by name, after `after` (default 100, at most 1000). */
  list(options?: { after?: string; limit?: number }): Promise<TopicPage>;
  /** `PUT /v1/topics/{topic}/subscription`: joins an open topic (a `NotFoundError` for one that is not open); the subscription the user had is kept. */
  subscribe(topic: string): Promise<TopicSubscription>;
  /** `DELETE /v1/topics/{topic}/subscription`: leaves an open topic; not being a member is no error. */
  unsubscribe(topic: string): Promise<void>;
}

/**
 * SpoolcastClient is one user's connection to central: REST calls and live
 * subscriptions, sharing the token. It keeps no global state; `close()` ends
 * every subscription and request it started.
 */
export class SpoolcastClient {
  readonly notifications: NotificationsApi;
  readonly devices: DevicesApi;
  readonly preferences: PreferencesApi;
  readonly topics: TopicsApi;
  private readonly host: StreamHost;
  private readonly subs = new Set<Stream>();
  private readonly abort = new AbortController();
  private readonly appVersion?: string;
  private written?: { value: string; at: number };
  private closed = false;

  constructor(options: SpoolcastClientOptions) {
    const WS = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    const transport = options.transport ?? "auto";
    if (transport === "websocket" && !WS) throw new SpoolcastError("transport websocket needs a WebSocket class: pass the WebSocket option", { code: "no-websocket" });
    this.appVersion = options.appVersion;
    const f = options.fetch;
    this.host = {
      baseUrl: options.baseUrl.replace(/\/+$/, ""),
      tokens: new Tokens(options.token),
      WebSocket: WS,
      transport,
      minDelay: options.reconnect?.minDelay ?? 500,
      maxDelay: options.reconnect?.maxDelay ?? 20_000,
      idleTimeout: options.idleTimeout ?? 75_000,
      // Looked up at each call, unbound: a browser's fetch must be called on globalThis.
      fetch: (input, init) => (f ? f(input, init) : fetch(input, init)),
      headers: (token) => this.headers(token),
      request: (method, path, body) => this.request(method, path, body),
      forget: (sub) => this.subs.delete(sub),
    };
    const req = <T>(method: string, path: string, body?: unknown) => this.request<T>(method, path, body);
    const id = encodeURIComponent;
    this.notifications = {
      list: async (o = {}) => {
        // Not URLSearchParams, which React Native lacks in part.
        const q = [];
        if (o.limit !== undefined) q.push("limit=" + o.limit);
        if (o.cursor) q.push("cursor=" + id(o.cursor));
        if (o.status) q.push("status=" + o.status);
        if (o.unread) q.push("unread=true");
        if (o.since) q.push("since=" + id(o.since));
        const page = await req<{ data: WireNotification[]; has_more: boolean; next_cursor: string | null; refresh_cursor?: string }>(
          "GET",
          "/v1/notifications" + (q.length ? "?" + q.join("&") : ""),
        );
        const out: Page = { data: page.data.map(toNotification), hasMore: page.has_more, nextCursor: page.next_cursor ?? null };
        if (page.refresh_cursor) out.refreshCursor = page.refresh_cursor;
        return out;
      },
      markRead: (n) => req("POST", `/v1/notifications/${id(n)}/read`),
      markUnread: (n) => req("POST", `/v1/notifications/${id(n)}/unread`),
      markAllRead: async () => ({ readThrough: (await req<{ read_through: string | null }>("POST", "/v1/notifications/read-all")).read_through }),
      archive: (n) => req("POST", `/v1/notifications/${id(n)}/archive`),
      unarchive: (n) => req("POST", `/v1/notifications/${id(n)}/unarchive`),
      archiveAll: async () => ({ archivedThrough: (await req<{ archived_through: string | null }>("POST", "/v1/notifications/archive-all")).archived_through }),
      counts: async (o = {}) => {
        const c = await req<Record<"unread" | "unseen" | "archived", Count | undefined>>("GET", "/v1/notifications/counts" + (o.archived ? "?archived=true" : ""));
        const out: Counts = { unread: count(c.unread), unseen: count(c.unseen) };
        if (c.archived) out.archived = count(c.archived);
        return out;
      },
      unreadCount: async () => count(await req<UnreadCount>("GET", "/v1/notifications/unread-count")),
    };
    this.devices = {
      registerExpo: async (token, platform = options.platform) => {
        if (!platform) throw new SpoolcastError("registerExpo needs the platform (ios or android): pass it, or the client's platform option", { code: "no-platform" });
        return toDevice(await req<WireDevice>("PUT", "/v1/devices", { token, platform }));
      },
      registerApns: async (token) => toDevice(await req<WireDevice>("PUT", "/v1/devices", { token, platform: "ios", provider: "apns" })),
      registerFcm: async (token, platform = "android") => toDevice(await req<WireDevice>("PUT", "/v1/devices", { token, platform, provider: "fcm" })),
      registerWebPush: async (s) => {
        const subscription = "toJSON" in s && typeof s.toJSON === "function" ? s.toJSON() : s;
        return toDevice(await req<WireDevice>("PUT", "/v1/devices", { platform: "web", subscription }));
      },
      unregister: (token) => req("DELETE", `/v1/devices/${id(token)}`),
      list: async () => (await req<{ data: WireDevice[] }>("GET", "/v1/devices")).data.map(toDevice),
      vapidPublicKey: async () => (await req<{ key: string }>("GET", "/v1/push/vapid-public-key")).key,
    };
    this.preferences = {
      get: async () => toPreferences(await req<WirePreferences>("GET", "/v1/preferences")),
      update: async (c) => {
        const body: Partial<WirePreferences> = {};
        if (c.categories) body.categories = c.categories;
        if (c.quietHours !== undefined) body.quiet_hours = c.quietHours && { start: c.quietHours.start, end: c.quietHours.end, time_zone: c.quietHours.timeZone };
        return toPreferences(await req<WirePreferences>("PUT", "/v1/preferences", body));
      },
    };
    this.topics = {
      list: async (o = {}) => {
        const q = new URLSearchParams();
        if (o.after !== undefined) q.set("after", o.after);
        if (o.limit !== undefined) q.set("limit", String(o.limit));
        const qs = q.toString();
        const page = await req<{ data: WireTopicSubscription[]; next_after?: string }>("GET", "/v1/topics" + (qs ? "?" + qs : ""));
        return { data: page.data.map(toTopicSubscription), nextAfter: page.next_after ?? null };
      },
      subscribe: async (topic) => toTopicSubscription(await req<WireTopicSubscription>("PUT", `/v1/topics/${id(topic)}/subscription`)),
      unsubscribe: (topic) => req("DELETE", `/v1/topics/${id(topic)}/subscription`),
    };
  }

  /**
   * subscribe opens the live stream: each notification reaches
   * onNotification once, in commit order, resuming from the last one
   * delivered after any drop. `close()` on the result unsubscribes.
   */
  subscribe(options: SubscribeOptions): Subscription {
    if (this.closed) throw new ClientClosedError("the client is closed", { code: "closed" });
    const sub = new Stream(this.host, options);
    this.subs.add(sub);
    return sub;
  }

  /** close ends every subscription and request in flight; later calls throw ClientClosedError. Safe to call twice. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const sub of [...this.subs]) sub.close();
    this.abort.abort();
  }

  private headers(token: string): Record<string, string> {
    const h: Record<string, string> = { Authorization: "Bearer " + token, "Spoolcast-Version": API_VERSION };
    if (this.appVersion) h["Spoolcast-App-Version"] = this.appVersion;
    if (this.written && Date.now() - this.written.at < WRITTEN_AT_MS) h["Spoolcast-Written-At"] = this.written.value;
    return h;
  }

  /**
   * request calls the API with the token, renewing it once on a 401, and
   * answers the JSON body (undefined for 204), or throws the typed error.
   */
  private async request<T>(method: string, path: string, body?: unknown): Promise<T> {
    const closed = () => new ClientClosedError("the client is closed", { code: "closed" });
    if (this.closed) throw closed();
    const tokens = this.host.tokens;
    let token = await tokens.get();
    for (let again = true; ; again = false) {
      const headers = this.headers(token);
      if (body !== undefined) headers["Content-Type"] = "application/json";
      let res: Response;
      try {
        res = await this.host.fetch(this.host.baseUrl + path, {
          method,
          headers,
          body: body === undefined ? undefined : JSON.stringify(body),
          signal: this.abort.signal,
        });
      } catch (err) {
        throw this.closed ? closed() : new NetworkError(`${method} ${path}: no answer`, { code: "network", cause: err });
      }
      const written = res.headers.get("Spoolcast-Written-At");
      if (written) this.written = { value: written, at: Date.now() };
      if (res.status === 401 && again) {
        void res.body?.cancel().catch(() => {});
        tokens.refused(token);
        token = await tokens.get();
        continue;
      }
      if (!res.ok) throw await errorFromResponse(res);
      if (res.status === 204) return undefined as T;
      try {
        return (await res.json()) as T;
      } catch (err) {
        throw this.closed ? closed() : new NetworkError(`${method} ${path}: the answer could not be read`, { code: "network", status: res.status, cause: err });
      }
    }
  }
}
