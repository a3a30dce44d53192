// The preferences panel, over GET and PUT /v1/preferences: push on or off
// per category (the categories the user set, and those of the
// notifications shown; one not set pushes), and quiet hours in a time zone
// (pushes held until they end; the inbox gets everything at once). A
// modal <dialog>: focus moves into it, Escape closes it, and focus comes
// back to the button that opened it. A deployment whose preferences are
// kept by the product's own API says so (404 preferences-external).

import { NotFoundError, SpoolcastError, type Preferences, type SpoolcastClient } from "@spoolcast/client";
import type { Store } from "@spoolcast/react/store";
import { reason } from "./tabs.js";

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;

/** The IANA zones the browser knows, its own first. */
function zones(): string[] {
  const own = Intl.DateTimeFormat().resolvedOptions().timeZone;
  const all = (Intl as { supportedValuesOf?: (key: string) => string[] }).supportedValuesOf?.("timeZone") ?? [];
  return [own, ...all.filter((z) => z !== own)];
}

/** mountPreferences wires the panel for a session; the function it returns takes it down. */
export function mountPreferences(client: SpoolcastClient, store: Store, act: (done: Promise<unknown>, what: string) => void): () => void {
  const dialog = $<HTMLDialogElement>("prefs");
  const opener = $<HTMLButtonElement>("prefs-open");
  const message = $("prefs-message");
  const form = $("prefs-form");
  const save = $<HTMLButtonElement>("prefs-save");
  const quietOn = $<HTMLInputElement>("quiet-on");
  const start = $<HTMLInputElement>("quiet-start");
  const end = $<HTMLInputElement>("quiet-end");
  const zone = $<HTMLSelectElement>("quiet-zone");
  let turn = 0; // each opening: answers to an older one are dropped
  let loaded: Preferences | null = null;

  const say = (text: string, error = false) => {
    message.textContent = text;
    message.classList.toggle("error", error);
  };
  const quietEnabled = () => {
    for (const input of [start, end, zone]) input.disabled = !quietOn.checked;
  };

  function show(p: Preferences) {
    loaded = p;
    // The categories set, and those of what the lists show: one not set pushes.
    const names = new Set(Object.keys(p.categories));
    for (const s of ["all", "unread", "archived"] as const) for (const n of store.getFeed(s).items) if (n.category) names.add(n.category);
    const boxes = [...names].sort().map((name) => {
      const input = document.createElement("input");
      input.type = "checkbox";
      input.dataset.category = name;
      input.checked = p.categories[name]?.push ?? true;
      const label = document.createElement("label");
      label.className = "check";
      label.append(input, document.createTextNode(name));
      return label;
    });
    $("prefs-categories").replaceChildren(...boxes);
    $("prefs-no-categories").hidden = boxes.length > 0;
    if (zone.options.length === 0) zone.append(...zones().map((z) => new Option(z, z)));
    quietOn.checked = !!p.quietHours;
    if (p.quietHours) {
      start.value = p.quietHours.start;
      end.value = p.quietHours.end;
      if (![...zone.options].some((o) => o.value === p.quietHours!.timeZone)) zone.append(new Option(p.quietHours.timeZone, p.quietHours.timeZone));
      zone.value = p.quietHours.timeZone;
    } else {
      zone.value = zones()[0]!;
    }
    quietEnabled();
    form.hidden = false;
    save.hidden = false;
  }

  async function openPanel() {
    const mine = ++turn;
    loaded = null;
    form.hidden = true;
    save.hidden = true;
    say("");
    dialog.showModal();
    // Say "Loading…" only if the answer is slow.
    const slow = setTimeout(() => mine === turn && !loaded && say("Loading…"), 300);
    try {
      const p = await client.preferences.get();
      if (mine !== turn) return;
      say("");
      show(p);
      (form.querySelector<HTMLElement>("input") ?? save).focus();
    } catch (err) {
      if (mine !== turn) return;
      if (err instanceof NotFoundError && err.code === "preferences-external") say("Your preferences are kept by the product's own settings: change them there.");
      else if (err instanceof SpoolcastError && err.status === 401) act(Promise.reject(err), "preferences");
      else say(`Could not load your preferences: ${reason(err)}`, true);
    } finally {
      clearTimeout(slow);
    }
  }

  async function savePanel() {
    if (!loaded) return;
    const mine = turn;
    const categories: Record<string, { push: boolean }> = {};
    for (const input of $("prefs-categories").querySelectorAll<HTMLInputElement>("input[data-category]")) {
      categories[input.dataset.category!] = { push: input.checked };
    }
    const quietHours = quietOn.checked ? { start: start.value, end: end.value, timeZone: zone.value } : null;
    save.disabled = true;
    say("Saving…");
    try {
      const p = await client.preferences.update({ categories, quietHours });
      if (mine !== turn) return;
      loaded = p;
      say("Saved.");
    } catch (err) {
      if (mine !== turn) return;
      if (err instanceof SpoolcastError && err.status === 401) act(Promise.reject(err), "preferences");
      // The server says what is wrong (a bad window, an unknown zone).
      else say(`Not saved: ${reason(err)}`, true);
    } finally {
      save.disabled = false;
    }
  }

  const onOpen = () => void openPanel();
  const onSave = () => void savePanel();
  const onClose = () => dialog.close();
  const onClosed = () => {
    turn++;
    opener.focus();
  };
  opener.addEventListener("click", onOpen);
  save.addEventListener("click", onSave);
  $("prefs-close").addEventListener("click", onClose);
  quietOn.addEventListener("change", quietEnabled);
  dialog.addEventListener("close", onClosed);
  opener.hidden = false;
  return () => {
    turn++;
    opener.removeEventListener("click", onOpen);
    save.removeEventListener("click", onSave);
    $("prefs-close").removeEventListener("click", onClose);
    quietOn.removeEventListener("change", quietEnabled);
    dialog.removeEventListener("close", onClosed);
    if (dialog.open) dialog.close();
    opener.hidden = true;
  };
}
