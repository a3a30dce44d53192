// The states (seen, read, archived) against real replicas: the lists by
// status, the marks and their counts over REST, and every change reaching
// another session's subscription through another replica as a typed
// onState event with its cursor, onRead still told the reads, and a
// resume replaying the changes made while it was away, once each, in
// order, over both transports.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { SpoolcastClient, NotFoundError, type SpoolcastClientOptions, type StateEvent } from "@spoolcast/client";
import { emit, env, mint, needsStates, proxy, range, record, transports, user, waitFor, type Recording } from "./harness.ts";

/** A client of user u through one address: the proxy (replica 0 while it lives), or a replica's own. */
function clientOf(u: string, baseUrl = env.base, extra: Partial<SpoolcastClientOptions> = {}) {
  return new SpoolcastClient({ baseUrl, token: () => mint(u), transport: "sse", ...extra });
}

const titles = async (client: SpoolcastClient, status?: "all" | "unread" | "archived") =>
  (await client.notifications.list({ limit: 100, ...(status ? { status } : {}) })).data.map((n) => n.title);

/** events is what rec was told of the states, without the cursors. */
const events = (rec: Recording) => rec.states.map((s) => s.event);

describe("the states over REST", needsStates, () => {
  test("archive takes a notification out of all and unread into archived, unarchive brings it back, and the counts follow", async (t) => {
    const u = user("archive");
    const client = clientOf(u);
    t.after(() => client.close());
    await emit(u, ...range("a", 1, 4));
    const [a4, a3, a2] = (await client.notifications.list()).data;
    assert.equal(a4!.archivedAt, null);
    assert.equal(a4!.seenAt, null);
    assert.deepEqual(await client.notifications.counts(), { unread: { count: 4, capped: false }, unseen: { count: 4, capped: false } });

    await client.notifications.archive(a3!.id);
    await client.notifications.archive(a3!.id); // again: still fine
    await client.notifications.markRead(a2!.id);
    assert.deepEqual(await titles(client), ["a4", "a2", "a1"], "all leaves the archived out");
    assert.deepEqual(await titles(client, "all"), ["a4", "a2", "a1"]);
    assert.deepEqual(await titles(client, "unread"), ["a4", "a1"]);
    assert.deepEqual(await titles(client, "archived"), ["a3"]);
    const [archived] = (await client.notifications.list({ status: "archived" })).data;
    assert.match(archived!.archivedAt ?? "", /^\d{4}-\d\d-\d\dT/);
    const counts = await client.notifications.counts({ archived: true });
    assert.deepEqual(counts.unread, { count: 2, capped: false });
    assert.deepEqual(counts.archived, { count: 1, capped: false });

    await client.notifications.unarchive(a3!.id);
    await client.notifications.markUnread(a2!.id);
    assert.deepEqual(await titles(client), ["a4", "a3", "a2", "a1"]);
    assert.deepEqual(await titles(client, "unread"), ["a4", "a3", "a2", "a1"]);
    assert.deepEqual(await titles(client, "archived"), []);
    assert.deepEqual((await client.notifications.counts({ archived: true })).archived, { count: 0, capped: false });

    const other = clientOf(user("someone-else"));
    t.after(() => other.close());
    for (const mark of [other.notifications.archive, other.notifications.unarchive, other.notifications.markUnread]) {
      await assert.rejects(mark(a4!.id), NotFoundError, "another user's id is not found");
    }
  });

  test("archive-all archives everything committed when it is asked, and the counts are capped as the unread count is", async (t) => {
    const u = user("archive-all");
    const client = clientOf(u);
    t.after(() => client.close());
    await emit(u, ...range("b", 1, 3));
    const { archivedThrough } = await client.notifications.archiveAll();
    assert.equal(archivedThrough, (await client.notifications.list({ status: "archived" })).data[0]!.id, "through the newest");
    assert.deepEqual(await titles(client), []);
    assert.deepEqual(await titles(client, "archived"), ["b3", "b2", "b1"]);
    await emit(u, "b4");
    assert.deepEqual(await titles(client), ["b4"], "what comes later is not archived");
    const counts = await client.notifications.counts({ archived: true });
    assert.deepEqual(counts, { unread: { count: 1, capped: false }, unseen: { count: 1, capped: false }, archived: { count: 3, capped: false } });

    const many = user("many");
    const busy = clientOf(many);
    t.after(() => busy.close());
    await emit(many, ...range("m", 1, 101));
    assert.deepEqual((await busy.notifications.counts()).unread, { count: 100, capped: true });
    assert.deepEqual((await busy.notifications.unreadCount()), { count: 100, capped: true });

    const empty = clientOf(user("empty"));
    t.after(() => empty.close());
    assert.deepEqual(await empty.notifications.archiveAll(), { archivedThrough: null });
  });
});

for (const mode of transports) {
  describe(`state changes over ${mode.name}`, needsStates, () => {
    test("each change made in another session, through another replica, reaches onState with its cursor, and onRead still gets the reads", async (t) => {
      const u = user("states");
      const client = clientOf(u, env.base, mode.options);
      // Another session of the user, on replica 1 alone: the stream is on replica 0 (the proxy's first).
      const other = clientOf(u, env.replicas[1]);
      t.after(() => (client.close(), other.close()));
      const rec = record(client);
      await rec.waitConnected(1);
      await emit(u, "s1", "s2", "s3");
      await rec.waitTitles(3);
      const [s1, s2, s3] = rec.notifications.map((n) => n.id) as [string, string, string];

      await other.notifications.markRead(s1);
      await other.notifications.markUnread(s1);
      await other.notifications.archive(s2);
      await other.notifications.unarchive(s2);
      const { readThrough } = await other.notifications.markAllRead();
      const { archivedThrough } = await other.notifications.archiveAll();
      assert.equal(readThrough, s3);
      assert.equal(archivedThrough, s3);
      await waitFor(`six changes (have ${JSON.stringify(events(rec))})`, () => rec.states.length >= 6);
      const want: StateEvent[] = [
        { type: "read", id: s1, unread: [] },
        { type: "unread", id: s1 },
        { type: "archived", id: s2, unarchived: [] },
        { type: "unarchived", id: s2 },
        { type: "read", through: s3, unread: [] },
        { type: "archived", through: s3, unarchived: [] },
      ];
      assert.deepEqual(events(rec), want, "each change once, in the order made");
      assert.ok(rec.states.every((s) => typeof s.cursor === "string" && s.cursor), "every state frame carries a cursor");
      assert.equal(new Set(rec.states.map((s) => s.cursor)).size, 6);
      assert.equal(rec.sub.cursor, rec.states.at(-1)!.cursor, "the stream's cursor is the last change's");
      assert.deepEqual(rec.reads, [{ id: s1, unread: [] }, { through: s3, unread: [] }], "onRead gets the reads alone");
      assert.deepEqual((await other.notifications.counts()).unread, { count: 0, capped: false });
    });

    test("seen from one session reaches the others as a seen change, and the unseen count follows", async (t) => {
      const u = user("seen");
      const client = clientOf(u, env.base, mode.options);
      const other = clientOf(u, env.replicas[1], { transport: "sse" });
      t.after(() => (client.close(), other.close()));
      const rec = record(client);
      const watcher = record(other);
      await Promise.all([rec.waitConnected(1), watcher.waitConnected(1)]);
      await emit(u, "n1", "n2");
      await rec.waitTitles(2);
      await watcher.waitTitles(2);
      assert.deepEqual((await client.notifications.counts()).unseen, { count: 2, capped: false });
      rec.sub.seen();
      await waitFor(`a seen change in the other session (have ${JSON.stringify(events(watcher))})`, () => watcher.states.some((s) => s.event.type === "seen"));
      const seen = watcher.states.find((s) => s.event.type === "seen")!;
      assert.ok(seen.cursor);
      assert.deepEqual((await other.notifications.counts()).unseen, { count: 0, capped: false });
      await emit(u, "n3");
      assert.deepEqual((await other.notifications.counts()).unseen, { count: 1, capped: false }, "what comes later is unseen");
    });

    test("a resume replays the changes made while the stream was away, once each, in order, after the notifications they follow", async (t) => {
      const u = user("replay");
      const client = clientOf(u, env.base, mode.options);
      const other = clientOf(u, env.replicas[1]);
      t.after(() => (client.close(), other.close()));
      let rec = record(client);
      await rec.waitConnected(1);
      await emit(u, "r1", "r2");
      await rec.waitTitles(2);
      const [r1, r2] = rec.notifications.map((n) => n.id) as [string, string];
      await other.notifications.markRead(r1);
      await waitFor("the first change", () => rec.states.length === 1);

      // The app goes away, keeping its cursor; another session changes things meanwhile.
      const cursor = rec.sub.cursor;
      assert.equal(cursor, rec.states[0]!.cursor);
      rec.sub.close();
      await other.notifications.archive(r2);
      await emit(u, "r3");
      await other.notifications.markAllRead();
      rec = record(client, cursor);
      const back = await rec.waitConnected(1);
      assert.equal(back.resumed, true);
      await waitFor(`the changes replayed (have ${JSON.stringify(events(rec))})`, () => rec.states.length >= 2 && rec.notifications.length >= 1);
      assert.deepEqual(rec.titles(), ["r3"], "the notification missed, once");
      const r3 = rec.notifications[0]!.id;
      assert.deepEqual(events(rec), [
        { type: "archived", id: r2, unarchived: [] },
        { type: "read", through: r3, unread: [] },
      ]);

      // Dropped again right after: nothing is replayed twice.
      await proxy.drop();
      await rec.waitConnected(2);
      await other.notifications.markUnread(r1);
      await waitFor("the change after the drop", () => rec.states.length === 3);
      assert.deepEqual(events(rec)[2], { type: "unread", id: r1 });
      assert.equal(rec.notifications.length, 1);
      assert.equal(new Set(rec.states.map((s) => s.cursor)).size, 3, "each change once");
    });
  });
}
