// The live stream against real replicas behind one address, over the ws
// package's WebSocket and over server-sent events read with fetch: each
// notification exactly once, in commit order, across a restart of every
// replica, a replica's kill with events posted while it was down, a
// dropped network with an expired token, and a refused cursor, which
// resets and reloads instead of going silent.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { WebSocket } from "ws";
import { SpoolcastClient, InvalidCursorError, RateLimitedError, type SpoolcastClientOptions, type StreamStatus } from "@spoolcast/client";
import { emit, env, foreignCursor, mint, proxy, range, record, replica, serverSentEvents, transports, user, waitFor, type Recording } from "./harness.ts";

const sse = env.control ? await serverSentEvents() : false;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, Math.max(0, ms)));

/** inFeedOrder checks what rec delivered against the feed: the same ids, oldest first. */
async function assertFeedMatches(client: SpoolcastClient, rec: Recording) {
  const feed = await client.notifications.list({ limit: 100 });
  assert.deepEqual(
    rec.notifications.map((n) => n.id),
    feed.data.map((n) => n.id).reverse(),
    "the ids delivered are the feed's, once each, oldest first",
  );
}

const statusesOf = (rec: Recording) => rec.statuses.map((s: StreamStatus) => `${s.state}/${s.reason}${s.code ? "/" + s.code : ""}`);

for (const mode of transports) {
  const sseMode = mode.options.transport === "sse";
  const skip = !env.control ? "no central: run through go test ./sdk/js/sdktest" : sseMode && !sse ? "central serves no server-sent events yet" : false;

  describe(`the stream over ${mode.name}`, { skip }, () => {
    const open = (u: string, extra: Partial<SpoolcastClientOptions> = {}) =>
      new SpoolcastClient({ baseUrl: env.base, token: () => mint(u), ...mode.options, ...extra });

    test("delivers each notification once, in commit order, across a restart of every replica", async (t) => {
      const u = user("restart");
      const client = open(u);
      t.after(() => client.close());
      const rec = record(client);
      const first = await rec.waitConnected(1);
      assert.equal(first.resumed, false, "no cursor: the app loads the first page now");
      assert.equal(first.transport, sseMode ? "sse" : "websocket");
      await emit(u, ...range("s", 1, 3));
      await rec.waitTitles(3);

      await Promise.all([replica.stop(0), replica.stop(1)]);
      assert.ok(rec.statuses.some((s) => s.reason === "going-away" && s.code === 1001), `a deploy closes with 1001: ${statusesOf(rec)}`);
      await Promise.all([replica.start(0), replica.start(1)]);
      await emit(u, ...range("s", 4, 6));
      await rec.waitTitles(6, 30_000);
      const resumed = await rec.waitConnected(2);
      assert.equal(resumed.resumed, true, "resumed from the last cursor");

      assert.deepEqual(rec.titles(), range("s", 1, 6));
      await assertFeedMatches(client, rec);
      assert.equal(rec.resets.length, 0);
    });

    test("resumes across a replica's kill with the events posted while it was down, once each", async (t) => {
      const u = user("kill");
      const client = open(u);
      t.after(() => client.close());
      const rec = record(client);
      await rec.waitConnected(1);
      await emit(u, "k1", "k2");
      await rec.waitTitles(2);

      await replica.kill(0); // the proxy sends every connection to replica 0 while it lives: the stream was there
      await emit(u, "k3", "k4", "k5"); // through replica 1, while the app reconnects
      await rec.waitTitles(5);
      await replica.start(0);
      await emit(u, "k6");
      await rec.waitTitles(6);

      assert.deepEqual(rec.titles(), range("k", 1, 6));
      await assertFeedMatches(client, rec);
      const after = rec.statuses.slice(rec.statuses.findIndex((s) => s.state === "connecting" && s.reason !== "connect"));
      assert.ok(after.some((s) => s.state === "connected" && s.resumed), `resumed after the kill: ${statusesOf(rec)}`);
      assert.equal(rec.connections(), 2, `one reconnection: ${statusesOf(rec)}`);
    });

    for (const [what, cursor] of [
      ["from another history of the database", () => foreignCursor()],
      ["malformed", async () => "bm90LWEtY3Vyc29y"],
    ] as const) {
      test(`a cursor ${what} is refused: the stream resets, tells the app to reload, and goes live`, async (t) => {
        const u = user("reset");
        await emit(u, "before");
        const client = open(u);
        t.after(() => client.close());
        const refused = await cursor();
        const rec = record(client, refused);
        const live = await rec.waitConnected(1);
        assert.equal(live.resumed, false);
        assert.equal(rec.resets.length, 1);
        assert.equal(rec.resets[0]!.cursor, refused);
        assert.ok(rec.resets[0]!.error instanceof InvalidCursorError, `the reset's error: ${rec.resets[0]!.error}`);
        assert.ok(rec.statuses.some((s) => s.state === "connecting" && s.reason === "reset"), statusesOf(rec).join(" "));
        assert.notEqual(rec.sub.cursor, refused);
        // The app reloads the first page, which holds what came before.
        assert.deepEqual((await client.notifications.list()).data.map((n) => n.title), ["before"]);
        await emit(u, "after");
        await rec.waitTitles(1);
        assert.deepEqual(rec.titles(), ["after"]);
      });
    }

    test("a token that expired while connected is renewed at the reconnect after a dropped network, and the stream resumes", async (t) => {
      const u = user("token");
      let calls = 0;
      const mintedAt = Date.now();
      // The first token's exp is 25 s past: the server's 30 s of leeway accept it for 5 s more.
      const client = open(u, { token: () => mint(u, ++calls === 1 ? -25 : 3600) });
      t.after(() => client.close());
      const rec = record(client);
      await rec.waitConnected(1);
      assert.equal(calls, 1, "connected with the first token");
      await emit(u, "t1");
      await rec.waitTitles(1);

      await sleep(mintedAt + 6_000 - Date.now()); // now the server refuses it
      await proxy.drop();
      await emit(u, "t2", "t3");
      await rec.waitTitles(3);
      assert.deepEqual(rec.titles(), ["t1", "t2", "t3"]);
      assert.equal(calls, 2, "asked once more, after the 401");
      assert.ok(rec.statuses.some((s) => s.reason === "unauthorized"), statusesOf(rec).join(" "));
      await assertFeedMatches(client, rec);
    });

    test("read frames from another session of the user reach onRead", async (t) => {
      const u = user("reads");
      const client = open(u);
      const other = open(u);
      t.after(() => (client.close(), other.close()));
      const rec = record(client);
      await rec.waitConnected(1);
      await emit(u, "r1", "r2");
      await rec.waitTitles(2);
      await other.notifications.markRead(rec.notifications[0]!.id);
      await waitFor("a read frame", () => rec.reads.length === 1);
      assert.deepEqual(rec.reads[0], { id: rec.notifications[0]!.id, unread: [] });
      const { readThrough } = await other.notifications.markAllRead();
      await waitFor("a read-all frame", () => rec.reads.length === 2);
      assert.deepEqual(rec.reads[1], { through: readThrough, unread: [] });
    });

    test("a handshake past the rate limit waits the server's Retry-After, then connects", async (t) => {
      const u = user("limited-stream");
      const token = await mint(u);
      const client = new SpoolcastClient({ baseUrl: env.limited, token: () => token, ...mode.options });
      t.after(() => client.close());
      // --rate-limit-user 1/s, in bursts of 2: spend them, then subscribe at once.
      for (let i = 0; i < 5; i++) {
        if (await client.notifications.unreadCount().then(() => false, (e: unknown) => e instanceof RateLimitedError)) break;
      }
      const rec = record(client);
      await rec.waitConnected(1, 10_000);
      const limited = rec.statuses.find((s) => s.reason === "rate-limited");
      assert.ok(limited, statusesOf(rec).join(" "));
      assert.ok(limited.error instanceof RateLimitedError);
      assert.ok(limited.error.retryAfter! >= 1 && limited.retryIn! >= limited.error.retryAfter! * 1000, JSON.stringify(limited));
    });
  });
}

describe("choosing the transport", { skip: !env.control ? "no central: run through go test ./sdk/js/sdktest" : !sse ? "central serves no server-sent events yet" : false }, () => {
  test("without a WebSocket class, auto uses server-sent events", async (t) => {
    const u = user("auto");
    const client = new SpoolcastClient({ baseUrl: env.base, token: () => mint(u) });
    t.after(() => client.close());
    const rec = record(client);
    assert.equal((await rec.waitConnected(1)).transport, "sse");
  });

  test("an event stream silent past idleTimeout is reopened, resuming each time, and delivers once each", async (t) => {
    const u = user("idle");
    // The server pings every 30 s: with 300 ms the stream is reopened again and again.
    const client = new SpoolcastClient({ baseUrl: env.base, token: () => mint(u), transport: "sse", idleTimeout: 300 });
    t.after(() => client.close());
    const rec = record(client);
    await rec.waitConnected(1);
    for (let i = 1; i <= 6; i++) {
      await emit(u, `i${i}`);
      await sleep(150);
    }
    await rec.waitTitles(6);
    await rec.waitConnected(3);
    assert.deepEqual(rec.titles(), range("i", 1, 6));
    assert.ok(rec.statuses.filter((s) => s.state === "connected").slice(1).every((s) => s.resumed), statusesOf(rec).join(" "));
    await assertFeedMatches(client, rec);
  });

  test("auto falls back to server-sent events when upgrades are refused, and resumes there once each", async (t) => {
    const u = user("fallback");
    const client = new SpoolcastClient({ baseUrl: env.base, token: () => mint(u), WebSocket, transport: "auto", reconnect: { maxDelay: 1000 } });
    t.after(() => client.close());
    const rec = record(client);
    assert.equal((await rec.waitConnected(1)).transport, "websocket");
    await emit(u, "f1");
    await rec.waitTitles(1);

    await proxy.refuseUpgrades(true);
    t.after(() => proxy.refuseUpgrades(false));
    await proxy.drop();
    await emit(u, "f2", "f3");
    const second = await rec.waitConnected(2);
    assert.equal(second.transport, "sse");
    assert.equal(second.resumed, true);
    await rec.waitTitles(3);
    assert.deepEqual(rec.titles(), ["f1", "f2", "f3"]);
    assert.ok(rec.statuses.some((s) => s.reason === "transport"), statusesOf(rec).join(" "));
    await assertFeedMatches(client, rec);
  });
});
