// The Expo clear helpers against a fake of the few expo-notifications calls
// they use: a clear dismisses exactly the banners whose push it names.
import assert from "node:assert/strict";
import { test } from "node:test";
import { clearPresentedOnRead, clearedIds, handleClearMessage, type ExpoNotificationsLike, type PresentedNotification } from "../src/expo.ts";

// fakeNotifications presents a banner per notification id, and lets a test
// deliver a message to the app's received listeners.
function fakeNotifications(ids: string[]) {
  const presented = new Map<string, PresentedNotification>();
  ids.forEach((id, i) => presented.set(`req-${i}`, { request: { identifier: `req-${i}`, content: { data: { notification_id: id, category: "c" } } } }));
  presented.set("other", { request: { identifier: "other", content: { data: null } } });
  const listeners = new Set<(n: PresentedNotification) => void>();
  const dismissed: string[] = [];
  const api: ExpoNotificationsLike = {
    async getPresentedNotificationsAsync() {
      return [...presented.values()];
    },
    async dismissNotificationAsync(identifier) {
      dismissed.push(identifier);
      presented.delete(identifier);
    },
    addNotificationReceivedListener(listener) {
      listeners.add(listener);
      return { remove: () => listeners.delete(listener) };
    },
  };
  const receive = (data: Record<string, unknown>) => {
    for (const l of listeners) l({ request: { identifier: "incoming", content: { data } } });
  };
  return { api, presented, dismissed, receive, listeners };
}

test("a clear dismisses the banners of the ids it names, and no other", async () => {
  const f = fakeNotifications(["n1", "n2", "n3"]);
  assert.equal(await handleClearMessage(f.api, { type: "clear", ids: ["n1", "n3", "unknown"] }), 2);
  assert.deepEqual(f.dismissed, ["req-0", "req-2"]);
  assert.deepEqual([...f.presented.keys()], ["req-1", "other"]);
});

test("data that is not a clear dismisses nothing", async () => {
  const f = fakeNotifications(["n1"]);
  for (const data of [null, undefined, "clear", { notification_id: "n1" }, { type: "clear" }, { type: "other", ids: ["n1"] }]) {
    assert.equal(await handleClearMessage(f.api, data), 0);
  }
  assert.deepEqual(f.dismissed, []);
  assert.equal(clearedIds({ type: "clear", ids: ["a", 1, null, "b"] })?.join(), "a,b");
});

test("the listener dismisses on each clear received until it is removed", async () => {
  const f = fakeNotifications(["n1", "n2"]);
  const stop = clearPresentedOnRead(f.api);
  f.receive({ notification_id: "n9" }); // a push, not a clear
  f.receive({ type: "clear", ids: ["n2"] });
  await new Promise((r) => setTimeout(r, 0));
  assert.deepEqual(f.dismissed, ["req-1"]);
  stop();
  assert.equal(f.listeners.size, 0);
  f.receive({ type: "clear", ids: ["n1"] });
  await new Promise((r) => setTimeout(r, 0));
  assert.deepEqual(f.dismissed, ["req-1"]);
});

test("an error dismissing reaches onError", async () => {
  const f = fakeNotifications(["n1"]);
  f.api.dismissNotificationAsync = async () => {
    throw new Error("native module gone");
  };
  const errors: unknown[] = [];
  clearPresentedOnRead(f.api, (err) => errors.push(err));
  f.receive({ type: "clear", ids: ["n1"] });
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(errors.length, 1);
});
