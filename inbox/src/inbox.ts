// spoolcast inbox: the page central serves at /inbox, built on the SDK's
// headless client, @spoolcast/client (sdk/js/packages/client), and bundled
// with it into static/inbox.js by `make inbox`. It is the SDK's living
// example of what an app does (docs/apps.md):
//   1. subscribe to the live stream; once it is connected, load the feed,
//      newest first, one page at a time as the user scrolls. Everything
//      committed before the stream was live is in the pages, everything
//      after comes to onNotification: once each, in commit order, across
//      every reconnect (the client resumes from the last cursor it delivered);
//   2. keep one item per id (an item may come in a page and live) in feed
//      order (created_at, newest first: a late commit goes below newer ones);
//   3. after a reconnect, read the read state again (read frames are live
//      only); on a reset (the server refused the cursor), start over from
//      the first page;
//   4. mark read, mark all read, and keep the unread badge current.
// "Notify me in this browser" subscribes the browser to Web Push and
// registers the subscription as a device (see "notifications in this
// browser" below, and sw.js, the service worker that shows each push).
//
// No framework: plain DOM calls. Producer text is always set with
// textContent, never as HTML.

import {
  ClientClosedError,
  NotFoundError,
  SpoolcastClient,
  SpoolcastError,
  UnauthorizedError,
  type Notification,
  type StreamStatus,
  type Subscription,
} from "@spoolcast/client";

const PAGE_SIZE = 20;

interface Entry {
  item: Notification;
  li: HTMLLIElement;
}

const state = {
  token: null as string | null,
  client: null as SpoolcastClient | null, // one per sign-in: closing it ends its stream and requests
  sub: null as Subscription | null,
  session: 0, // bumped at every sign-in and sign-out: answers to an older session are dropped
  items: new Map<string, Entry>(),
  nextCursor: null as string | null, // the feed's cursor for the next (older) page
  feedDone: false, // the last page has been read
  loadingPage: false,
  feedLoaded: false,
  pageRetries: 0, // failed page loads in a row, for the backoff
};

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

/** reason is what the server said of a refusal (its problem's detail), else the error's message. */
const reason = (err: unknown) => (err instanceof SpoolcastError ? (err.problem?.detail ?? err.message) : String((err as Error)?.message ?? err));

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
// flight (their items, cursors, timers, stream and requests, the token in
// the form).
function showSignIn(message: string) {
  state.session++;
  state.client?.close();
  state.client = state.sub = null;
  state.token = null;
  sessionStorage.removeItem("spoolcast.token");
  clearFeed();
  clearTimeout(badgeTimer);
  $<HTMLTextAreaElement>("token").value = "";
  document.title = "Inbox · spoolcast";
  $("inbox").hidden = true;
  $("read-all").hidden = true;
  $("sign-out").hidden = true;
  $("badge").hidden = true;
  showPush("hidden");
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = message;
  setStatus("offline");
}

// clearFeed forgets every item and page cursor: the next connection loads
// the feed from the top.
function clearFeed() {
  state.items.clear();
  Object.assign(state, { nextCursor: null, feedDone: false, loadingPage: false, feedLoaded: false, pageRetries: 0 });
  clearTimeout(pageTimer);
  $("feed").replaceChildren();
  $("more").textContent = "Loading…";
  $("empty").hidden = true;
}

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
  state.client = new SpoolcastClient({ baseUrl: location.origin, token: () => token, reconnect: { maxDelay: 10_000 } });
  $("sign-in").hidden = true;
  $("inbox").hidden = false;
  $("read-all").hidden = false;
  $("sign-out").hidden = false;
  openStream();
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
      showSignIn(`Signed out: ${err.problem?.detail || "the token was refused"}.`);
      throw new Ignored();
    }
    throw err;
  }
  if (session !== state.session) throw new Ignored();
  return value;
}

// ---- the feed --------------------------------------------------------------

let pageTimer: ReturnType<typeof setTimeout> | undefined;

async function loadPage() {
  if (state.loadingPage || state.feedDone) return;
  state.loadingPage = true;
  clearTimeout(pageTimer);
  try {
    const page = await call((c) => c.notifications.list({ limit: PAGE_SIZE, cursor: state.nextCursor }));
    for (const item of page.data) addItem(item, "bottom");
    state.nextCursor = page.nextCursor;
    state.feedDone = !page.hasMore;
    state.feedLoaded = true;
    state.pageRetries = 0;
  } catch (err) {
    if (err instanceof Ignored) return;
    // Try again by itself: with backoff, never sooner than Retry-After.
    const retryAfter = err instanceof SpoolcastError ? (err.retryAfter ?? 0) : 0;
    const delay = Math.max(retryAfter * 1000, Math.min(30000, 1000 * 2 ** state.pageRetries++) * (0.5 + Math.random() / 2));
    $("more").textContent = `Could not load: ${reason(err)}. Trying again in ${Math.ceil(delay / 1000)} s…`;
    pageTimer = setTimeout(loadPage, delay);
    return;
  } finally {
    state.loadingPage = false;
  }
  $("more").textContent = state.feedDone ? (state.items.size ? "That's everything." : "") : "Loading…";
  $("empty").hidden = state.items.size > 0;
  refreshBadge();
  // A short first page may not fill the screen: keep going while the
  // sentinel is visible.
  if (!state.feedDone && isVisible($("more"))) void loadPage();
}

function isVisible(el: HTMLElement) {
  const r = el.getBoundingClientRect();
  return r.top < window.innerHeight && r.bottom > 0;
}

// Infinite scroll: load the next page when the "Loading…" line comes into view.
new IntersectionObserver((entries) => {
  if (entries.some((e) => e.isIntersecting) && state.client && state.feedLoaded) void loadPage();
}).observe($("more"));

// createdMicros orders items as the feed does: createdAt carries
// microseconds, which Date drops, and Go trims trailing zeros, so neither
// Date nor comparing the strings would do.
function createdMicros(iso: string): number {
  const m = /^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$/.exec(iso);
  if (!m) return Date.parse(iso) * 1000;
  return Date.parse(m[1]! + m[3]!) * 1000 + Number((m[2] ?? "").padEnd(6, "0").slice(0, 6));
}

// micros is an item's place in the feed's order, newest first. Items of
// one ingest transaction share it (created_at is the transaction's start):
// the feed lists those in the order they were written, which the stream
// follows, so a live one goes above those of its time and a page's below
// (see addItem). Ids are opaque, and their string order is not theirs.
const micros = (item: Notification) => createdMicros(item.createdAt);

// addItem shows an item once, whichever way it came: a page appends at the
// bottom, a live one goes in at its place near the top.
function addItem(item: Notification, where: "top" | "bottom"): boolean {
  if (state.items.has(item.id)) return false;
  const li = document.createElement("li");
  li.dataset.id = item.id;
  const title = document.createElement("p");
  title.className = "title";
  title.textContent = item.title;
  li.append(title);
  if (item.body) {
    const body = document.createElement("p");
    body.className = "body";
    body.textContent = item.body;
    li.append(body);
  }
  const meta = document.createElement("p");
  meta.className = "meta";
  meta.textContent = `${item.type} · ${new Date(item.createdAt).toLocaleString()}`;
  li.append(meta);
  li.classList.toggle("unread", !item.readAt);
  li.tabIndex = 0; // reachable from the keyboard: Enter marks it read
  li.addEventListener("click", () => void markRead(item.id));
  li.addEventListener("keydown", (e) => e.key === "Enter" && void markRead(item.id));
  const feed = $("feed");
  if (where === "top") {
    // A live one is almost always the newest; one that committed after a
    // newer one goes below it, as the feed would list it.
    let before = feed.firstElementChild as HTMLElement | null;
    while (before && micros(state.items.get(before.dataset.id!)!.item) > micros(item)) before = before.nextElementSibling as HTMLElement | null;
    feed.insertBefore(li, before);
  } else {
    feed.append(li);
  }
  state.items.set(item.id, { item: { ...item }, li });
  $("empty").hidden = true;
  return true;
}

function showRead(id: string) {
  const entry = state.items.get(id);
  if (!entry || entry.item.readAt) return;
  entry.item.readAt = new Date().toISOString();
  entry.li.classList.remove("unread");
}

// ---- read state ------------------------------------------------------------

async function markRead(id: string) {
  if (state.items.get(id)?.item.readAt) return;
  try {
    await call((c) => c.notifications.markRead(id));
    showRead(id);
    refreshBadge();
  } catch (err) {
    if (!(err instanceof Ignored)) console.warn("mark read:", err);
  }
}

async function markAllRead() {
  // What is shown now had committed when read-all is asked: it is covered.
  // What arrives while the request runs may have committed after; the
  // stream's read frame says which.
  const shown = new Set(state.items.keys());
  try {
    const { readThrough } = await call((c) => c.notifications.markAllRead());
    if (readThrough) showReadThrough(readThrough, [], shown);
    refreshBadge();
  } catch (err) {
    if (!(err instanceof Ignored)) console.warn("mark all read:", err);
  }
}

// showReadThrough shows what read-all covered: the item and everything
// older in feed order, but for what committed after read-all was asked
// (the read frame's "unread"), which stays as it is. An item not loaded
// here (read-all in another session, on newer items than this one has)
// means re-reading the read state. only, when set, limits it to those ids.
function showReadThrough(id: string, unread: string[] = [], only: Set<string> | null = null) {
  const through = state.items.get(id);
  if (!through) {
    void syncReadState();
    return;
  }
  const left = new Set(unread);
  for (const { item } of state.items.values()) {
    if (micros(item) > micros(through.item) || left.has(item.id) || (only && !only.has(item.id))) continue;
    showRead(item.id);
  }
}

// syncReadState re-reads the read state of what is loaded here, 100 items
// a page down to the oldest one shown (read frames sent while this session
// was away are not replayed), then asks for the count again.
async function syncReadState() {
  const session = state.session;
  let oldest: Notification | null = null;
  for (const { item } of state.items.values()) if (!oldest || micros(item) < micros(oldest)) oldest = item;
  try {
    let cursor: string | null = null;
    for (;;) {
      const page = await call((c) => c.notifications.list({ limit: 100, cursor }));
      for (const item of page.data) if (item.readAt) showRead(item.id);
      const last = page.data[page.data.length - 1];
      if (!page.hasMore || !oldest || !last || micros(last) < micros(oldest) || session !== state.session) break;
      cursor = page.nextCursor;
    }
  } catch (err) {
    if (!(err instanceof Ignored)) console.warn("read state:", err);
  }
  refreshBadge();
}

let badgeTimer: ReturnType<typeof setTimeout> | undefined;
let badgeAsked = 0; // the latest count asked for: an older answer arriving late is dropped
// refreshBadge asks the server, which knows about rows not loaded here;
// bursts of calls are folded into one.
function refreshBadge() {
  clearTimeout(badgeTimer);
  badgeTimer = setTimeout(async () => {
    const asked = ++badgeAsked;
    try {
      const { count, capped } = await call((c) => c.notifications.unreadCount());
      if (asked !== badgeAsked) return;
      const badge = $("badge");
      badge.textContent = capped ? "99+" : String(count);
      badge.hidden = count === 0;
      document.title = count ? `(${badge.textContent}) Inbox · spoolcast` : "Inbox · spoolcast";
    } catch (err) {
      if (!(err instanceof Ignored)) console.warn("unread count:", err);
    }
  }, 100);
}

// ---- the live stream -------------------------------------------------------

function setStatus(s: "offline" | "live" | "reconnecting") {
  const el = $("status");
  el.dataset.state = s;
  el.textContent = s;
}

// openStream subscribes this session's client. The client owns the
// connection: it resumes from the last cursor it delivered after any drop,
// backs off, falls back to server-sent events where upgrades are refused,
// and tells the page what it is doing.
function openStream() {
  const { client, session } = state;
  if (!client) return;
  const current = () => session === state.session;
  state.sub = client.subscribe({
    onNotification(item) {
      // Live, or missed while disconnected (sent before "ready").
      if (addItem(item, "top")) state.items.get(item.id)!.li.classList.add("arrived");
      refreshBadge();
    },
    onRead(e) {
      if (e.id) showRead(e.id);
      if (e.through) showReadThrough(e.through, e.unread);
      refreshBadge();
    },
    onReset() {
      // The server refused the cursor (a restore, a failover): start over
      // from the top of the feed, which the connection that follows loads.
      if (current()) clearFeed();
    },
    onStatus(s: StreamStatus) {
      if (!current()) return;
      if (s.state === "connected") {
        setStatus("live");
        if (!state.feedLoaded) {
          // The first connection, or one after a reset: now load the feed.
          // Everything committed before is in it; everything after comes live.
          void loadPage();
        } else {
          // A reconnect: missed notifications came live, but not what was
          // marked read meanwhile.
          void syncReadState();
        }
      } else if (s.error instanceof UnauthorizedError) {
        showSignIn(`Signed out: ${s.error.problem?.detail || "the token was refused"}.`);
      } else if (s.state === "connecting" && s.reason !== "connect") {
        setStatus("reconnecting");
      } else if (s.state === "disconnected" && s.reason === "fatal") {
        setStatus("offline");
        console.warn("stream:", s.error);
      }
    },
  });
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
$("read-all").addEventListener("click", () => void markAllRead());
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
