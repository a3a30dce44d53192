// Relative times ("3 min ago"), kept current: each <time> the page shows
// is written again when its text would change, by one timer set for the
// soonest such moment (not a tick every second). The full date is its
// title, and its datetime attribute the instant, for screen readers and
// hover.

const MIN = 60_000;
const HOUR = 60 * MIN;
const DAY = 24 * HOUR;

const dateFormat = new Intl.DateTimeFormat("en", { month: "short", day: "numeric" });
const yearFormat = new Intl.DateTimeFormat("en", { year: "numeric", month: "short", day: "numeric" });
const fullFormat = new Intl.DateTimeFormat("en", { dateStyle: "full", timeStyle: "medium" });

/** relative is how long ago `at` was, in words, and in how many ms those words change (Infinity: never). */
export function relative(at: number, now: number): { text: string; next: number } {
  const age = Math.max(0, now - at);
  const step = (unit: number) => unit - (age % unit);
  if (age < MIN) return { text: "just now", next: MIN - age };
  if (age < HOUR) return { text: `${Math.floor(age / MIN)} min ago`, next: step(MIN) };
  if (age < DAY) return { text: `${Math.floor(age / HOUR)} h ago`, next: step(HOUR) };
  if (age < 2 * DAY) return { text: "yesterday", next: 2 * DAY - age };
  if (age < 7 * DAY) return { text: `${Math.floor(age / DAY)} days ago`, next: step(DAY) };
  const date = new Date(at);
  return { text: (date.getFullYear() === new Date(now).getFullYear() ? dateFormat : yearFormat).format(date), next: Infinity };
}

const shown = new Set<HTMLTimeElement>();
let timer: ReturnType<typeof setTimeout> | undefined;

/** timeElement makes a <time> for an RFC 3339 instant that says how long ago it was, kept current while it is in the page. */
export function timeElement(iso: string): HTMLTimeElement {
  const el = document.createElement("time");
  el.dateTime = iso;
  const at = Date.parse(iso);
  if (!Number.isNaN(at)) el.title = fullFormat.format(at);
  shown.add(el);
  refreshTimes();
  return el;
}

/** refreshTimes writes every shown time again (those no longer in the page are forgotten) and sets the timer for the next change. */
export function refreshTimes(): void {
  clearTimeout(timer);
  const now = Date.now();
  let next = Infinity;
  for (const el of shown) {
    if (!el.isConnected && el.textContent) {
      shown.delete(el);
      continue;
    }
    const at = Date.parse(el.dateTime);
    if (Number.isNaN(at)) continue;
    const r = relative(at, now);
    if (el.textContent !== r.text) el.textContent = r.text;
    next = Math.min(next, r.next);
  }
  // A little after the change, never in a busy loop, and at least each minute (a clock that jumped).
  if (shown.size) timer = setTimeout(refreshTimes, Math.min(Math.max(next + 50, 500), MIN));
}
