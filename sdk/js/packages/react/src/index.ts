// @spoolcast/react: hooks over @spoolcast/client, a thin layer sharing one
// live subscription per provider. React is a peer dependency; nothing here
// uses the DOM, so it runs under React Native too. See README.md.

export { SpoolcastProvider, useNotifications, useUnreadCount, useCounts, useStreamStatus, useSpoolcastClient } from "./hooks.js";
export type { SpoolcastProviderProps, NotificationsOptions, NotificationsResult } from "./hooks.js";
export type { FeedState, UnreadState, CountsState } from "./store.js";
