// The bell and its popover: a component an app puts in its header beside
// (or instead of) the full page, drawn from the same store, so both agree
// at once. The bell counts what is new (unseen); opening it shows the
// latest notifications and tells the server they were seen (every session
// of the user follows, and pushes of them may be suppressed). A click on
// one reads it. Escape, a click outside or the bell again closes it,
// focus going back to the bell.

import type { Store } from "@spoolcast/react/store";
import { ItemList, onceATurn, type View } from "./items.js";
import { shownCount } from "./tabs.js";

/** How many of the latest the popover shows. */
const LATEST = 6;

const SVG = "http://www.w3.org/2000/svg";

function bellIcon(): SVGSVGElement {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("aria-hidden", "true");
  for (const d of ["M18 8a6 6 0 0 0-12 0c0 7-3 9-3 9h18s-3-2-3-9", "M13.7 21a2 2 0 0 1-3.4 0"]) {
    const path = document.createElementNS(SVG, "path");
    path.setAttribute("d", d);
    svg.append(path);
  }
  return svg;
}

function el<K extends keyof HTMLElementTagNameMap>(tag: K, props: Partial<HTMLElementTagNameMap[K]> = {}, ...children: (Node | string)[]): HTMLElementTagNameMap[K] {
  const e = Object.assign(document.createElement(tag), props);
  e.append(...children);
  return e;
}

/** mountBell draws the bell into root; onSeeAll goes to the full list. The function it returns takes it down. */
export function mountBell(root: HTMLElement, view: View, onSeeAll: () => void): () => void {
  const store: Store = view.store;
  const count = el("span", { id: "bell-count", className: "count", hidden: true });
  const button = el("button", { id: "bell", type: "button", className: "bell-button" }, bellIcon(), count);
  button.setAttribute("aria-haspopup", "dialog");
  button.setAttribute("aria-expanded", "false");
  button.setAttribute("aria-controls", "bell-popover");
  const readAll = el("button", { id: "bell-read-all", type: "button", textContent: "Mark all read" });
  const ul = el("ul", { id: "bell-list", className: "items" });
  ul.setAttribute("role", "list");
  const empty = el("p", { id: "bell-empty", className: "empty", hidden: true, textContent: "Nothing here yet." });
  const seeAll = el("button", { id: "bell-see-all", type: "button", textContent: "See all" });
  const popover = el(
    "div",
    { id: "bell-popover", className: "popover", hidden: true, tabIndex: -1 },
    el("div", { className: "popover-head" }, el("h2", { id: "bell-title", textContent: "Notifications" }), readAll),
    ul,
    empty,
    el("div", { className: "popover-foot" }, seeAll),
  );
  popover.setAttribute("role", "dialog");
  popover.setAttribute("aria-labelledby", "bell-title");
  root.replaceChildren(button, popover);
  root.hidden = false;

  const list = new ItemList(ul, view, { compact: true });
  const releases = [store.hold("feed:all"), store.hold("counts")];

  const isOpen = () => !popover.hidden;
  function open() {
    popover.hidden = false;
    button.setAttribute("aria-expanded", "true");
    render();
    store.markSeen();
    popover.focus();
  }
  function close(refocus: boolean) {
    if (!isOpen()) return;
    popover.hidden = true;
    button.setAttribute("aria-expanded", "false");
    if (refocus) button.focus();
  }

  const onButton = () => (isOpen() ? close(false) : open());
  const onKey = (e: KeyboardEvent) => {
    if (e.key === "Escape" && isOpen()) {
      e.preventDefault();
      close(true);
    }
  };
  const onOutside = (e: MouseEvent) => {
    if (isOpen() && !root.contains(e.target as Node)) close(false);
  };
  button.addEventListener("click", onButton);
  root.addEventListener("keydown", onKey);
  document.addEventListener("click", onOutside);
  readAll.addEventListener("click", () => view.act(store.markAllRead(), "mark all read"));
  seeAll.addEventListener("click", () => {
    close(false);
    onSeeAll();
  });

  const unsubscribe = store.subscribe(onceATurn(() => render()));

  function render() {
    const c = store.getCounts();
    const text = shownCount(count, c.unseen, c.loading);
    button.setAttribute("aria-label", count.hidden ? "Notifications" : `Notifications, ${text} new`);
    if (!isOpen()) return;
    // While it is open, what arrives is seen.
    if (!c.loading && c.unseen.count > 0) store.markSeen();
    const f = store.getFeed("all");
    list.render(f.items.slice(0, LATEST), popover);
    empty.hidden = f.loading || f.items.length > 0;
  }

  render();
  return () => {
    unsubscribe();
    for (const r of releases) r();
    document.removeEventListener("click", onOutside);
    root.replaceChildren();
    root.hidden = true;
  };
}
