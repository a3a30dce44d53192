// spoolcast inbox: the page central serves at /inbox, built on the SDK:
// the headless client, @spoolcast/client, and the store under the React
// hooks, @spoolcast/react's (sdk/js/packages), without React, bundled into
// static/inbox.js by `make inbox`. It is the SDK's living example of what
// an app does (docs/apps.md):
//   1. one store per signed-in user holds one subscription of the live
//      stream and a list per tab (all, unread, archived), each loaded once
//      the stream is connected and kept live: every notification once, in
//      feed order, every change of state (read, unread, archived, seen),
//      made here or in any other session of the user, moving it between
//      lists at once, resumed after any drop (the client resumes from the
//      last cursor it delivered, and the server replays what changed);
//   2. the full page (tabs.ts) and the bell (bell.ts) are drawn from that
//      store, so they agree; the preferences panel (preferences.ts) is
//      over the client's preferences calls;
//   3. a refused token signs out, with the server's reason.
// "Notify me in this browser" subscribes the browser to Web Push and
// registers the subscription as a device (see "notifications in this
// browser" below, and sw.js, the service worker that shows each push).
//
// No framework: plain DOM calls. Producer text is always set with
// textContent, never as HTML.

import { ClientClosedError, NotFoundError, SpoolcastClient, UnauthorizedError } from "@spoolcast/client";
import { Store } from "@spoolcast/react/store";
import { mountBell } from "./bell.js";
import type { View } from "./items.js";
import { mountPreferences } from "./preferences.js";
import { mountPage, reason, showStatus } from "./tabs.js";

const PAGE_SIZE = 20;

const state = {
  token: null as string | null,
  client: null as SpoolcastClient | null, // one per sign-in: closing it ends its stream and requests
  store: null as Store | null, // the session's lists and counts, over the client
  unmount: [] as (() => void)[], // the session's views
  session: 0, // bumped at every sign-in and sign-out: answers to an older session are dropped
};

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

// ---- sign-in ---------------------------------------------------------------

// The token comes from the URL fragment (spoolcast dev prints such a link;
// a fragment is never sent to a server), from this tab's session storage,
// or from the sign-in form.
function initialToken(): string | null {
  const hash = new URLSearchParams(location.hash.slice(1));
  const fromLink = hash.get("token");
  if (fromLink) {
    sessionStorage.setItem("spoolcast.token", fromLink);
    history.replaceState(null, "", location.pathname); // do not leave it in the address bar
    return fromLink;
  }
  return sessionStorage.getItem("spoolcast.token");
}

// showSignIn signs out: nothing of the last user stays on the page or in
// flight (their lists, counts, stream and requests, the token in the form).
function showSignIn(message: string) {
  state.session++;
  for (const unmount of state.unmount.splice(0)) unmount();
  state.client?.close();
  state.client = state.store = null;
  state.token = null;
  sessionStorage.removeItem("spoolcast.token");
  $<HTMLTextAreaElement>("token").value = "";
  document.title = "Inbox · spoolcast";
  $("inbox").hidden = true;
  $("sign-out").hidden = true;
  showPush("hidden");
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = message;
  showStatus(null);
}

const signedOut = (err: UnauthorizedError) => showSignIn(`Signed out: ${err.problem?.detail || "the token was refused"}.`);

// A WebSocket subprotocol carries the token, so it must be an HTTP token:
// a JWT is (base64url and dots).
const TOKEN_CHARS = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

function signIn(input: string) {
  const token = input.trim().replace(/^Bearer\s+/i, "");
  if (!TOKEN_CHARS.test(token)) {
    // Never echo it: a token is a secret, and error text travels.
    showSignIn("That is not a bearer token: paste the token alone (eyJ…), without quotes or spaces.");
    return;
  }
  showSignIn("");
  state.token = token;
  sessionStorage.setItem("spoolcast.token", token);
  // The page's own origin: central sends no CORS headers. The token is
  // the one pasted: a 401 signs out (below), there is nothing to renew it with.
  const client = new SpoolcastClient({ baseUrl: location.origin, token: () => token, reconnect: { maxDelay: 10_000 } });
  const store = new Store(client, PAGE_SIZE);
  Object.assign(state, { client, store });
  const session = state.session;
  const view: View = {
    store,
    act(done, what) {
      done.catch((err: unknown) => {
        if (session !== state.session || err instanceof ClientClosedError) return;
        if (err instanceof UnauthorizedError) return signedOut(err);
        view.announce(`Could not ${what}: ${reason(err)}`);
        console.warn(`${what}:`, err);
      });
    },
    announce(text) {
      const live = $("announcer");
      live.textContent = "";
      // A new text node, a moment later, so that the same words are said again.
      setTimeout(() => (live.textContent = text), 50);
    },
  };
  $("sign-in").hidden = true;
  $("inbox").hidden = false;
  $("sign-out").hidden = false;
  // A refused token, wherever it shows (the stream, a page, the counts), signs out.
  const unsubscribe = store.subscribe(() => {
    if (session !== state.session) return;
    const errors = [store.getStatus()?.error, store.getCounts().error, ...(["all", "unread", "archived"] as const).map((s) => store.getFeed(s).error)];
    const refused = errors.find((e) => e instanceof UnauthorizedError);
    if (refused) queueMicrotask(() => session === state.session && signedOut(refused as UnauthorizedError));
  });
  state.unmount.push(
    unsubscribe,
    mountPage(view),
    mountBell($("bell-root"), view, () => {
      $("tab-all").click();
      $("tab-all").focus();
    }),
    mountPreferences(client, store, view.act),
    closeReadBanners(store),
  );
  void initPush();
}

// ---- the API ---------------------------------------------------------------

// Ignored: nothing to show (signed out, or an answer to an older session).
class Ignored extends Error {}

// call runs fn with this session's client. A 401 (after the client asked
// the token function again) sends the user back to sign-in with the
// server's reason (expired, another audience, …); an answer that arrives
// after a sign-out or a new sign-in is dropped.
async function call<T>(fn: (client: SpoolcastClient) => Promise<T>): Promise<T> {
  const { client, session } = state;
  if (!client) throw new Ignored();
  let value: T;
  try {
    value = await fn(client);
  } catch (err) {
    if (session !== state.session || err instanceof ClientClosedError) throw new Ignored();
    if (err instanceof UnauthorizedError) {
      signedOut(err);
      throw new Ignored();
    }
    throw err;
  }
  if (session !== state.session) throw new Ignored();
  return value;
}

// ---- notifications in this browser (Web Push) ------------------------------
//
// Offered where the browser has a service worker, PushManager and
// Notification (a secure context: https, or localhost) and central has a
// VAPID key (client.devices.vapidPublicKey(); NotFoundError without
// --vapid-key-file). Turning it on:
//   1. ask for permission to notify (Notification.requestPermission);
//   2. register the service worker, /inbox/sw.js, which shows each push;
//   3. subscribe with the server's key: pushManager.subscribe({userVisibleOnly:
//      true, applicationServerKey}); the browser's push service makes an endpoint;
//   4. client.devices.registerWebPush(subscription) (PUT /v1/devices); the
//      device's token (WebPush[…]) is what client.devices.unregister takes
//      to turn it off.
// Every sign-in registers the browser's subscription again: its last_seen
// moves, and one the browser renewed meanwhile is registered.
const SW_URL = "/inbox/sw.js";
const SW_SCOPE = "/inbox/"; // the script's default scope; the page (/inbox) is outside it: see sw.js
const DEVICE_KEY = "spoolcast.pushDevice"; // the device's token, kept as long as the subscription is
const SUBSCRIBE_PATIENCE = 20000; // ms a push service may take before the page says so
const pushSupported = "serviceWorker" in navigator && "PushManager" in window && "Notification" in window;
const DENIED = "Notifications are blocked for this site: allow them in the browser's site settings, then try again.";

let vapidKey: string | null = null; // the server's key, base64url
let pushTurn = 0; // bumped by each sign-in, turn on and turn off: only the latest shows its outcome

type PushMode = "hidden" | "off" | "on" | "busy-on" | "busy-off";

// showPush shows the control: "hidden", "off" (the button to turn it on),
// "on" (the state and the button to turn it off), or "busy-on" and
// "busy-off" (its button disabled while turning on or off), with a message
// or none.
function showPush(mode: PushMode, message = "") {
  $("push").hidden = mode === "hidden";
  $("push-on").hidden = mode !== "off" && mode !== "busy-on";
  $<HTMLButtonElement>("push-on").disabled = mode === "busy-on";
  $("push-state").hidden = mode !== "on" && mode !== "busy-off";
  $("push-off").hidden = $("push-state").hidden;
  $<HTMLButtonElement>("push-off").disabled = mode === "busy-off";
  $("push-error").textContent = message;
}

// pushTurnStarts starts a turn; the func it returns tells whether the turn
// is still the latest of the same session, which alone may change the control.
function pushTurnStarts() {
  const turn = ++pushTurn;
  const session = state.session;
  return () => turn === pushTurn && session === state.session;
}

function base64urlBytes(s: string): Uint8Array<ArrayBuffer> {
  const b64 = s.replace(/-/g, "+").replace(/_/g, "/").padEnd(Math.ceil(s.length / 4) * 4, "=");
  return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
}

function sameBytes(buffer: ArrayBuffer | null, bytes: Uint8Array) {
  const a = buffer ? new Uint8Array(buffer) : new Uint8Array();
  return a.length === bytes.length && a.every((x, i) => x === bytes[i]);
}

async function currentSubscription() {
  const reg = await navigator.serviceWorker.getRegistration(SW_SCOPE);
  return reg ? reg.pushManager.getSubscription() : null;
}

// initPush offers the control after a sign-in, on or off as this browser is.
async function initPush() {
  const current = pushTurnStarts();
  showPush("hidden");
  vapidKey = null;
  if (!pushSupported) return;
  try {
    vapidKey = await call((c) => c.devices.vapidPublicKey());
  } catch (err) {
    // Not set up here (404), or no answer: nothing to offer.
    if (!(err instanceof Ignored) && !(err instanceof NotFoundError)) console.warn("push key:", err);
    return;
  }
  try {
    const sub = await currentSubscription();
    if (!current()) return;
    if (!sub || Notification.permission !== "granted") {
      showPush("off", Notification.permission === "denied" ? DENIED : "");
      return;
    }
    if (!sameBytes(sub.options.applicationServerKey, base64urlBytes(vapidKey))) {
      // Subscribed with a key the server no longer signs with: its pushes
      // would be refused.
      await sub.unsubscribe();
      if (current()) showPush("off", "The server's push key changed: turn notifications on again.");
      return;
    }
    showPush("on");
    await register(sub);
  } catch (err) {
    if (err instanceof Ignored || !current()) return;
    showPush($("push-state").hidden ? "off" : "on", `Could not check notifications in this browser: ${reason(err)}`);
  }
}

// register registers the subscription and keeps the device's token. A
// token that changed (the browser renewed its subscription) leaves the old
// device behind: it is turned off.
async function register(sub: PushSubscription) {
  const device = await call((c) => c.devices.registerWebPush(sub));
  const old = localStorage.getItem(DEVICE_KEY);
  localStorage.setItem(DEVICE_KEY, device.token);
  if (old && old !== device.token) call((c) => c.devices.unregister(old)).catch(() => {});
}

// activated waits for the registration's worker to be active: a
// registration without one cannot subscribe.
function activated(reg: ServiceWorkerRegistration) {
  return new Promise<void>((resolve, reject) => {
    const worker = reg.installing || reg.waiting;
    const check = () => {
      if (reg.active) resolve();
      else if (!worker || worker.state === "redundant") reject(new Error("the service worker did not install"));
    };
    worker?.addEventListener("statechange", check);
    check();
  });
}

async function turnOn() {
  const current = pushTurnStarts();
  showPush("busy-on");
  const permission = await Notification.requestPermission();
  if (!current()) return;
  if (permission !== "granted") {
    showPush("off", permission === "denied" ? DENIED : "Notifications were not allowed: click again to be asked again.");
    return;
  }
  let sub: PushSubscription;
  try {
    const reg = await navigator.serviceWorker.register(SW_URL, { scope: SW_SCOPE, updateViaCache: "none" });
    await activated(reg);
    // A push service can take long, or never answer (offline; a browser
    // build without one): say so, and let the user try again. If it
    // answers later, the subscription is registered then.
    const slow = setTimeout(() => {
      if (current()) showPush("off", `This browser's push service has not answered in ${SUBSCRIBE_PATIENCE / 1000} s: try again later.`);
    }, SUBSCRIBE_PATIENCE);
    try {
      sub = await reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: base64urlBytes(vapidKey!) });
    } finally {
      clearTimeout(slow);
    }
  } catch (err) {
    if (current()) showPush("off", `This browser could not subscribe: ${(err as Error)?.message || err}`);
    return;
  }
  // A later turn has the same subscription (the browser keeps one per
  // worker), and registers it itself.
  if (!current()) return;
  try {
    await register(sub);
  } catch (err) {
    if (err instanceof Ignored || !current()) return;
    // Unknown to central: no subscription is left behind.
    await sub.unsubscribe().catch(() => {});
    showPush("off", `The server refused this browser: ${reason(err)}`);
    return;
  }
  if (current()) showPush("on");
}

// turnOff tells central first, which stops the sends, then ends the
// subscription. A device central does not have (404) is off already.
async function turnOff() {
  const current = pushTurnStarts();
  showPush("busy-off");
  try {
    const device = localStorage.getItem(DEVICE_KEY);
    if (device) {
      await call((c) => c.devices.unregister(device)).catch((err) => {
        if (!(err instanceof NotFoundError)) throw err;
      });
    }
    localStorage.removeItem(DEVICE_KEY);
    const sub = await currentSubscription();
    if (sub) await sub.unsubscribe();
  } catch (err) {
    if (err instanceof Ignored || !current()) return;
    showPush("on", `Could not turn notifications off: ${reason(err)}`);
    return;
  }
  if (current()) showPush("off");
}

// forgetDevice turns notifications off for a user who signs out, with the
// token they signed in with (their session's client is closed by then): a
// browser someone signed out of shows none of their notifications. Closing
// the tab is not signing out: they go on.
function forgetDevice(token: string) {
  const device = localStorage.getItem(DEVICE_KEY);
  if (!pushSupported || !device) return;
  localStorage.removeItem(DEVICE_KEY);
  const client = new SpoolcastClient({ baseUrl: location.origin, token: () => token });
  client.devices
    .unregister(device)
    .catch(() => {})
    .finally(() => client.close())
    .then(currentSubscription)
    .then((sub) => sub && sub.unsubscribe())
    .catch((err) => console.warn("turn notifications off:", err));
}

// ---- banners of notifications read elsewhere -------------------------------
//
// Central sends a browser no push to take a banner down (docs/design.md,
// "Clears"): a push whose worker shows nothing is a silent push, which
// Chrome pays for from a budget (past it, it shows "This site has been
// updated in the background"), Safari ends the subscription for, and
// Firefox counts against a quota; and central cannot know whether the
// banner is still shown. So the page takes them down: while it is open, a
// notification read or archived, here or on any other device (the stream
// says so), has its banner closed.
const BANNER_CHECK_DELAY = 250; // ms: a burst of changes checks the banners once

function closeReadBanners(store: Store): () => void {
  if (!pushSupported) return () => {};
  let timer: ReturnType<typeof setTimeout> | null = null;
  const check = async () => {
    timer = null;
    const done = new Set<string>();
    for (const list of ["all", "unread", "archived"] as const) {
      for (const n of store.getFeed(list).items) if (n.readAt || n.archivedAt) done.add(n.id);
    }
    if (done.size === 0 || Notification.permission !== "granted") return;
    const reg = await navigator.serviceWorker.getRegistration(SW_SCOPE);
    for (const banner of reg ? await reg.getNotifications() : []) {
      const id = typeof banner.data?.notification_id === "string" ? banner.data.notification_id : banner.tag;
      if (done.has(id)) banner.close();
    }
  };
  const unsubscribe = store.subscribe(() => {
    timer ??= setTimeout(() => void check().catch((err: unknown) => console.warn("close read banners:", err)), BANNER_CHECK_DELAY);
  });
  return () => {
    unsubscribe();
    if (timer) clearTimeout(timer);
  };
}

if (pushSupported) {
  // The worker renewed the subscription (sw.js, pushsubscriptionchange):
  // register the new one.
  navigator.serviceWorker.onmessage = (event) => {
    if (event.data?.type === "spoolcast.pushsubscriptionchange" && state.client) void initPush();
  };
}

// ---- wiring ------------------------------------------------------------------

$("sign-in-button").addEventListener("click", () => {
  const token = $<HTMLTextAreaElement>("token").value;
  if (token.trim()) signIn(token);
});
$("sign-out").addEventListener("click", () => {
  const token = state.token;
  showSignIn("");
  if (token) forgetDevice(token);
});
$("push-on").addEventListener("click", () => void turnOn());
$("push-off").addEventListener("click", () => void turnOff());

const token = initialToken();
if (token) {
  signIn(token);
} else {
  showSignIn("");
}
