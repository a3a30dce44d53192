// A list of notifications in the DOM, drawn from the store's list (each
// render gets the list as it is now): one <li> per id, kept across renders
// (so focus, and a reader's place, stay), updated when its state changes,
// moved to its place, removed when it leaves. The page's tabs and the
// bell's popover both draw their lists with it.

import type { Notification } from "@spoolcast/client";
import type { Store } from "@spoolcast/react/store";
import { timeElement } from "./time.js";

/** What a view needs of the signed-in session. */
/**
 * onceATurn wraps draw so that the store's changes of one turn of the event
 * loop draw once, after them.
 */
export function onceATurn(draw: () => void): () => void {
  let queued = false;
  return () => {
    if (queued) return;
    queued = true;
    queueMicrotask(() => {
      queued = false;
      draw();
    });
  };
}

export interface View {
  store: Store;
  /** act awaits a mark: a refused token signs out; another failure is said in the live region. */
  act(done: Promise<unknown>, what: string): void;
  /** announce says text in the page's live region (for screen readers). */
  announce(text: string): void;
}

interface Entry {
  li: HTMLLIElement;
  n: Notification;
  state: HTMLSpanElement;
  read?: HTMLButtonElement;
  archive?: HTMLButtonElement;
}

/** ItemList draws notifications into ul: with buttons to mark each read or unread and archive or unarchive, or compact (the bell's). */
export class ItemList {
  private readonly entries = new Map<string, Entry>();

  constructor(
    private readonly ul: HTMLUListElement,
    private readonly view: View,
    private readonly options: { compact?: boolean; onOpen?: (n: Notification) => void } = {},
  ) {}

  get size(): number {
    return this.entries.size;
  }

  /** render makes the list show items, in their order; it answers the ids it added. When focus was on an item that left, it moves to the one now in its place. */
  render(items: readonly Notification[], fallbackFocus?: HTMLElement): Set<string> {
    const keep = new Set(items.map((n) => n.id));
    let lost: { index: number; kind: string } | undefined;
    const active = document.activeElement;
    let index = 0;
    for (const [id, e] of this.entries) {
      if (!keep.has(id)) {
        if (active && e.li.contains(active)) lost = { index, kind: (active as HTMLElement).dataset.kind ?? "" };
        e.li.remove();
        this.entries.delete(id);
      } else {
        index++;
      }
    }
    const added = new Set<string>();
    let prev: HTMLLIElement | null = null;
    for (const n of items) {
      let e = this.entries.get(n.id);
      if (!e) {
        e = this.create(n);
        this.entries.set(n.id, e);
        added.add(n.id);
      } else if (e.n !== n) {
        this.update(e, n);
      }
      const want: Element | null = prev ? prev.nextElementSibling : this.ul.firstElementChild;
      if (want !== e.li) this.ul.insertBefore(e.li, want);
      prev = e.li;
    }
    // Map order is insertion order: keep it the list's, for the next render's indexes.
    if (added.size || lost) {
      const ordered = items.map((n) => [n.id, this.entries.get(n.id)!] as const);
      this.entries.clear();
      for (const [id, e] of ordered) this.entries.set(id, e);
    }
    if (lost) {
      const lis = [...this.entries.values()];
      const next = lis[Math.min(lost.index, lis.length - 1)];
      const target = (next && (next.li.querySelector<HTMLElement>(`[data-kind="${lost.kind}"]`) ?? next.li.querySelector<HTMLElement>("button"))) || fallbackFocus;
      target?.focus();
    }
    return added;
  }

  /** mark flags the items of ids as just arrived (a short highlight). */
  highlight(ids: Iterable<string>): void {
    for (const id of ids) this.entries.get(id)?.li.classList.add("arrived");
  }

  private create(n: Notification): Entry {
    const li = document.createElement("li");
    li.className = "item";
    li.dataset.id = n.id;
    const content = document.createElement("div");
    content.className = "content";
    const state = document.createElement("span"); // "Unread: ", for screen readers
    state.className = "visually-hidden";
    const title = document.createElement("p");
    title.className = "title";
    title.textContent = n.title; // producer text: textContent only, never markup
    content.append(state, title);
    if (n.body && !this.options.compact) {
      const body = document.createElement("p");
      body.className = "body";
      body.textContent = n.body;
      content.append(body);
    }
    const meta = document.createElement("p");
    meta.className = "meta";
    if (n.category) {
      const label = document.createElement("span");
      label.className = "label";
      label.textContent = n.category;
      meta.append(label);
    }
    meta.append(timeElement(n.createdAt));
    content.append(meta);
    li.append(content);
    const e: Entry = { li, n, state };
    if (!this.options.compact) {
      const actions = document.createElement("div");
      actions.className = "item-actions";
      e.read = this.button("read", () => {
        const { store } = this.view;
        const item = e.n;
        this.view.act(item.readAt ? store.markUnread(item.id) : store.markRead(item.id), item.readAt ? "mark unread" : "mark read");
      });
      e.archive = this.button("archive", () => {
        const { store } = this.view;
        const item = e.n;
        this.view.act(item.archivedAt ? store.unarchive(item.id) : store.archive(item.id), item.archivedAt ? "unarchive" : "archive");
      });
      actions.append(e.read, e.archive);
      li.append(actions);
    }
    // A click on the item (not on its buttons) reads it; the bell's opens it.
    li.addEventListener("click", (event) => {
      if ((event.target as Element).closest("button")) return;
      if (!e.n.readAt) this.view.act(this.view.store.markRead(e.n.id), "mark read");
      this.options.onOpen?.(e.n);
    });
    this.update(e, n);
    return e;
  }

  private button(kind: string, onClick: () => void): HTMLButtonElement {
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.kind = kind;
    b.addEventListener("click", onClick);
    return b;
  }

  private update(e: Entry, n: Notification): void {
    e.n = n;
    e.li.classList.toggle("unread", !n.readAt);
    e.state.textContent = n.readAt ? "" : "Unread: ";
    if (e.read) {
      e.read.textContent = n.readAt ? "Mark unread" : "Mark read";
      e.read.setAttribute("aria-label", `${n.readAt ? "Mark unread" : "Mark read"}: ${n.title}`);
    }
    if (e.archive) {
      e.archive.textContent = n.archivedAt ? "Unarchive" : "Archive";
      e.archive.setAttribute("aria-label", `${n.archivedAt ? "Unarchive" : "Archive"}: ${n.title}`);
    }
  }
}
