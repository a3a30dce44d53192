// spoolcast inbox — the reference client for app developers.
//
// It shows how an app uses central's API (docs/api.md):
//   1. open the live stream (/v1/stream) and wait for its "ready" frame;
//   2. load the feed (/v1/notifications), newest first, one page at a time as
//      the user scrolls, following next_cursor;
//   3. put each "notification" frame at the top, keep the cursor of the last
//      frame, and after a dropped connection reconnect with ?after=<cursor>:
//      the server sends what was missed, then "ready", then live frames;
//   4. keep one item per id: an item may come both in the feed and as a frame.
// Unread counts come from /v1/notifications/unread-count (capped at 100:
// "99+"); marking read is POST …/{id}/read and POST …/read-all; "read" frames
// tell this session what another one marked.
//
// No framework, no build step: plain DOM calls. Producer text is always set
// with textContent, never as HTML.
"use strict";

(() => {
  const PAGE_SIZE = 20;
  const PROTOCOL = "spoolcast.bearer.v1"; // the token rides beside it in Sec-WebSocket-Protocol

  const state = {
    token: null,
    items: new Map(),     // id → {item, li}
    nextCursor: null,     // the feed's cursor for the next (older) page
    feedDone: false,      // the last page has been read
    loadingPage: false,
    streamCursor: null,   // the cursor of the last frame: where a reconnect resumes
    socket: null,
    retries: 0,           // failed connections in a row, for the backoff
    feedLoaded: false,
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

  function showSignIn(message) {
    stopStream();
    state.token = null;
    sessionStorage.removeItem("spoolcast.token");
    $("inbox").hidden = true;
    $("read-all").hidden = true;
    $("sign-out").hidden = true;
    $("badge").hidden = true;
    $("sign-in").hidden = false;
    $("sign-in-error").textContent = message || "";
    setStatus("offline");
  }

  function signIn(token) {
    state.token = token.trim();
    sessionStorage.setItem("spoolcast.token", state.token);
    $("sign-in").hidden = true;
    $("inbox").hidden = false;
    $("read-all").hidden = false;
    $("sign-out").hidden = false;
    openStream();
  }

  // ---- the API ---------------------------------------------------------------

  class Unauthorized extends Error {}

  // api calls central with the token; a 401 sends the user back to sign-in
  // with the server's reason (expired, another audience, …).
  async function api(path, options = {}) {
    const response = await fetch(path, {
      ...options,
      headers: { Authorization: `Bearer ${state.token}`, ...(options.headers || {}) },
    });
    if (response.status === 401) {
      const problem = await response.json().catch(() => ({}));
      showSignIn(`Signed out: ${problem.detail || "the token was refused"}.`);
      throw new Unauthorized();
    }
    if (!response.ok && response.status !== 204) {
      const problem = await response.json().catch(() => ({}));
      throw new Error(problem.detail || `HTTP ${response.status}`);
    }
    return response.status === 204 ? null : response.json();
  }

  // ---- the feed ------------------------------------------------------------

  async function loadPage() {
    if (state.loadingPage || state.feedDone) return;
    state.loadingPage = true;
    try {
      const query = new URLSearchParams({ limit: PAGE_SIZE });
      if (state.nextCursor) query.set("cursor", state.nextCursor);
      const page = await api(`/v1/notifications?${query}`);
      for (const item of page.data) addItem(item, "bottom");
      state.nextCursor = page.next_cursor;
      state.feedDone = !page.has_more;
      state.feedLoaded = true;
    } catch (err) {
      if (!(err instanceof Unauthorized)) $("more").textContent = `Could not load: ${err.message}`;
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

  // addItem shows an item once, whichever way it came.
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
    li.addEventListener("click", () => markRead(item.id));
    const feed = $("feed");
    if (where === "top") {
      feed.prepend(li);
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
      if (!(err instanceof Unauthorized)) console.warn("mark read:", err);
    }
  }

  async function markAllRead() {
    try {
      const { read_through } = await api("/v1/notifications/read-all", { method: "POST" });
      if (read_through) showReadThrough(read_through);
      refreshBadge();
    } catch (err) {
      if (!(err instanceof Unauthorized)) console.warn("mark all read:", err);
    }
  }

  // showReadThrough marks an item and everything below it in the list (feed
  // order): what read-all covered. Ids are opaque, so the list's order is
  // the only order the client knows.
  function showReadThrough(id) {
    const lis = [...$("feed").children];
    const at = lis.findIndex((li) => li.dataset.id === id);
    for (const li of at < 0 ? lis : lis.slice(at)) showRead(li.dataset.id);
  }

  let badgeTimer = null;
  // refreshBadge asks the server, which knows about rows not loaded here;
  // bursts of calls are folded into one.
  function refreshBadge() {
    clearTimeout(badgeTimer);
    badgeTimer = setTimeout(async () => {
      try {
        const { count, capped } = await api("/v1/notifications/unread-count");
        const badge = $("badge");
        badge.textContent = capped ? "99+" : String(count);
        badge.hidden = count === 0;
        document.title = count ? `(${badge.textContent}) Inbox · spoolcast` : "Inbox · spoolcast";
      } catch (err) {
        if (!(err instanceof Unauthorized)) console.warn("unread count:", err);
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
    const socket = new WebSocket(url, [PROTOCOL, state.token]);
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
          setStatus("live");
          // First connection: now load the feed. Everything committed before
          // "ready" is in it; everything after comes as frames.
          if (!state.feedLoaded) loadPage();
          break;
        case "read":
          if (frame.id) showRead(frame.id);
          if (frame.through) showReadThrough(frame.through);
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
        // the status, so ask an ordinary route: a 401 there signs out.
        api("/v1/notifications/unread-count").catch(() => {});
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

  // ---- wiring -------------------------------------------------------------

  $("sign-in-button").addEventListener("click", () => {
    const token = $("token").value;
    if (token.trim()) signIn(token);
  });
  $("read-all").addEventListener("click", markAllRead);
  $("sign-out").addEventListener("click", () => showSignIn(""));

  const token = initialToken();
  if (token) {
    signIn(token);
  } else {
    showSignIn("");
  }
})();
