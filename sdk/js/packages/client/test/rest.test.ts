// The REST half of the client against real replicas: pages, marks and
// counts, devices and preferences, tokens renewed on a 401 and ahead of
// their exp, a 429 with its Retry-After, and errors typed by problem.
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  SpoolcastClient,
  ClientClosedError,
  InvalidCursorError,
  InvalidRequestError,
  NotFoundError,
  RateLimitedError,
  SpoolcastError,
  UnauthorizedError,
  NetworkError,
} from "@spoolcast/client";
import { emit, env, mint, needsServer, range, user } from "./harness.ts";

function clientFor(u: string, extra: Partial<ConstructorParameters<typeof SpoolcastClient>[0]> = {}) {
  return new SpoolcastClient({ baseUrl: env.base, token: () => mint(u), transport: "sse", ...extra });
}

test("pages walk the feed newest first by limit and cursor, and say when there is more", needsServer, async (t) => {
  const u = user("pages");
  const client = clientFor(u);
  t.after(() => client.close());
  await emit(u, ...range("p", 1, 5));

  const first = await client.notifications.list({ limit: 2 });
  assert.deepEqual(first.data.map((n) => n.title), ["p5", "p4"]);
  assert.equal(first.hasMore, true);
  assert.ok(first.nextCursor);
  assert.ok(first.refreshCursor, "a first page carries a refresh cursor");
  const n = first.data[0]!;
  assert.equal(n.type, "sdk.test");
  assert.equal(n.category, "sdk");
  assert.equal(n.readAt, null);
  assert.match(n.createdAt, /^\d{4}-\d\d-\d\dT/);
  assert.deepEqual(n.data, {});
  assert.equal("created_at" in n, false, "camelCase only");

  const second = await client.notifications.list({ limit: 2, cursor: first.nextCursor });
  assert.deepEqual(second.data.map((n) => n.title), ["p3", "p2"]);
  assert.equal(second.hasMore, true);
  const last = await client.notifications.list({ limit: 2, cursor: second.nextCursor });
  assert.deepEqual(last.data.map((n) => n.title), ["p1"]);
  assert.equal(last.hasMore, false);
  assert.equal(last.nextCursor, null);
  assert.equal(last.refreshCursor, undefined, "only a first page carries a refresh cursor");

  // What commits later comes oldest first from the refresh cursor.
  await emit(u, "p6", "p7");
  const newer = await client.notifications.list({ since: first.refreshCursor! });
  assert.deepEqual(newer.data.map((n) => n.title), ["p6", "p7"]);

  const all = await client.notifications.list();
  assert.equal(all.data.length, 7);
  assert.equal(new Set(all.data.map((n) => n.id)).size, 7);

  await assert.rejects(client.notifications.list({ limit: 0 }), (e: unknown) => e instanceof InvalidRequestError && e.status === 400 && e.code === "invalid-query" && e.field === "limit");
  await assert.rejects(client.notifications.list({ cursor: "not-a-cursor" }), (e: unknown) => e instanceof InvalidCursorError && e.field === "cursor");
});

test("marks read one and all move the unread count, and another user's id is not found", needsServer, async (t) => {
  const u = user("marks");
  const client = clientFor(u);
  t.after(() => client.close());
  await emit(u, ...range("m", 1, 4));
  assert.deepEqual(await client.notifications.unreadCount(), { count: 4, capped: false });

  const { data } = await client.notifications.list();
  await client.notifications.markRead(data[1]!.id);
  await client.notifications.markRead(data[1]!.id); // again: still fine
  assert.deepEqual(await client.notifications.unreadCount(), { count: 3, capped: false });
  const unread = await client.notifications.list({ unread: true });
  assert.deepEqual(unread.data.map((n) => n.title), ["m4", "m2", "m1"]);

  const other = clientFor(user("someone-else"));
  t.after(() => other.close());
  await assert.rejects(other.notifications.markRead(data[0]!.id), (e: unknown) => e instanceof NotFoundError && e.status === 404 && e.code === "not-found");

  const { readThrough } = await client.notifications.markAllRead();
  assert.equal(readThrough, data[0]!.id, "read-all reaches the newest");
  assert.deepEqual(await client.notifications.unreadCount(), { count: 0, capped: false });
  const after = await client.notifications.list();
  assert.equal(after.data.filter((n) => n.readAt === null).length, 0);
  await emit(u, "m5");
  assert.deepEqual(await client.notifications.unreadCount(), { count: 1, capped: false });

  const empty = clientFor(user("empty"));
  t.after(() => empty.close());
  assert.deepEqual(await empty.notifications.markAllRead(), { readThrough: null });
});

test("devices register, list and unregister, and preferences merge in camelCase", needsServer, async (t) => {
  const u = user("devices");
  const client = clientFor(u, { platform: "android" });
  t.after(() => client.close());
  const token = `ExponentPushToken[sdk-${u}]`;
  const device = await client.devices.registerExpo(token);
  assert.equal(device.token, token);
  assert.equal(device.platform, "android");
  assert.equal(device.provider, "expo");
  assert.equal(device.enabled, true);
  assert.equal(device.disabledReason, null);
  assert.ok(device.lastSeenAt && device.createdAt);
  assert.equal((await client.devices.registerExpo(token, "ios")).platform, "ios");
  await client.devices.unregister(token);
  const [listed] = await client.devices.list();
  assert.equal(listed?.enabled, false);
  assert.equal(listed?.disabledReason, "user_request");
  await assert.rejects(client.devices.registerExpo("not-an-expo-token"), (e: unknown) => e instanceof InvalidRequestError && e.code === "invalid-token" && e.field === "token");
  const noPlatform = clientFor(u);
  t.after(() => noPlatform.close());
  await assert.rejects(noPlatform.devices.registerExpo(token), (e: unknown) => e instanceof SpoolcastError && e.code === "no-platform" && e.status === 0);
  // This deployment has no VAPID key: the browser's subscription reaches the web branch and is refused there.
  await assert.rejects(
    client.devices.registerWebPush({ toJSON: () => ({ endpoint: "https://push.example.com/x", keys: { p256dh: "a", auth: "b" } }) }),
    (e: unknown) => e instanceof InvalidRequestError && e.field === "platform",
  );
  await assert.rejects(client.devices.vapidPublicKey(), NotFoundError);
  // Neither APNs nor FCM is set up on this deployment: the provider is named.
  await assert.rejects(client.devices.registerApns("a".repeat(64)), (e: unknown) => e instanceof InvalidRequestError && e.field === "provider");
  await assert.rejects(client.devices.registerFcm("f".repeat(140)), (e: unknown) => e instanceof InvalidRequestError && e.field === "provider");

  assert.deepEqual(await client.preferences.get(), { categories: {}, quietHours: null });
  const set = await client.preferences.update({
    categories: { Billing_Updates: { push: false } },
    quietHours: { start: "22:00", end: "07:00", timeZone: "Europe/Berlin" },
  });
  assert.deepEqual(set, { categories: { Billing_Updates: { push: false } }, quietHours: { start: "22:00", end: "07:00", timeZone: "Europe/Berlin" } });
  const merged = await client.preferences.update({ categories: { chat: { push: true } } });
  assert.deepEqual(merged.categories, { Billing_Updates: { push: false }, chat: { push: true } }, "category names are kept as they are");
  assert.deepEqual(merged.quietHours, set.quietHours, "quietHours absent are kept");
  assert.equal((await client.preferences.update({ quietHours: null })).quietHours, null);
  await assert.rejects(client.preferences.update({ quietHours: { start: "24:00", end: "07:00", timeZone: "Europe/Berlin" } }), InvalidRequestError);
});

test("an expired token is replaced after the 401, once, and a token refused again is an UnauthorizedError", needsServer, async (t) => {
  const u = user("expired");
  const tokens = [await mint(u, -120), await mint(u)];
  let calls = 0;
  const client = clientFor(u, { token: () => tokens[Math.min(calls++, 1)]! });
  t.after(() => client.close());
  await emit(u, "x1");
  assert.deepEqual((await client.notifications.list()).data.map((n) => n.title), ["x1"]);
  assert.equal(calls, 2, "the expired token, then one more after its 401");
  await client.notifications.unreadCount();
  assert.equal(calls, 2, "the new token is kept");

  let refusedCalls = 0;
  const expired = await mint(u, -120);
  const refused = clientFor(u, { token: () => (refusedCalls++, expired) });
  t.after(() => refused.close());
  await assert.rejects(refused.notifications.unreadCount(), (e: unknown) => e instanceof UnauthorizedError && e.status === 401 && /expired/.test(e.message));
  assert.equal(refusedCalls, 2, "asked once more after the 401, not in a loop");
});

test("a token is renewed ahead of its exp, and callers waiting together share one renewal", needsServer, async (t) => {
  const u = user("ahead");
  let calls = 0;
  const client = clientFor(u, {
    token: async () => {
      calls++;
      await new Promise((r) => setTimeout(r, 50));
      return mint(u, 2); // lives 2 s: renewed after 1
    },
  });
  t.after(() => client.close());
  await Promise.all(Array.from({ length: 5 }, () => client.notifications.unreadCount()));
  assert.equal(calls, 1, "five calls at once, one token");
  await client.notifications.unreadCount();
  assert.equal(calls, 1);
  await new Promise((r) => setTimeout(r, 1100));
  await client.notifications.unreadCount();
  assert.equal(calls, 2, "renewed before it expired, without a 401");
});

test("past the user's rate limit a call is a RateLimitedError carrying Retry-After", needsServer, async (t) => {
  const u = user("limited");
  const client = new SpoolcastClient({ baseUrl: env.limited, token: await mint(u).then((tok) => () => tok), transport: "sse" });
  t.after(() => client.close());
  // --rate-limit-user 1/s: bursts of 2.
  const results = [];
  for (let i = 0; i < 3; i++) results.push(await client.notifications.unreadCount().then(() => "ok", (e: unknown) => e));
  assert.deepEqual(results.slice(0, 2), ["ok", "ok"]);
  const err = results[2];
  assert.ok(err instanceof RateLimitedError, `the third: ${err}`);
  assert.equal(err.status, 429);
  assert.equal(err.code, "rate-limited");
  assert.ok(err.retryAfter !== undefined && err.retryAfter >= 1, `retryAfter ${err.retryAfter}`);
  await new Promise((r) => setTimeout(r, err.retryAfter! * 1000));
  assert.deepEqual(await client.notifications.unreadCount(), { count: 0, capped: false }, "served again after Retry-After");
});

test("no answer is a NetworkError, and a closed client throws ClientClosedError", async () => {
  const client = new SpoolcastClient({ baseUrl: "http://127.0.0.1:9", token: () => "t", transport: "sse" });
  await assert.rejects(client.notifications.unreadCount(), (e: unknown) => e instanceof NetworkError && e.code === "network" && e.cause !== undefined);
  client.close();
  client.close();
  await assert.rejects(client.notifications.list(), ClientClosedError);
  assert.throws(() => client.subscribe({ onNotification() {} }), ClientClosedError);
});
