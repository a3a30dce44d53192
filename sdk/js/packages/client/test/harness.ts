// What the tests against a real central share: the addresses the Go driver
// (sdk/js/sdktest) passes in the environment, its control server (tokens,
// events, replicas, the proxy), and a recorder of what a subscription
// delivers. Without the driver those tests skip: run them with
// `go test ./sdk/js/sdktest`.
import { randomUUID } from "node:crypto";
import { WebSocket } from "ws";
import type { SpoolcastClientOptions, StreamStatus, Subscription, SpoolcastClient, Notification, ResetInfo, ReadEvent, StateEvent } from "@spoolcast/client";

export const env = {
  base: process.env.SPOOLCAST_SDK_BASE ?? "",
  control: process.env.SPOOLCAST_SDK_CONTROL ?? "",
  limited: process.env.SPOOLCAST_SDK_LIMITED ?? "",
  /** Each replica behind the proxy, by its own address: a client there writes through that replica alone. */
  replicas: (process.env.SPOOLCAST_SDK_REPLICAS ?? "").split(",").filter(Boolean),
};

/** The options of tests that need the real server: skipped without it. */
export const needsServer = env.control ? {} : { skip: "no central: run through go test ./sdk/js/sdktest" };

async function control<T>(path: string, body: object = {}): Promise<T> {
  const res = await fetch(env.control + path, { method: "POST", body: JSON.stringify(body) });
  if (!res.ok) throw new Error(`control ${path}: HTTP ${res.status}: ${await res.text()}`);
  return (await res.json()) as T;
}

/** user makes a user id of the test's own, so tests never see each other's notifications. */
export const user = (name: string) => `${name}-${randomUUID().slice(0, 8)}`;

/** mint signs a token for user expiring ttl seconds from now (negative: in the past). */
export const mint = async (user: string, ttl = 3600) => (await control<{ token: string }>("/token", { user, ttl })).token;

/** emit posts one event per title, each committed before the next is posted. */
export const emit = (user: string, ...titles: string[]) => control("/emit", { user, titles });

export const replica = {
  stop: (i: number) => control(`/replicas/${i}/stop`),
  kill: (i: number) => control(`/replicas/${i}/kill`),
  start: (i: number) => control(`/replicas/${i}/start`),
};

export const proxy = {
  drop: () => control("/proxy/drop"),
  refuseUpgrades: (on: boolean) => control("/proxy/refuse-upgrades", { on }),
};

/** setTopic does what a service does: creates the topic, opens or closes it, and adds members. */
export const setTopic = (topic: string, open: boolean, members: string[] = []) => control(`/topics/${topic}`, { on: open, members });

export const foreignCursor = async () => (await control<{ cursor: string }>("/foreign-cursor")).cursor;

/** The transports every stream case runs over. */
export const transports: { name: string; options: Partial<SpoolcastClientOptions> }[] = [
  { name: "WebSocket (the ws package)", options: { transport: "websocket", WebSocket } },
  { name: "server-sent events (fetch)", options: { transport: "sse" } },
];

/** serverSentEvents tells whether central serves GET /v1/stream as server-sent events yet. */
export async function serverSentEvents(): Promise<boolean> {
  const ac = new AbortController();
  const res = await fetch(env.base + "/v1/stream", {
    headers: { Accept: "text/event-stream", Authorization: "Bearer " + (await mint(user("probe"))) },
    signal: ac.signal,
  });
  ac.abort();
  return res.ok && /^text\/event-stream/.test(res.headers.get("Content-Type") ?? "");
}

/** statesServed tells whether central keeps the states (seen, read, archived) and their counts yet. */
export async function statesServed(): Promise<boolean> {
  const res = await fetch(env.base + "/v1/notifications/counts", { headers: { Authorization: "Bearer " + (await mint(user("probe"))) } });
  await res.body?.cancel();
  return res.ok;
}

/** The options of tests that need central to keep the states: skipped without them. */
export const needsStates = !env.control
  ? { skip: "no central: run through go test ./sdk/js/sdktest" }
  : !(await statesServed())
    ? { skip: "central keeps no archive and counts yet" }
    : {};

/**
 * waitFor polls cond until it holds, or throws naming what it waited for.
 * Its deadline runs on the monotonic clock: the machine's wall clock may be
 * stepped while a test waits (a CI run saw a wait of 0.6 s time out at 20).
 */
export async function waitFor(what: string, cond: () => boolean, timeoutMs = 20_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!cond()) {
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Recording is what one subscription delivered and said, in order. */
export interface Recording {
  sub: Subscription;
  notifications: Notification[];
  titles(): string[];
  statuses: StreamStatus[];
  resets: ResetInfo[];
  reads: ReadEvent[];
  /** Every state change, with the cursor of its frame. */
  states: { event: StateEvent; cursor: string | null }[];
  /** connections counts the connected statuses so far. */
  connections(): number;
  /** waitTitles waits until n notifications were delivered. */
  waitTitles(n: number, timeoutMs?: number): Promise<void>;
  /** waitConnected waits for the n-th connected status (1: the first). */
  waitConnected(n?: number, timeoutMs?: number): Promise<StreamStatus>;
}

/** record subscribes and records everything the subscription reports. */
export function record(client: SpoolcastClient, cursor?: string | null): Recording {
  const r = {
    notifications: [] as Notification[],
    statuses: [] as StreamStatus[],
    resets: [] as ResetInfo[],
    reads: [] as ReadEvent[],
    states: [] as { event: StateEvent; cursor: string | null }[],
  };
  const sub = client.subscribe({
    cursor,
    onNotification: (n) => r.notifications.push(n),
    onStatus: (s) => r.statuses.push(s),
    onReset: (info) => r.resets.push(info),
    onRead: (e) => r.reads.push(e),
    onState: (event, { cursor }) => r.states.push({ event, cursor }),
  });
  const connected = () => r.statuses.filter((s) => s.state === "connected");
  return {
    ...r,
    sub,
    titles: () => r.notifications.map((n) => n.title),
    connections: () => connected().length,
    async waitTitles(n, timeoutMs) {
      await waitFor(`${n} notifications (have ${JSON.stringify(r.notifications.map((x) => x.title))}; last status ${JSON.stringify(r.statuses.at(-1))})`, () => r.notifications.length >= n, timeoutMs);
    },
    async waitConnected(n = 1, timeoutMs) {
      await waitFor(`connection ${n} (statuses ${JSON.stringify(r.statuses.map((s) => `${s.state}/${s.reason}`))})`, () => connected().length >= n, timeoutMs);
      return connected()[n - 1]!;
    },
  };
}

/** range names titles prefix1…prefixN. */
export const range = (prefix: string, from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => `${prefix}${from + i}`);
