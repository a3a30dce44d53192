// The feed's order on the client, and which list (tab) a notification
// belongs in: pure functions of notifications, shared by every list the
// store keeps.

import type { Notification, NotificationStatus } from "@spoolcast/client";

/**
 * createdMicros orders notifications as the feed does: `createdAt` carries
 * microseconds, which a Date drops, and the server trims trailing zeros,
 * so neither a Date nor comparing the strings would do.
 */
export function createdMicros(iso: string): number {
  const m = /^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$/.exec(iso);
  if (!m) return Date.parse(iso) * 1000;
  return Date.parse(m[1]! + m[3]!) * 1000 + Number((m[2] ?? "").padEnd(6, "0").slice(0, 6));
}

/** micros is n's createdMicros. */
export const micros = (n: Notification): number => createdMicros(n.createdAt);

/**
 * merge puts each notification not yet in items at its place in feed order,
 * newest first by createdAt. A live notification is almost always the
 * newest, but one whose transaction committed late goes below newer ones,
 * as the feed lists it. Ties are common: a notification's createdAt is its
 * ingest transaction's start, shared by a batch. The feed breaks them by
 * the order of persistence, which the stream follows and pages show, so a
 * live one goes above those of its time (it committed after them) and a
 * page's go below (a page is newest first); ids, opaque, are never compared.
 * @internal
 */
export function merge(items: readonly Notification[], more: readonly Notification[], live: boolean): readonly Notification[] {
  const ids = new Set(items.map((n) => n.id));
  let out: Notification[] | undefined;
  for (const n of more) {
    if (ids.has(n.id)) continue;
    ids.add(n.id);
    out ??= items.slice();
    const t = micros(n);
    let lo = 0;
    let hi = out.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      const m = micros(out[mid]!);
      if (m > t || (m === t && !live)) lo = mid + 1;
      else hi = mid;
    }
    out.splice(lo, 0, n);
  }
  return out ?? items;
}

/** belongs says whether n is in the list: `all` and `unread` leave the archived out. */
export const belongs = (status: NotificationStatus, n: Notification): boolean =>
  status === "archived" ? !!n.archivedAt : !n.archivedAt && (status === "all" || !n.readAt);
