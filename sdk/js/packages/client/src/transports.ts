// The two ways to reach GET /v1/stream: a WebSocket, and server-sent events
// read from a fetch response. Each only moves frames; what to do when one
// ends is the stream's decision (stream.ts), made the same way for both.

import { errorFromResponse, NetworkError, SpoolcastError } from "./errors.js";
import { EventStreamParser } from "./event_stream.js";
import type { WireNotification } from "./types.js";

/** The subprotocol that carries the token beside it (docs/api.md, the live stream). */
export const PROTOCOL = "spoolcast.bearer.v1";

/**
 * What the SDK needs of a WebSocket: the browser's, React Native's, or the
 * `ws` package's (pass its class as the `WebSocket` option in Node).
 */
export interface WebSocketLike {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((event: any) => void) | null;
  onmessage: ((event: any) => void) | null;
  onclose: ((event: any) => void) | null;
  onerror: ((event: any) => void) | null;
}

/** A WebSocket class: `new WebSocket(url, protocols)`. */
export type WebSocketConstructor = new (url: string, protocols: string[]) => WebSocketLike;

/** A frame of the stream, as the server sends it (`close` is SSE's form of a WebSocket close). @internal */
export type Frame =
  | { type: "notification"; data: WireNotification; cursor: string }
  | { type: "ready"; cursor: string }
  | { type: "read" | "unread" | "archived" | "unarchived" | "seen"; id?: string; through?: string; unread?: string[] | null; unarchived?: string[] | null; cursor?: string }
  | { type: "close"; code: number; reason?: string };

/** How a connection ended. @internal */
export interface End {
  /** The upgrade happened, or the event stream's 200 came. */
  opened: boolean;
  /** The close code (the WebSocket's, or an SSE close frame's); 1006 when it broke without one. */
  code?: number;
  reason?: string;
  /** Why it failed, when that is known: an SSE refusal, a network error. */
  error?: SpoolcastError;
}

/** @internal */
export interface Sink {
  frame(frame: Frame): void;
  end(end: End): void;
}

/** @internal */
export interface Connection {
  /** send writes a text frame if the connection can (a WebSocket, open). */
  send(text: string): boolean;
  close(): void;
}

function parse(text: unknown): Frame | undefined {
  try {
    const frame = JSON.parse(String(text)) as Frame;
    return frame && typeof frame.type === "string" ? frame : undefined;
  } catch {
    return undefined;
  }
}

/** The text frame that asks the server for a `{"type":"pong"}`. */
const PING = '{"type":"ping"}';

/**
 * openWebSocket connects to url with the token as a subprotocol. A socket
 * quiet for a third of idleTimeout asks the server for a pong (browsers and
 * React Native hide the server's own pings); one quiet for all of it is
 * half-open (a laptop that slept, a network that changed) and ends as a drop,
 * code 1006. idleTimeout 0: never. @internal
 */
export function openWebSocket(WS: WebSocketConstructor, url: string, token: string, sink: Sink, idleTimeout = 0): Connection {
  let ws: WebSocketLike;
  try {
    ws = new WS(url, [PROTOCOL, token]);
  } catch (err) {
    // A token a browser refuses as a subprotocol; never repeat its message, which holds the token.
    setTimeout(() => sink.end({ opened: false, error: new SpoolcastError("the WebSocket could not be created", { code: "websocket" }) }));
    return { send: () => false, close() {} };
  }
  let opened = false;
  let ended = false;
  let ping: ReturnType<typeof setTimeout> | undefined;
  let idle: ReturnType<typeof setTimeout> | undefined;
  const quiet = () => {
    clearTimeout(ping);
    clearTimeout(idle);
    if (idleTimeout <= 0 || ended) return;
    ping = setTimeout(() => ws.readyState === 1 && ws.send(PING), idleTimeout / 3);
    idle = setTimeout(() => {
      end({ opened, code: 1006, reason: "no frame for " + idleTimeout + " ms" });
      try {
        ws.close();
      } catch {
        // already closing
      }
    }, idleTimeout);
  };
  const end = (e: End) => {
    if (!ended) {
      ended = true;
      clearTimeout(ping);
      clearTimeout(idle);
      sink.end(e);
    }
  };
  ws.onopen = () => {
    opened = true;
    quiet();
  };
  ws.onmessage = (event: { data: unknown }) => {
    quiet();
    const frame = parse(event.data);
    if (frame && !ended) sink.frame(frame);
  };
  ws.onclose = (event: { code?: number; reason?: string }) => end({ opened, code: event.code || 1006, reason: event.reason });
  // Always set, even after close: the ws package throws an error event nobody listens to.
  ws.onerror = () => {};
  return {
    send(text) {
      if (ws.readyState !== 1) return false;
      ws.send(text);
      return true;
    },
    close() {
      ended = true;
      clearTimeout(ping);
      clearTimeout(idle);
      try {
        ws.close(1000);
      } catch {
        // already closed
      }
    },
  };
}

/** What openEventStream needs of the client. @internal */
export interface EventStreamOptions {
  fetch: typeof fetch;
  url: string;
  headers: Record<string, string>;
  /** Abort a stream silent this long (ms): the server sends heartbeat comments. 0: never. */
  idleTimeout: number;
}

/**
 * openEventStream reads the stream as server-sent events over fetch: the
 * response body is read as it comes and parsed here, so it needs a fetch
 * whose responses stream (browsers, Node 18+; not React Native's, which
 * has a WebSocket).
 * @internal
 */
export function openEventStream(o: EventStreamOptions, sink: Sink): Connection {
  const abort = new AbortController();
  let ended = false;
  const end = (e: End) => {
    if (!ended) {
      ended = true;
      clearTimeout(idle);
      sink.end(e);
    }
  };
  let idle: ReturnType<typeof setTimeout> | undefined;
  const alive = () => {
    clearTimeout(idle);
    if (o.idleTimeout > 0) idle = setTimeout(() => abort.abort(), o.idleTimeout);
  };
  (async () => {
    let res: Response;
    try {
      res = await o.fetch(o.url, { headers: { ...o.headers, Accept: "text/event-stream" }, signal: abort.signal });
    } catch (err) {
      return end({ opened: false, error: new NetworkError("the stream could not be reached", { code: "network", cause: err }) });
    }
    if (!res.ok || !res.body || !/^text\/event-stream/i.test(res.headers.get("Content-Type") ?? "")) {
      const error = res.ok
        ? new SpoolcastError("the server does not serve the stream as server-sent events", { code: "no-event-stream", status: res.status })
        : await errorFromResponse(res);
      return end({ opened: false, error });
    }
    let close: End | undefined;
    const parser = new EventStreamParser((event) => {
      const frame = parse(event.data);
      if (!frame || ended || close) return;
      if (frame.type === "close") close = { opened: true, code: frame.code, reason: frame.reason };
      else sink.frame(frame);
    });
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    alive();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done || ended) break;
        alive();
        parser.push(decoder.decode(value, { stream: true }));
      }
      end(close ?? { opened: true, code: 1006 });
    } catch (err) {
      end(close ?? { opened: true, code: 1006, error: new NetworkError("the stream broke", { code: "network", cause: err }) });
    } finally {
      reader.cancel().catch(() => {});
    }
  })();
  return {
    send: () => false,
    close() {
      ended = true;
      clearTimeout(idle);
      abort.abort();
    },
  };
}
