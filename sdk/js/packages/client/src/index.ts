// @spoolcast/client: a headless client of spoolcast's central (docs/api.md),
// with no dependency at run time. See README.md.

export { SpoolcastClient, API_VERSION } from "./client.js";
export type { SpoolcastClientOptions, NotificationsApi, DevicesApi, PreferencesApi, TopicsApi } from "./client.js";
export type { SubscribeOptions, Subscription, StreamStatus, StreamState, StatusReason, TransportName, ResetInfo } from "./stream.js";
export type { TokenFunction } from "./tokens.js";
export type { WebSocketLike, WebSocketConstructor } from "./transports.js";
export { EventStreamParser } from "./event_stream.js";
export type { ServerSentEvent } from "./event_stream.js";
export type {
  Notification,
  Page,
  ListOptions,
  NotificationStatus,
  Count,
  Counts,
  UnreadCount,
  ReadAllResult,
  ArchiveAllResult,
  ReadEvent,
  StateEvent,
  Device,
  WebPushSubscriptionJSON,
  Preferences,
  PreferencesUpdate,
  QuietHours,
  TopicSubscription,
  TopicPage,
} from "./types.js";
export {
  SpoolcastError,
  RateLimitedError,
  TooManySocketsError,
  UnauthorizedError,
  ForbiddenError,
  NotFoundError,
  InvalidCursorError,
  InvalidRequestError,
  UnavailableError,
  AppUpdateRequiredError,
  NetworkError,
  TokenError,
  ClientClosedError,
} from "./errors.js";
export type { Problem } from "./errors.js";
export { clearPresentedOnRead, handleClearMessage, clearedIds, type ExpoNotificationsLike, type PresentedNotification } from "./expo.js";
