// spoolcast inbox — the service worker that shows central's Web Push
// messages in this browser, and opens the inbox when one is clicked.
//
// inbox.js registers it at /inbox/sw.js with the script's default scope,
// /inbox/. The page itself is /inbox, outside that scope, so this worker
// never controls it; it does not need to: push and notification events reach
// a worker whatever it controls, and it intercepts no fetch. (A
// Service-Worker-Allowed header could widen the scope to "/inbox", but a
// scope is a prefix, which would also take in any /inbox… path, for
// nothing.) The page finds the registration with getRegistration("/inbox/").
//
// The payload central sends (decrypted by the browser):
//   {"title": "…", "body": "…", "data": {"notification_id": "…", "category": "…",
//    "digest": {"key": "…", "count": 3}}}   (digest only for digests)
// Central sends browsers no clear (a push that shows nothing costs the
// site: docs/design.md, "A browser gets no clear"); the inbox page closes
// the banners of what was read. A central of an earlier version sent, when
// notifications were read or archived on any device, a clear:
//   {"type": "clear", "ids": ["…", …]}
// which this worker still closes the notifications shown for (tagged with
// those ids), during a rolling upgrade.
"use strict";

// The inbox page: the scope without its trailing slash (/inbox).
const INBOX = self.registration.scope.replace(/\/$/, "");

// A new version takes over at once: the worker keeps no caches or state
// that an older page could depend on.
self.addEventListener("install", () => self.skipWaiting());

self.addEventListener("push", (event) => {
  const ids = clearIDs(event.data);
  event.waitUntil(ids ? clear(ids) : show(event.data));
});

// clearIDs returns the ids of a clear, or null for any other push.
function clearIDs(data) {
  try {
    const message = data ? data.json() : null;
    if (message && message.type === "clear" && Array.isArray(message.ids)) {
      return message.ids.filter((id) => typeof id === "string");
    }
  } catch {
    // not JSON: a notification to show
  }
  return null;
}

// clear closes the notifications shown for ids, and shows nothing: an
// earlier central sent a clear only to a browser that got the push it
// takes down.
async function clear(ids) {
  const wanted = new Set(ids);
  const shown = await self.registration.getNotifications();
  for (const n of shown) {
    const id = n.data && typeof n.data.notification_id === "string" ? n.data.notification_id : n.tag;
    if (wanted.has(n.tag) || wanted.has(id)) n.close();
  }
}

// show always shows something: a push the worker shows nothing for counts
// against the site (browsers show a generic notice of their own, and may
// end the subscription), so a payload that is not the JSON above still
// gives a notification.
function show(data) {
  let message = null;
  try {
    message = data ? data.json() : null;
  } catch {
    // not JSON: shown as text below
  }
  if (!message || typeof message !== "object") {
    const text = data ? data.text().slice(0, 200) : "";
    return self.registration.showNotification("New notification", {
      body: text || "Open the inbox to see it.",
      data: { notification_id: null, url: INBOX },
    });
  }
  const d = message.data && typeof message.data === "object" ? message.data : {};
  const id = typeof d.notification_id === "string" ? d.notification_id : null;
  const options = {
    body: typeof message.body === "string" ? message.body : "",
    data: { notification_id: id, url: INBOX },
  };
  // The tag makes a repeat of a notification replace the one shown. A digest
  // is tagged by its key, as central gives its pushes one topic: the newer
  // count replaces the older, and alerts again.
  if (d.digest && typeof d.digest.key === "string") {
    options.tag = `digest:${d.digest.key}`;
    options.renotify = true;
  } else if (id) {
    options.tag = id;
  }
  const title = typeof message.title === "string" && message.title ? message.title : "New notification";
  return self.registration.showNotification(title, options);
}

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  event.waitUntil(openInbox());
});

// openInbox focuses an inbox window of this origin if one is open (the page
// is outside the scope, hence includeUncontrolled), else opens one. A new
// window has its own session storage, so it asks for the token again: the
// token is never kept where it would outlive the tab.
async function openInbox() {
  const path = new URL(INBOX).pathname;
  const windows = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  const inboxes = windows.filter((c) => {
    const p = new URL(c.url).pathname;
    return p === path || p === path + "/";
  });
  const open = inboxes.find((c) => c.focused) || inboxes[0];
  if (open) return open.focus();
  return self.clients.openWindow(INBOX);
}

// The push service renewed or ended the subscription (Firefox does this;
// Chromium does not fire the event). Central must learn the new endpoint
// through PUT /v1/devices, which needs the user's token, and the worker has
// none: it lives in the page's session storage, out of a worker's reach. So
// the worker subscribes again with the same key, if the browser did not, and
// tells open inbox pages, which register it; otherwise the inbox registers
// it the next time it is opened (it registers the current subscription on
// every load). Meanwhile pushes go to the old endpoint, which the push
// service answers 404 or 410 and central disables.
self.addEventListener("pushsubscriptionchange", (event) => {
  event.waitUntil(resubscribe(event));
});

async function resubscribe(event) {
  if (!event.newSubscription) {
    const key = event.oldSubscription && event.oldSubscription.options.applicationServerKey;
    if (!key) return; // the inbox subscribes again, with the server's key, when the user asks
    await self.registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: key });
  }
  const windows = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  for (const c of windows) c.postMessage({ type: "spoolcast.pushsubscriptionchange" });
}
