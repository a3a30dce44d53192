// The order useNotifications shows: the feed's (created_at with its
// microseconds, newest first, ties in the order of persistence), each id
// once, whichever way a notification came, a page or a live frame, and in
// whatever order they came.
import assert from "node:assert/strict";
import { test } from "node:test";
import type { Notification } from "@spoolcast/client";
import { merge } from "../src/order.ts";

const n = (id: string, createdAt: string): Notification => ({
  id, createdAt, type: "t", category: "c", title: id, body: "", data: {}, producer: "p", receivedAt: null, readAt: null, seenAt: null, archivedAt: null,
});
const ids = (items: readonly Notification[]) => items.map((x) => x.id).join(",");

test("a live notification goes on top, and one that committed late goes to its place in feed order", () => {
  const page = [n("c", "2026-12-03T10:00:03Z"), n("b", "2026-12-03T10:00:02.5Z"), n("a", "2026-12-03T10:00:02.000001Z")];
  let items = merge([], page, false);
  assert.equal(ids(items), "c,b,a");
  items = merge(items, [n("d", "2026-12-03T10:00:04.25Z")], true);
  assert.equal(ids(items), "d,c,b,a");
  // Microseconds count: .5 is after .000001, which a Date cannot tell from .000000.
  items = merge(items, [n("late", "2026-12-03T10:00:02.000002Z")], true);
  assert.equal(ids(items), "d,c,b,late,a");
  items = merge(items, [n("old", "2026-12-03T09:00:00+01:00")], true);
  assert.equal(ids(items), "d,c,b,late,a,old", "offsets are read");
});

test("notifications of one transaction share a created_at: live ones stack in commit order, pages keep theirs, and ids are never compared", () => {
  const at = "2026-12-03T10:00:00.123456Z";
  // Ids whose string order is not their order (a digit sorts before a letter in ASCII, after it in base64url).
  let items = merge([], [n("AAz", at)], true);
  items = merge(items, [n("AA0", at)], true);
  items = merge(items, [n("AA-", at)], true);
  assert.equal(ids(items), "AA-,AA0,AAz", "each later frame is newer");
  const page = merge([], [n("p3", at), n("p2", at), n("p1", at)], false);
  assert.equal(ids(page), "p3,p2,p1");
  assert.equal(ids(merge(page, [n("p0", at), n("older", "2026-12-03T09:59:59Z")], false)), "p3,p2,p1,p0,older", "the next page goes below");
});

test("each id once: a page that repeats what came live, or a frame that repeats a page, changes nothing", () => {
  const items = merge([], [n("b", "2026-12-03T10:00:02Z"), n("a", "2026-12-03T10:00:01Z")], false);
  assert.equal(merge(items, [n("b", "2026-12-03T10:00:02Z")], true), items, "the same array: nothing renders again");
  const more = merge(items, [n("a", "2026-12-03T10:00:01Z"), n("z", "2026-12-03T09:59:59Z"), n("a", "2026-12-03T10:00:01Z")], false);
  assert.equal(ids(more), "b,a,z");
});
