// spoolcast inbox — the reference client for app developers.
//
// It shows how an app uses central's API (docs/api.md):
//   1. open the live stream (/v1/stream) and wait for its "ready" frame;
//   2. load the feed (/v1/notifications), newest first, one page at a time as
//      the user scrolls, following next_cursor;
//   3. put each "notification" frame at the top, keep the cursor of the last
//      frame, and after a dropped connection reconnect with ?after=<cursor>:
//      the server sends what was missed, then "ready", then live frames;
//   4. keep one item per id: an item may come both in the feed and as a frame,
//      and keep the list in feed order (created_at, newest first): frames
//      come in commit order, which may differ.
// Unread counts come from /v1/notifications/unread-count (capped at 100:
// "99+"); marking read is POST …/{id}/read and POST …/read-all; "read" frames
// tell this session what another one marked. They are live only: after a
// reconnect, ask for the count again and re-read the first page's read state.
// "Notify me in this browser" subscribes the browser to Web Push and
// registers the subscription as a device (see "notifications in this
// browser" below, and sw.js, the service worker that shows each push).
//
// No framework, no build step: plain DOM calls. Producer text is always set
// with textContent, never as HTML.
"use strict";

(() => {
  const PAGE_SIZE = 20;
  const PROTOCOL = "spoolcast.bearer.v1"; // the token rides beside it in Sec-WebSocket-Protocol

  const state = {
    token: null,
    session: 0,           // bumped at every sign-in and sign-out: answers to an older session are dropped
    items: new Map(),     // id → {item, li}
    nextCursor: null,     // the feed's cursor for the next (older) page
    feedDone: false,      // the last page has been read
    loadingPage: false,
    streamCursor: null,   // the cursor of the last frame: where a reconnect resumes
    socket: null,
    retries: 0,           // failed connections in a row, for the backoff
    refusals: 0,          // handshakes refused in a row while the API answered
    feedLoaded: false,
    pageRetries: 0,       // failed page loads in a row, for the backoff
  };

  const $ = (id) => document.getElementById(id);

  // ---- sign-in -------------------------------------------------------------

  // The token comes from the URL fragment (spoolcast dev prints such a link;
  // a fragment is never sent to a server), from this tab's session storage,
  // or from the sign-in form.
  function initialToken() {
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
  // flight (their items, cursors, timers, the token in the form).
  function showSignIn(message) {
    stopStream();
    state.session++;
    state.token = null;
    sessionStorage.removeItem("spoolcast.token");
    clearFeed();
    state.retries = 0;
    clearTimeout(badgeTimer);
    $("token").value = "";
    document.title = "Inbox · spoolcast";
    $("inbox").hidden = true;
    $("read-all").hidden = true;
    $("sign-out").hidden = true;
    $("badge").hidden = true;
    showPush("hidden");
    $("sign-in").hidden = false;
    $("sign-in-error").textContent = message || "";
    setStatus("offline");
  }

  // clearFeed forgets every item and cursor: the next "ready" loads the feed
  // from the top.
  function clearFeed() {
    state.items.clear();
    Object.assign(state, { nextCursor: null, feedDone: false, loadingPage: false, streamCursor: null, feedLoaded: false, pageRetries: 0, refusals: 0 });
    clearTimeout(pageTimer);
    $("feed").replaceChildren();
    $("more").textContent = "Loading…";
    $("empty").hidden = true;
  }

  // A WebSocket subprotocol carries the token, so it must be an HTTP token:
  // a JWT is (base64url and dots).
  const TOKEN_CHARS = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

  function signIn(token) {
    token = token.trim().replace(/^Bearer\s+/i, "");
    if (!TOKEN_CHARS.test(token)) {
      // Never echo it: a token is a secret, and error text travels.
      showSignIn("That is not a bearer token: paste the token alone (eyJ…), without quotes or spaces.");
      return;
    }
    showSignIn("");
    state.token = token;
    sessionStorage.setItem("spoolcast.token", state.token);
    $("sign-in").hidden = true;
    $("inbox").hidden = false;
    $("read-all").hidden = false;
    $("sign-out").hidden = false;
    openStream();
    initPush();
  }

  // ---- the API ---------------------------------------------------------------

  // Ignored: nothing to show (signed out, or an answer to an older session).
  class Ignored extends Error {}

  // api calls central with the token; a 401 sends the user back to sign-in
  // with the server's reason (expired, another audience, …). An answer that
  // arrives after a sign-out or a new sign-in is dropped.
  async function api(path, options = {}) {
    const session = state.session;
    if (!state.token) throw new Ignored();
    const response = await fetch(path, {
      ...options,
      headers: { Authorization: `Bearer ${state.token}`, ...(options.headers || {}) },
    });
    if (session !== state.session) throw new Ignored();
    if (response.status === 401) {
      const problem = await response.json().catch(() => ({}));
      if (session === state.session) showSignIn(`Signed out: ${problem.detail || "the token was refused"}.`);
      throw new Ignored();
    }
    if (!response.ok && response.status !== 204) {
      const problem = await response.json().catch(() => ({}));
      const err = new Error(problem.detail || `HTTP ${response.status}`);
      err.status = response.status;
      err.retryAfter = Number(response.headers.get("Retry-After")) || 0;
      throw err;
    }
    const body = response.status === 204 ? null : await response.json();
    if (session !== state.session) throw new Ignored();
    return body;
  }

  // ---- the feed ------------------------------------------------------------

  let pageTimer = null;

  async function loadPage() {
    if (state.loadingPage || state.feedDone) return;
    state.loadingPage = true;
    clearTimeout(pageTimer);
    try {
      const query = new URLSearchParams({ limit: PAGE_SIZE });
      if (state.nextCursor) query.set("cursor", state.nextCursor);
      const page = await api(`/v1/notifications?${query}`);
      for (const item of page.data) addItem(item, "bottom");
      state.nextCursor = page.next_cursor;
      state.feedDone = !page.has_more;
      state.feedLoaded = true;
      state.pageRetries = 0;
    } catch (err) {
      if (err instanceof Ignored) return;
      // Try again by itself: with backoff, never sooner than Retry-After.
      const delay = Math.max(err.retryAfter * 1000, Math.min(30000, 1000 * 2 ** state.pageRetries++) * (0.5 + Math.random() / 2));
      $("more").textContent = `Could not load: ${err.message}. Trying again in ${Math.ceil(delay / 1000)} s…`;
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
    if (!state.feedDone && isVisible($("more"))) loadPage();
  }

  function isVisible(el) {
    const r = el.getBoundingClientRect();
    return r.top < window.innerHeight && r.bottom > 0;
  }

  // Infinite scroll: load the next page when the "Loading…" line comes into view.
  new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting) && state.token && state.feedLoaded) loadPage();
  }).observe($("more"));

  // createdMicros orders items as the feed does: created_at carries
  // microseconds, which Date drops, and Go trims trailing zeros, so neither
  // Date nor comparing the strings would do.
  function createdMicros(iso) {
    const m = /^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$/.exec(iso);
    if (!m) return Date.parse(iso) * 1000;
    return Date.parse(m[1] + m[3]) * 1000 + Number((m[2] || "").padEnd(6, "0").slice(0, 6));
  }

  // newer: does item a come before item b in the feed (newest first)?
  function newer(a, b) {
    const ta = createdMicros(a.created_at), tb = createdMicros(b.created_at);
    return ta !== tb ? ta > tb : a.id > b.id;
  }

  // addItem shows an item once, whichever way it came: a page appends at the
  // bottom, a frame goes in at its place near the top.
  function addItem(item, where) {
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
    meta.textContent = `${item.type} · ${new Date(item.created_at).toLocaleString()}`;
    li.append(meta);
    li.classList.toggle("unread", !item.read_at);
    li.tabIndex = 0; // reachable from the keyboard: Enter marks it read
    li.addEventListener("click", () => markRead(item.id));
    li.addEventListener("keydown", (e) => e.key === "Enter" && markRead(item.id));
    const feed = $("feed");
    if (where === "top") {
      // A frame is almost always the newest; one that committed after a
      // newer one goes below it, as the feed would list it.
      let before = feed.firstElementChild;
      while (before && !newer(item, state.items.get(before.dataset.id).item)) before = before.nextElementSibling;
      feed.insertBefore(li, before);
    } else {
      feed.append(li);
    }
    state.items.set(item.id, { item, li });
    $("empty").hidden = true;
    return true;
  }

  function showRead(id) {
    const entry = state.items.get(id);
    if (!entry || entry.item.read_at) return;
    entry.item.read_at = new Date().toISOString();
    entry.li.classList.remove("unread");
  }

  // ---- read state ----------------------------------------------------------

  async function markRead(id) {
    if (state.items.get(id)?.item.read_at) return;
    try {
      await api(`/v1/notifications/${encodeURIComponent(id)}/read`, { method: "POST" });
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
      const { read_through } = await api("/v1/notifications/read-all", { method: "POST" });
      if (read_through) showReadThrough(read_through, [], shown);
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
  function showReadThrough(id, unread = [], only = null) {
    const through = state.items.get(id);
    if (!through) {
      syncReadState();
      return;
    }
    const left = new Set(unread);
    for (const { item } of state.items.values()) {
      if (newer(item, through.item) || left.has(item.id) || (only && !only.has(item.id))) continue;
      showRead(item.id);
    }
  }

  // syncReadState re-reads the read state of what is loaded here, 100 items
  // a page down to the oldest one shown (read frames sent while this session
  // was away are not replayed), then asks for the count again.
  async function syncReadState() {
    const session = state.session;
    let oldest = null;
    for (const { item } of state.items.values()) if (!oldest || newer(oldest, item)) oldest = item;
    try {
      let cursor = null;
      for (;;) {
        const query = new URLSearchParams({ limit: 100 });
        if (cursor) query.set("cursor", cursor);
        const page = await api(`/v1/notifications?${query}`);
        for (const item of page.data) if (item.read_at) showRead(item.id);
        const last = page.data[page.data.length - 1];
        if (!page.has_more || !oldest || !last || !newer(last, oldest) || session !== state.session) break;
        cursor = page.next_cursor;
      }
    } catch (err) {
      if (!(err instanceof Ignored)) console.warn("read state:", err);
    }
    refreshBadge();
  }

  let badgeTimer = null;
  let badgeAsked = 0; // the latest count asked for: an older answer arriving late is dropped
  // refreshBadge asks the server, which knows about rows not loaded here;
  // bursts of calls are folded into one.
  function refreshBadge() {
    clearTimeout(badgeTimer);
    badgeTimer = setTimeout(async () => {
      const asked = ++badgeAsked;
      try {
        const { count, capped } = await api("/v1/notifications/unread-count");
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

  function setStatus(s) {
    const el = $("status");
    el.dataset.state = s;
    el.textContent = s;
  }

  function openStream() {
    const url = new URL("/v1/stream", location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    if (state.streamCursor) url.searchParams.set("after", state.streamCursor);
    let opened = false;
    let socket;
    try {
      socket = new WebSocket(url, [PROTOCOL, state.token]);
    } catch {
      // The browser refused the token as a subprotocol; its message would
      // repeat the token, so it is not shown.
      showSignIn("That token cannot be sent: sign in with another.");
      return;
    }
    state.socket = socket;

    socket.onopen = () => {
      opened = true;
    };

    socket.onmessage = (event) => {
      const frame = JSON.parse(event.data);
      switch (frame.type) {
        case "notification":
          // Live, or missed while disconnected (sent before "ready").
          if (addItem(frame.data, "top")) state.items.get(frame.data.id).li.classList.add("arrived");
          state.streamCursor = frame.cursor;
          refreshBadge();
          break;
        case "ready":
          state.streamCursor = frame.cursor;
          state.retries = 0;
          state.refusals = 0;
          setStatus("live");
          if (!state.feedLoaded) {
            // First connection: now load the feed. Everything committed
            // before "ready" is in it; everything after comes as frames.
            loadPage();
          } else {
            // A reconnect: missed notifications came as frames, but not
            // what was marked read meanwhile.
            syncReadState();
          }
          break;
        case "read":
          if (frame.id) showRead(frame.id);
          if (frame.through) showReadThrough(frame.through, frame.unread);
          refreshBadge();
          break;
      }
    };

    socket.onclose = (event) => {
      if (state.socket !== socket) return; // replaced or stopped on purpose
      state.socket = null;
      if (!state.token) return;
      setStatus("reconnecting");
      if (!opened) {
        // The handshake was refused before the upgrade. A browser cannot see
        // the status, so ask an ordinary route: a 401 there signs out. If
        // the API answers but the stream keeps refusing, the resume cursor
        // may be what it refuses (a 400, say after an upgrade): start over
        // from the top of the feed.
        api("/v1/notifications/unread-count").then(() => {
          if (++state.refusals >= 3 && state.streamCursor) clearFeed();
        }).catch(() => { state.refusals = 0; });
      }
      // 1001: the server is going away (a deploy): another replica answers
      // at once. Otherwise back off, with jitter, up to 10 s.
      const delay = event.code === 1001 ? 0 : Math.min(10000, 500 * 2 ** state.retries) * (0.5 + Math.random() / 2);
      state.retries++;
      setTimeout(() => state.token && !state.socket && openStream(), delay);
    };
  }

  function stopStream() {
    const socket = state.socket;
    state.socket = null;
    if (socket) socket.close(1000);
  }

  // ---- notifications in this browser (Web Push) ------------------------------
  //
  // Offered where the browser has a service worker, PushManager and
  // Notification (a secure context: https, or localhost) and central has a
  // VAPID key (GET /v1/push/vapid-public-key; 404 without --vapid-key-file).
  // Turning it on:
  //   1. ask for permission to notify (Notification.requestPermission);
  //   2. register the service worker, /inbox/sw.js, which shows each push;
  //   3. subscribe with the server's key: pushManager.subscribe({userVisibleOnly:
  //      true, applicationServerKey}); the browser's push service makes an endpoint;
  //   4. PUT {"platform": "web", "subscription": subscription.toJSON()} to
  //      /v1/devices; the device's token (WebPush[…]) is what
  //      DELETE /v1/devices/{token} takes to turn it off.
  // Every sign-in PUTs the browser's subscription again: its last_seen moves,
  // and one the browser renewed meanwhile is registered.
  const SW_URL = "/inbox/sw.js";
  const SW_SCOPE = "/inbox/"; // the script's default scope; the page (/inbox) is outside it: see sw.js
  const DEVICE_KEY = "spoolcast.pushDevice"; // the device's token, kept as long as the subscription is
  const SUBSCRIBE_PATIENCE = 20000; // ms a push service may take before the page says so
  const pushSupported = "serviceWorker" in navigator && "PushManager" in window && "Notification" in window;
  const DENIED = "Notifications are blocked for this site: allow them in the browser's site settings, then try again.";

  let vapidKey = null; // the server's key, base64url
  let pushTurn = 0;    // bumped by each sign-in, turn on and turn off: only the latest shows its outcome

  // showPush shows the control: "hidden", "off" (the button to turn it on),
  // "on" (the state and the button to turn it off), or "busy-on" and
  // "busy-off" (its button disabled while turning on or off), with a message
  // or none.
  function showPush(mode, message = "") {
    $("push").hidden = mode === "hidden";
    $("push-on").hidden = mode !== "off" && mode !== "busy-on";
    $("push-on").disabled = mode === "busy-on";
    $("push-state").hidden = mode !== "on" && mode !== "busy-off";
    $("push-off").hidden = $("push-state").hidden;
    $("push-off").disabled = mode === "busy-off";
    $("push-error").textContent = message;
  }

  // pushTurnStarts starts a turn; the func it returns tells whether the turn
  // is still the latest of the same session, which alone may change the control.
  function pushTurnStarts() {
    const turn = ++pushTurn, session = state.session;
    return () => turn === pushTurn && session === state.session;
  }

  function base64urlBytes(s) {
    const b64 = s.replace(/-/g, "+").replace(/_/g, "/").padEnd(Math.ceil(s.length / 4) * 4, "=");
    return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  }

  function sameBytes(buffer, bytes) {
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
      ({ key: vapidKey } = await api("/v1/push/vapid-public-key"));
    } catch (err) {
      // Not set up here (404), or no answer: nothing to offer.
      if (!(err instanceof Ignored) && err.status !== 404) console.warn("push key:", err);
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
      showPush($("push-state").hidden ? "off" : "on", `Could not check notifications in this browser: ${err.message}`);
    }
  }

  // register PUTs the subscription and keeps the device's token. A token
  // that changed (the browser renewed its subscription) leaves the old
  // device behind: it is turned off.
  async function register(sub) {
    const device = await api("/v1/devices", {
      method: "PUT",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ platform: "web", subscription: sub.toJSON() }),
    });
    const old = localStorage.getItem(DEVICE_KEY);
    localStorage.setItem(DEVICE_KEY, device.token);
    if (old && old !== device.token) {
      api(`/v1/devices/${encodeURIComponent(old)}`, { method: "DELETE" }).catch(() => {});
    }
  }

  // activated waits for the registration's worker to be active: a
  // registration without one cannot subscribe.
  function activated(reg) {
    return new Promise((resolve, reject) => {
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
    let sub;
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
        sub = await reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: base64urlBytes(vapidKey) });
      } finally {
        clearTimeout(slow);
      }
    } catch (err) {
      if (current()) showPush("off", `This browser could not subscribe: ${err.message || err}`);
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
      showPush("off", `The server refused this browser: ${err.message}`);
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
        await api(`/v1/devices/${encodeURIComponent(device)}`, { method: "DELETE" }).catch((err) => {
          if (err.status !== 404) throw err;
        });
      }
      localStorage.removeItem(DEVICE_KEY);
      const sub = await currentSubscription();
      if (sub) await sub.unsubscribe();
    } catch (err) {
      if (err instanceof Ignored || !current()) return;
      showPush("on", `Could not turn notifications off: ${err.message}`);
      return;
    }
    if (current()) showPush("off");
  }

  // forgetDevice turns notifications off for a user who signs out, with the
  // token they signed in with: a browser someone signed out of shows none of
  // their notifications. Closing the tab is not signing out: they go on.
  function forgetDevice(token) {
    const device = localStorage.getItem(DEVICE_KEY);
    if (!pushSupported || !device) return;
    localStorage.removeItem(DEVICE_KEY);
    fetch(`/v1/devices/${encodeURIComponent(device)}`, { method: "DELETE", headers: { Authorization: `Bearer ${token}` } })
      .catch(() => {})
      .then(currentSubscription)
      .then((sub) => sub && sub.unsubscribe())
      .catch((err) => console.warn("turn notifications off:", err));
  }

  if (pushSupported) {
    // The worker renewed the subscription (sw.js, pushsubscriptionchange):
    // register the new one.
    navigator.serviceWorker.onmessage = (event) => {
      if (event.data?.type === "spoolcast.pushsubscriptionchange" && state.token) initPush();
    };
  }

  // ---- wiring -------------------------------------------------------------

  $("sign-in-button").addEventListener("click", () => {
    const token = $("token").value;
    if (token.trim()) signIn(token);
  });
  $("read-all").addEventListener("click", markAllRead);
  $("sign-out").addEventListener("click", () => {
    const token = state.token;
    showSignIn("");
    if (token) forgetDevice(token);
  });
  $("push-on").addEventListener("click", turnOn);
  $("push-off").addEventListener("click", turnOff);

  const token = initialToken();
  if (token) {
    signIn(token);
  } else {
    showSignIn("");
  }
})();
