// The order useNotifications shows: the feed's (created_at with its
// microseconds, newest first), each id once, whichever way a notification
// came, a page or a live frame, and in whatever order they came.
import assert from "node:assert/strict";
import { test } from "node:test";
import type { Notification } from "@spoolcast/client";
import { merge } from "../src/store.ts";

const n = (id: string, createdAt: string): Notification => ({
  id, createdAt, type: "t", category: "c", title: id, body: "", data: {}, producer: "p", receivedAt: null, readAt: null,
});
const ids = (items: readonly Notification[]) => items.map((x) => x.id).join(",");

test("a live notification goes on top, and one that committed late goes to its place in feed order", () => {
  const page = [n("c", "2026-12-03T10:00:03Z"), n("b", "2026-12-03T10:00:02.5Z"), n("a", "2026-12-03T10:00:02.000001Z")];
  let items = merge([], page);
  assert.equal(ids(items), "c,b,a");
  items = merge(items, [n("d", "2026-12-03T10:00:04.25Z")]);
  assert.equal(ids(items), "d,c,b,a");
  // Microseconds count: .5 is after .000001, which a Date cannot tell from .000000.
  items = merge(items, [n("late", "2026-12-03T10:00:02.000002Z")]);
  assert.equal(ids(items), "d,c,b,late,a");
  items = merge(items, [n("old", "2026-12-03T09:00:00+01:00")]);
  assert.equal(ids(items), "d,c,b,late,a,old", "offsets are read");
});

test("each id once: a page that repeats what came live, or a frame that repeats a page, changes nothing", () => {
  const items = merge([], [n("b", "2026-12-03T10:00:02Z"), n("a", "2026-12-03T10:00:01Z")]);
  assert.equal(merge(items, [n("b", "2026-12-03T10:00:02Z")]), items, "the same array: nothing renders again");
  const more = merge(items, [n("a", "2026-12-03T10:00:01Z"), n("z", "2026-12-03T09:59:59Z"), n("a", "2026-12-03T10:00:01Z")]);
  assert.equal(ids(more), "b,a,z");
});
