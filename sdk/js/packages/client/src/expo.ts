// Clears for apps built with Expo: when a notification is read or archived
// on any device, central sends the user's other devices a silent message,
// data {"type": "clear", "ids": [...]}, naming the notifications whose
// banners to take down (docs/api.md, "Clears"). The app passes in its
// expo-notifications module; this file imports nothing, so the core stays
// free of it, and a bundle that does not use it leaves it out.

/** A presented notification, as expo-notifications describes one. */
export interface PresentedNotification {
  request: { identifier: string; content: { data?: Record<string, unknown> | null } };
}

/** What the clear helpers use of the expo-notifications module. */
export interface ExpoNotificationsLike {
  getPresentedNotificationsAsync(): Promise<PresentedNotification[]>;
  dismissNotificationAsync(identifier: string): Promise<void>;
  addNotificationReceivedListener(listener: (notification: PresentedNotification) => void): { remove(): void };
}

/** The ids a clear names, or null when data is not a clear. */
export function clearedIds(data: unknown): string[] | null {
  if (typeof data !== "object" || data === null) return null;
  const d = data as { type?: unknown; ids?: unknown };
  if (d.type !== "clear" || !Array.isArray(d.ids)) return null;
  return d.ids.filter((id): id is string => typeof id === "string");
}

/**
 * handleClearMessage dismisses every presented notification whose push
 * named one of the clear's ids (data.notification_id, as central sends it),
 * and returns how many. Data that is not a clear dismisses nothing.
 */
export async function handleClearMessage(notifications: ExpoNotificationsLike, data: unknown): Promise<number> {
  const ids = clearedIds(data);
  if (!ids || ids.length === 0) return 0;
  const wanted = new Set(ids);
  const presented = await notifications.getPresentedNotificationsAsync();
  let dismissed = 0;
  for (const n of presented) {
    const id = n.request.content.data?.["notification_id"];
    if (typeof id === "string" && wanted.has(id)) {
      await notifications.dismissNotificationAsync(n.request.identifier);
      dismissed++;
    }
  }
  return dismissed;
}

/**
 * clearPresentedOnRead listens for clears while the app runs and dismisses
 * the banners they name; it returns the unsubscribe. (A clear that arrives
 * with the app in the background reaches a background task the app
 * registers, which calls handleClearMessage itself.)
 */
export function clearPresentedOnRead(notifications: ExpoNotificationsLike, onError?: (err: unknown) => void): () => void {
  const sub = notifications.addNotificationReceivedListener((n) => {
    handleClearMessage(notifications, n.request.content.data).catch((err: unknown) => onError?.(err));
  });
  return () => sub.remove();
}
