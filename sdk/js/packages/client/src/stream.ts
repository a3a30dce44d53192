// The live stream's one state machine, for both transports:
//
//   connecting ──ready frame──▶ connected ──drop──▶ connecting ─ … ─▶ disconnected
//        ▲ └──────────refused / failed (backoff, Retry-After)──────┘   (close(), or a refusal retrying cannot fix)
//
// Its only memory is the cursor of the last frame it delivered (a
// notification's, a state change's, or a ready frame's): every
// connection resumes there, so nothing is missed; a bounded memory of recent
// ids makes sure nothing is delivered twice; a cursor the server refuses is
// dropped and the app told to reload, never silence (DESIGN.md rule 12).

import {
  InvalidCursorError,
  NetworkError,
  RateLimitedError,
  SpoolcastError,
  TooManySocketsError,
  UnauthorizedError,
  UnavailableError,
} from "./errors.js";
import type { Tokens } from "./tokens.js";
import { openEventStream, openWebSocket, type Connection, type End, type Frame, type WebSocketConstructor } from "./transports.js";
import { toNotification, type Notification, type ReadEvent, type StateEvent } from "./types.js";

/** `connecting → connected → disconnected`, as centrifuge-js names them. */
export type StreamState = "connecting" | "connected" | "disconnected";

/**
 * Why the stream is in its state.
 * - `connect`: the first connection; `ready`: connected.
 * - `going-away`: the replica is shutting down (close 1001): reconnecting at once.
 * - `reset`: the server refused the cursor (400 `invalid-cursor`, or close 1008): reconnecting without it; `onReset` follows.
 * - `unauthorized`: the token was refused: the token function is asked again.
 * - `rate-limited`: 429 (`rate-limited`, `too-many-sockets`): waiting `Retry-After`.
 * - `unavailable`: 503, close 1011 or 1013, another 5xx: backing off.
 * - `network`: no answer, or the connection broke without a close code: backing off.
 * - `transport`: switching between WebSocket and server-sent events.
 * - `token`: the token function failed: backing off, then asking again.
 * - `closed`: `close()` was called; `fatal`: a refusal that retrying cannot fix (403, 404 `stream-disabled`, 426): see `error`.
 */
export type StatusReason =
  | "connect"
  | "ready"
  | "going-away"
  | "reset"
  | "unauthorized"
  | "rate-limited"
  | "unavailable"
  | "network"
  | "transport"
  | "token"
  | "closed"
  | "fatal";

/** The transport a connection uses. */
export type TransportName = "websocket" | "sse";

/** What `onStatus` is told at each change. */
export interface StreamStatus {
  state: StreamState;
  reason: StatusReason;
  /** The transport of the connection this status is about. */
  transport: TransportName;
  /** Failed attempts since the last healthy connection. */
  attempt: number;
  /** connecting: ms until the next attempt. */
  retryIn?: number;
  /**
   * connected: true when the stream resumed from a cursor (nothing was
   * missed); false when it started without one (the first connection
   * without `cursor`, or after a reset): load the feed's first page now,
   * since everything committed before this moment is in it and everything
   * after comes to onNotification.
   */
  resumed?: boolean;
  /** The close code, when the connection ended with one. */
  code?: number;
  /** What went wrong, when something did. */
  error?: SpoolcastError;
}

/** What `onReset` is told. */
export interface ResetInfo {
  /** The cursor the server refused. */
  cursor: string;
  /** The server's refusal (400 `invalid-cursor`), or the close code 1008. */
  error?: SpoolcastError;
}

/** The options of `client.subscribe`. */
export interface SubscribeOptions {
  /**
   * Each notification once, in commit order, across reconnects and
   * transports: the SDK dedupes by `id` (remembering the last 1,000 ids) and
   * resumes from the cursor of the last one delivered. `cursor` is that
   * frame's place in the stream: keep it to resume a later session.
   * A throw here does not stop the stream; it is rethrown asynchronously.
   */
  onNotification(notification: Notification, info: { cursor: string }): void;
  /** Every change of state, with why. */
  onStatus?(status: StreamStatus): void;
  /**
   * A notification's state changed, in this session or another of the
   * user's: read, unread, archived, unarchived (one, or all through a
   * watermark), seen. In the order made, each once, across reconnects: a
   * resume replays the changes after the cursor. `cursor` is the frame's
   * place in the stream, null from a server that gives state frames none.
   */
  onState?(event: StateEvent, info: { cursor: string | null }): void;
  /** The `read` changes alone (onState has them too), kept for apps written before onState. */
  onRead?(event: ReadEvent): void;
  /**
   * The server refused the cursor (a restore or a failover of its
   * database, or a malformed one): the stream started again without it and
   * is live now. Clear what you show and load the feed's first page:
   * everything committed before now is in it.
   */
  onReset?(info: ResetInfo): void;
  /** Where to resume: a cursor kept from an earlier session (a stream or refresh cursor). Without one the stream starts now. */
  cursor?: string | null;
}

/** A live subscription; `close()` ends it (the unsubscribe). */
export interface Subscription {
  /** The cursor of the last frame delivered (a notification, a state change, ready): where the next connection resumes. */
  readonly cursor: string | null;
  readonly status: StreamStatus;
  /**
   * seen tells the server the user has seen everything up to cursor (by
   * default, the last delivered), so pushes of it may be suppressed
   * (`--push-suppress-if-seen`). Sent at once or at the next connection.
   */
  seen(cursor?: string): void;
  close(): void;
}

/** What the stream needs of the client. @internal */
export interface StreamHost {
  baseUrl: string;
  tokens: Tokens;
  WebSocket?: WebSocketConstructor;
  transport: "auto" | "websocket" | "sse";
  minDelay: number;
  maxDelay: number;
  idleTimeout: number;
  fetch: typeof fetch;
  headers(token: string): Record<string, string>;
  request<T>(method: string, path: string, body?: unknown): Promise<T>;
  forget(sub: Stream): void;
}

/** A connection counts as healthy, and resets the backoff, once it lasted this long (ms). */
const HEALTHY_MS = 5_000;
/** WebSocket handshakes failing in a row, while the API answers, before "auto" falls back to server-sent events. */
const FALLBACK_AFTER = 3;
/** After falling back, a WebSocket is tried again at a reconnect this long after (ms). */
const WS_RETRY_MS = 5 * 60_000;
/** How many delivered ids the stream remembers, to deliver each once. */
const REMEMBER_IDS = 1_000;

const raise = (err: unknown) =>
  setTimeout(() => {
    throw err;
  });

/** @internal */
export class Stream implements Subscription {
  cursor: string | null;
  status: StreamStatus;
  private attempt = 0;
  private wsFailures = 0;
  private sse: boolean;
  private wsAgainAt = 0;
  private gen = 0;
  private conn?: Connection;
  private timer?: ReturnType<typeof setTimeout>;
  private ids = new Set<string>();
  private refused?: ResetInfo;
  private connectedAt = 0;
  private unseen?: string;
  private closed = false;

  constructor(
    private readonly host: StreamHost,
    private readonly o: SubscribeOptions,
  ) {
    this.cursor = o.cursor || null;
    this.sse = host.transport === "sse" || (host.transport === "auto" && !host.WebSocket);
    const status: StreamStatus = { state: "connecting", reason: "connect", transport: this.transportName(), attempt: 0 };
    this.status = status;
    // Told after subscribe returns, so that onStatus may use the subscription.
    const gen = ++this.gen;
    this.timer = setTimeout(() => {
      if (gen !== this.gen) return;
      this.emit(status);
      void this.open(gen);
    });
  }

  seen(cursor = this.cursor ?? undefined): void {
    if (!cursor || this.closed) return;
    this.unseen = cursor;
    if (this.status.state === "connected") this.sendSeen();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.gen++;
    clearTimeout(this.timer);
    this.conn?.close();
    this.conn = undefined;
    this.host.forget(this);
    this.emit({ state: "disconnected", reason: "closed", transport: this.status.transport, attempt: this.attempt });
  }

  private transportName(): TransportName {
    return this.sse && !(this.host.WebSocket && this.wsAgainAt && Date.now() >= this.wsAgainAt) ? "sse" : "websocket";
  }

  private emit(status: StreamStatus): void {
    this.status = status;
    if (this.o.onStatus) this.call(() => this.o.onStatus!(status));
  }

  private call(fn: () => void): void {
    try {
      fn();
    } catch (err) {
      raise(err);
    }
  }

  private schedule(delay: number, reason: StatusReason, extra?: Partial<StreamStatus>): void {
    const gen = ++this.gen;
    this.emit({ state: "connecting", reason, transport: this.transportName(), attempt: this.attempt, retryIn: delay, ...extra });
    this.timer = setTimeout(() => gen === this.gen && void this.open(gen), delay);
  }

  private async open(gen: number): Promise<void> {
    const transport = this.transportName();
    let token: string;
    try {
      token = await this.host.tokens.get();
    } catch (err) {
      if (gen === this.gen) this.retry("token", this.backoff(), { error: err as SpoolcastError });
      return;
    }
    if (gen !== this.gen) return;
    const cursor = this.cursor;
    const url = this.host.baseUrl + "/v1/stream";
    const sink = {
      frame: (f: Frame) => gen === this.gen && this.frame(f, transport, cursor !== null),
      end: (e: End) => gen === this.gen && void this.end(gen, e, transport, token),
    };
    if (transport === "websocket") {
      this.conn = openWebSocket(this.host.WebSocket!, url.replace(/^http/, "ws") + (cursor ? "?after=" + encodeURIComponent(cursor) : ""), token, sink, this.host.idleTimeout);
    } else {
      const headers = this.host.headers(token);
      if (cursor) headers["Last-Event-ID"] = cursor;
      this.conn = openEventStream({ fetch: this.host.fetch, url, headers, idleTimeout: this.host.idleTimeout }, sink);
    }
  }

  private frame(f: Frame, transport: TransportName, resumed: boolean): void {
    switch (f.type) {
      case "notification": {
        if (typeof f.cursor !== "string" || typeof f.data?.id !== "string") return; // not a frame this SDK knows
        this.cursor = f.cursor;
        if (this.remember(f.data.id)) return;
        const n = toNotification(f.data);
        this.call(() => this.o.onNotification(n, { cursor: f.cursor }));
        return;
      }
      case "ready": {
        if (typeof f.cursor !== "string") return;
        this.cursor = f.cursor;
        this.connectedAt = Date.now();
        if (transport === "websocket") {
          this.wsFailures = 0;
          this.sse = this.host.transport === "sse";
        }
        const refused = this.refused;
        this.refused = undefined;
        if (refused && this.o.onReset) this.call(() => this.o.onReset!(refused));
        this.emit({ state: "connected", reason: "ready", transport, attempt: this.attempt, resumed: resumed && !refused });
        if (this.unseen) this.sendSeen();
        return;
      }
      case "read":
      case "unread":
      case "archived":
      case "unarchived":
      case "seen": {
        const cursor = typeof f.cursor === "string" ? f.cursor : null;
        if (cursor) {
          // A state change is delivered once: the next connection resumes after it.
          this.cursor = cursor;
          const key = [f.type, f.id, f.through, cursor].join(" ");
          if (this.remember(key)) return;
        }
        const ids = (v: unknown) => (Array.isArray(v) ? v.filter((x): x is string => typeof x === "string") : []);
        const e: Record<string, unknown> = { type: f.type };
        if (typeof f.id === "string") e.id = f.id;
        if (typeof f.through === "string") e.through = f.through;
        if (f.type === "read") e.unread = ids(f.unread);
        if (f.type === "archived") e.unarchived = ids(f.unarchived);
        if (!e.id && !e.through) return; // not a frame this SDK knows
        const event = e as StateEvent;
        if (this.o.onState) this.call(() => this.o.onState!(event, { cursor }));
        if (event.type === "read" && this.o.onRead) {
          const { type: _, ...read } = event;
          this.call(() => this.o.onRead!(read));
        }
        return;
      }
    }
  }

  /** remember keeps key among the last REMEMBER_IDS delivered; true if it was there already. */
  private remember(key: string): boolean {
    if (this.ids.has(key)) return true;
    this.ids.add(key);
    if (this.ids.size > REMEMBER_IDS) this.ids.delete(this.ids.values().next().value!);
    return false;
  }

  private sendSeen(): void {
    const cursor = this.unseen!;
    this.unseen = undefined;
    if (this.conn?.send(JSON.stringify({ type: "seen", cursor }))) return;
    // Server-sent events carry nothing back: their seen is a request.
    this.host.request("POST", "/v1/stream/seen", { cursor }).catch(() => {});
  }

  /** backoff is full jitter: uniform in [0, min(max, min·2^attempt)). */
  private backoff(): number {
    return Math.random() * Math.min(this.host.maxDelay, this.host.minDelay * 2 ** this.attempt);
  }

  private retry(reason: StatusReason, delay: number, extra?: Partial<StreamStatus>): void {
    this.attempt++;
    this.schedule(delay, reason, extra);
  }

  private async end(gen: number, e: End, transport: TransportName, token: string): Promise<void> {
    this.conn = undefined;
    if (this.connectedAt && Date.now() - this.connectedAt >= HEALTHY_MS) this.attempt = 0;
    const wasConnected = this.connectedAt > 0;
    this.connectedAt = 0;
    let error = e.error;
    if (transport === "websocket") {
      if (e.opened) {
        this.wsFailures = 0;
      } else if (!error || error.code === "websocket") {
        // A WebSocket that did not open says nothing of why (a browser
        // hides the status): ask the API the same question over HTTP. The
        // request renews a refused token on its way.
        this.emit({ state: "connecting", reason: "network", transport, attempt: this.attempt });
        error = await this.probe();
        if (gen !== this.gen) return;
        if (!error) {
          if (this.host.tokens.current !== token) return this.retry("unauthorized", 0);
          if (this.host.transport === "auto" && (this.sse || ++this.wsFailures >= FALLBACK_AFTER)) {
            // Something between here and the server refuses upgrades (a
            // proxy, say): the same stream as server-sent events, trying a
            // WebSocket again at a reconnect WS_RETRY_MS later (once: a
            // failure then goes straight back).
            this.sse = true;
            this.wsAgainAt = Date.now() + WS_RETRY_MS;
            this.wsFailures = 0;
            return this.schedule(0, "transport");
          }
          return this.retry("network", this.backoff());
        }
      }
    }
    const base = { code: e.opened ? e.code : undefined, error };
    if (error) {
      const wait = Math.max((error.retryAfter ?? 0) * 1000, this.backoff());
      if (error instanceof InvalidCursorError && this.cursor) return this.reset(error);
      if (error instanceof UnauthorizedError) {
        this.host.tokens.refused(token);
        return this.retry("unauthorized", this.attempt === 0 ? 0 : this.backoff(), base);
      }
      if (error instanceof RateLimitedError || error instanceof TooManySocketsError) return this.retry("rate-limited", wait, base);
      if (error.code === "not-a-websocket" || error.code === "no-event-stream" || error.status === 505) {
        // This server serves no server-sent events (or not over HTTP/2): a WebSocket, if there is one.
        if (this.host.transport === "auto" && this.host.WebSocket && this.sse) {
          this.sse = false;
          this.wsAgainAt = 0;
          return this.schedule(0, "transport", base);
        }
        return this.fatal(error);
      }
      if (error instanceof NetworkError) return this.retry("network", this.backoff(), base);
      if (error instanceof UnavailableError || error.status >= 500) return this.retry("unavailable", wait, base);
      if (error.status >= 400) return this.fatal(error);
      return this.retry("network", this.backoff(), base);
    }
    switch (e.code) {
      case 1001:
        return this.retry("going-away", wasConnected && this.attempt === 0 ? 0 : this.backoff(), base);
      case 1008:
        if (this.cursor) return this.reset(undefined);
        break;
      case 1011:
      case 1013:
        return this.retry("unavailable", this.backoff(), base);
    }
    this.retry("network", this.backoff(), base);
  }

  private reset(error: InvalidCursorError | undefined): void {
    this.refused = { cursor: this.cursor!, error };
    this.cursor = null;
    this.retry("reset", 0, { error });
  }

  private fatal(error: SpoolcastError): void {
    this.closed = true;
    this.host.forget(this);
    this.emit({ state: "disconnected", reason: "fatal", transport: this.status.transport, attempt: this.attempt, error });
  }

  private async probe(): Promise<SpoolcastError | undefined> {
    const path = this.cursor ? "/v1/notifications?limit=1&since=" + encodeURIComponent(this.cursor) : "/v1/notifications/unread-count";
    try {
      await this.host.request("GET", path);
      return undefined;
    } catch (err) {
      return err as SpoolcastError;
    }
  }
}
