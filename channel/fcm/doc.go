// Package fcm is the channel to Firebase Cloud Messaging's HTTP v1 API:
// POST https://fcm.googleapis.com/v1/projects/{project}/messages:send, one
// message a request, each with an OAuth2 access token bought with a
// service account's key (a JWT grant, golang.org/x/oauth2/jwt) and reused
// until TokenRefresh before it expires.
//
// The rule it keeps: only what FCM says of a token disables a device. A
// refusal of our credentials, a wrong project, a quota or an outage is
// never a token's fault, and a request whose answer was lost is Unknown,
// never sent again (FCM has no idempotency key), so that a push reaches a
// device at most once.
//
// # Outcomes
//
// FCM's error codes are those of its ErrorCode reference
// (https://firebase.google.com/docs/reference/fcm/rest/v1/ErrorCode),
// read from the FcmError detail of the answer, else from its status:
//
//	FCM's answer                               Outcome
//	200                                        Delivered, ID = its name (projects/P/messages/M)
//	404 UNREGISTERED                           TokenGone
//	400 INVALID_ARGUMENT naming the token      TokenInvalid (a field violation of message.token,
//	                                           or "The registration token is not a valid FCM
//	                                           registration token")
//	400 INVALID_ARGUMENT, anything else        Failed (the message, not the token)
//	403 SENDER_ID_MISMATCH                     TokenForeign (the token is another project's
//	                                           app's; every device's: the service account
//	                                           is wrong, which the dispatcher's guard tells)
//	429 QUOTA_EXCEEDED                         RetryAfter, Wait = Retry-After, else 1 min (FCM's
//	                                           documented least wait for it)
//	429 RESOURCE_EXHAUSTED, any 429            RetryAfter, Wait = Retry-After
//	503 UNAVAILABLE, 500 INTERNAL              RetryAfter, Wait = Retry-After
//	any other 5xx (a front end's 502, 504)     Unknown: FCM may have taken it
//	401 THIRD_PARTY_AUTH_ERROR                 Failed, Credentials (the app's APNs certificate or
//	                                           Web Push key in Firebase is wrong)
//	401 UNAUTHENTICATED                        RetryAfter, and the cached token dropped: the
//	                                           next Send fetches another; Credentials (an
//	                                           operator's alert) only when that fresh token
//	                                           is refused too
//	403 PERMISSION_DENIED (or any other 401,   RetryAfter, Credentials (our service account:
//	403)                                       an operator's alert)
//	404 without UNREGISTERED, other 4xx,       Failed
//	UNSPECIFIED_ERROR
//
// Before FCM, and around it:
//
//	the token endpoint refused the grant (4xx) RetryAfter, Credentials, Code = its OAuth error
//	the token endpoint down or out of reach    RetryAfter (nothing was sent)
//	ctx ended before the request was written   NotSent
//	no answer, the request not written         RetryAfter (a dial or TLS error: FCM never had it)
//	no answer, the request written             Unknown (a connection dropped, a timeout awaiting
//	                                           the answer: FCM may have taken it)
//
// Whether a request was written is what net/http/httptrace's WroteRequest
// reports for it: the request flushed whole to the connection.
//
// Outcome.Status is FCM's HTTP status, Outcome.Code its error code,
// Outcome.Reason its words: "FCM 404 UNREGISTERED: Requested entity was
// not found.".
//
// # Messages
//
// A message is a notification (title and body, shortened at a rune with
// "…" so that notification and data stay within FCM's 4096-byte payload
// with room for what FCM adds through APNs) with data for the app: id,
// category and Message.Data, whose values FCM takes as strings only, so
// that any other value is sent as its JSON; keys FCM keeps for itself
// (from, message_type, google…, gcm…) are left out rather than have FCM
// refuse the message. Message.Collapse() is the android collapse_key, the
// android notification's tag (which replaces a banner still shown) and
// apns-collapse-id; Urgent is android priority HIGH and apns-priority 10;
// Expires (or DefaultTTL) is android's ttl and apns-expiration.
package fcm
