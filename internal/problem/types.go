package problem

// Type is one kind of problem: the slug its type URI ends in
// (urn:spoolcast:problem:<slug>), which clients branch on, and its title.
// Every problem spoolcast answers with is one of the types below.
type Type struct {
	Slug  string
	Title string
}

// URI is the type's stable URI.
func (t Type) URI() string { return typeURI(t.Slug) }

// The problem types of every spoolcast API, in one table; docs/api.md lists
// them for users.
var (
	// AlreadySent: the event's notifications were sent; it cannot be cancelled.
	AlreadySent = Type{"already-sent", "Already sent"}
	// AppUpdateRequired: the app's version is below the floor the API still serves.
	AppUpdateRequired = Type{"app-update-required", "App update required"}
	// BodyTooLarge: the request body is over the route's limit.
	BodyTooLarge = Type{"body-too-large", "Body too large"}
	// DatabaseUnavailable: Postgres cannot be reached; retry shortly.
	DatabaseUnavailable = Type{"database-unavailable", "Service unavailable"}
	// DiskFull: the relay's disk is full; retry later with the same key.
	DiskFull = Type{"disk-full", "Disk full"}
	// Forbidden: the token is valid but lacks the scope or role.
	Forbidden = Type{"forbidden", "Forbidden"}
	// IdempotencyKeyReused: the key was used before for a different request.
	IdempotencyKeyReused = Type{"idempotency-key-reused", "Idempotency key reused"}
	// InternalError: a bug: the server could not answer.
	InternalError = Type{"internal-error", "Internal error"}
	// InvalidAppVersion: the app-version header does not parse.
	InvalidAppVersion = Type{"invalid-app-version", "Invalid app version"}
	// InvalidCursor: a cursor that does not decode; start again from the top.
	InvalidCursor = Type{"invalid-cursor", "Invalid cursor"}
	// InvalidEvent: the event breaks a rule; field names it.
	InvalidEvent = Type{"invalid-event", "Invalid event"}
	// InvalidQuery: a query parameter is out of range.
	InvalidQuery = Type{"invalid-query", "Invalid query"}
	// InvalidRequest: the request body breaks a rule.
	InvalidRequest = Type{"invalid-request", "Invalid request"}
	// InvalidPushToken: the device token is not an Expo push token.
	InvalidPushToken = Type{"invalid-token", "Invalid push token"}
	// MalformedEvent: the body is not the JSON of an event.
	MalformedEvent = Type{"malformed-event", "Malformed event"}
	// MethodNotAllowed: the route does not take this method.
	MethodNotAllowed = Type{"method-not-allowed", "Method not allowed"}
	// NotAWebSocket: the stream was asked for without a WebSocket upgrade.
	NotAWebSocket = Type{"not-a-websocket", "Not a WebSocket handshake"}
	// LimitReached: the resource is at its limit (webhook endpoints).
	LimitReached = Type{"limit-reached", "Limit reached"}
	// NotFound: no such route or resource, or another user's.
	NotFound = Type{"not-found", "Not found"}
	// NotReady: /readyz: the process cannot do its work now; detail says why.
	NotReady = Type{"not-ready", "Not ready"}
	// OriginNotAllowed: a browser page whose Origin --allowed-origins does not list opened the stream.
	OriginNotAllowed = Type{"origin-not-allowed", "Origin not allowed"}
	// Overloaded: the spool is at its limit, shutting down or slow; retry later with the same key.
	Overloaded = Type{"overloaded", "Service unavailable"}
	// PreferencesExternal: preferences are served by the producer's own service.
	PreferencesExternal = Type{"preferences-external", "Preferences are kept elsewhere"}
	// RateLimited: the caller (a user, or an address sending bad tokens) is past its rate limit.
	RateLimited = Type{"rate-limited", "Too many requests"}
	// RequestTimeout: the body did not arrive in time; retry with the same key.
	RequestTimeout = Type{"request-timeout", "Request timeout"}
	// SpoolError: the spool could not be written; retry with the same key.
	SpoolError = Type{"spool-error", "Spool error"}
	// Starting: central has not finished starting; retry in a moment.
	Starting = Type{"starting", "Starting"}
	// StreamDisabled: the live stream is off on this deployment.
	StreamDisabled = Type{"stream-disabled", "Not found"}
	// StreamUnavailable: the live stream cannot serve now; retry shortly.
	StreamUnavailable = Type{"stream-unavailable", "Stream unavailable"}
	// TooManySockets: the user holds the most stream sockets one replica serves one user.
	TooManySockets = Type{"too-many-sockets", "Too many sockets"}
	// Unauthorized: no valid token; detail says why.
	Unauthorized = Type{"unauthorized", "Unauthorized"}
	// UnknownEvent: no event with this key was ingested for the caller.
	UnknownEvent = Type{"unknown-event", "Unknown event"}
	// UnknownAPIVersion: the API version asked for is not served.
	UnknownAPIVersion = Type{"unknown-api-version", "Unknown API version"}
	// UnsupportedMediaType: the body is not application/json.
	UnsupportedMediaType = Type{"unsupported-media-type", "Unsupported media type"}
)

// Types lists every problem type, for documentation and its test.
var Types = []Type{
	AlreadySent,
	AppUpdateRequired,
	BodyTooLarge,
	DatabaseUnavailable,
	DiskFull,
	Forbidden,
	IdempotencyKeyReused,
	InternalError,
	InvalidAppVersion,
	InvalidCursor,
	InvalidEvent,
	InvalidQuery,
	InvalidRequest,
	InvalidPushToken,
	LimitReached,
	MalformedEvent,
	MethodNotAllowed,
	NotAWebSocket,
	NotFound,
	NotReady,
	OriginNotAllowed,
	Overloaded,
	PreferencesExternal,
	RateLimited,
	RequestTimeout,
	SpoolError,
	Starting,
	StreamDisabled,
	StreamUnavailable,
	TooManySockets,
	Unauthorized,
	UnknownEvent,
	UnknownAPIVersion,
	UnsupportedMediaType,
}
