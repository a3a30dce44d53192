// Package apns is the channel to Apple's push service: HTTP/2 to
// api.push.apple.com (api.sandbox.push.apple.com for development builds),
// authenticated by a provider token, an ES256 JWT signed with the team's
// .p8 key. The protocol is github.com/sideshow/apns2's: one client, one
// HTTP/2 connection multiplexing up to Config.Concurrency streams, and a
// JWT it signs again before each hour is out.
//
// The rule it keeps: a message whose request may have reached Apple is
// never answered as one that did not. Each answer maps to one
// channel.Outcome:
//
//	APNs answer                                          Outcome
//	---------------------------------------------------  -------------------------------
//	200                                                  Delivered, ID = apns-id
//	410 Unregistered, ExpiredToken                       TokenGone, InvalidSince = its
//	                                                     timestamp
//	400 BadDeviceToken                                   TokenInvalid (every device's:
//	                                                     --apns-sandbox is wrong; the
//	                                                     dispatcher's guard tells)
//	400 DeviceTokenNotForTopic                           TokenForeign: another app's
//	                                                     token (every device's: the
//	                                                     topic is wrong, as above)
//	400 TopicDisallowed, BadTopic, MissingTopic          Failed, Credentials: the topic
//	                                                     is wrong; no device to blame
//	400 any other (PayloadEmpty, BadCollapseId,          Failed, Code = the reason
//	    BadExpirationDate, BadPriority, ...)
//	403 ExpiredProviderToken                             RetryAfter: signed again, no alert
//	403 any other (InvalidProviderToken, Forbidden,      Failed, Credentials: an operator
//	    MissingProviderToken, BadCertificate, ...)       must fix the key; never retried
//	413 PayloadTooLarge; 404, 405                        Failed
//	429 TooManyRequests (to one device)                  RetryAfter, Wait = Retry-After,
//	                                                     else TooManyWait (1 min)
//	429 TooManyProviderTokenUpdates                      RetryAfter, Wait = Retry-After,
//	                                                     Credentials: replicas renew
//	                                                     tokens of their own (Tokens)
//	500 InternalServerError, 503 ServiceUnavailable,     RetryAfter, Wait = Retry-After
//	    Shutdown
//	any other 5xx (a proxy's 502, 504)                   Unknown: APNs may have taken it
//	ctx ended before the request was written             NotSent
//	no connection (refused, TLS handshake failed),       RetryAfter: not taken
//	    or the request timed out before being written
//	no answer after the request was written              Unknown: maybe delivered
//	    (connection reset, timeout awaiting the answer)
//
// Before sending, a token that is not hex of 64 to 200 characters is
// TokenInvalid, and a payload that cannot fit 4096 bytes even with its
// title and body cut is Failed (Code PayloadTooLarge); neither is sent.
//
// Written or not: apns2 returns the transport's error without saying how
// far the request got, so the channel traces each request
// (net/http/httptrace). HTTP/2 writes a request's HEADERS frame before its
// DATA, and APNs acts on nothing before both: a request whose headers were
// not written cannot have been delivered. WroteHeaders marks the attempt
// written (even when the write failed: some bytes may have left). GotConn
// starts each attempt afresh: the transport retries a request on a new
// connection only when the server has said it did not process it
// (GOAWAY naming an earlier stream, REFUSED_STREAM, a connection not
// usable yet). One race is left: when the request's ctx ends, the
// transport returns at once while its writer may be putting the headers
// on the wire; so a request whose ctx ended after it got a connection is
// taken as written. An answer whose body apns2 cannot read still counts by
// its status: Apple decided.
//
// Provider tokens: with Config.Tokens (tokenstore, over Postgres) every
// replica sends the deployment's one token per key, renewed by one of
// them once it is 40 minutes old: Apple refuses a key's token renewed
// more often than every 20 minutes (TooManyProviderTokenUpdates), which
// replicas signing their own would be. An ExpiredProviderToken makes the
// next Send renew it (once per refused JWT, for the deployment); the
// refused message is RetryAfter. A BadDeviceToken also answers a sandbox
// token sent to production, and the reverse: Sandbox must match the app's
// build, which the dispatcher's refusal guard tells from one bad token.
//
// The collapse id is Message.Collapse(), so that a resend replaces a
// banner instead of adding one; APNs refuses one over 64 bytes, so a
// longer one is sent as its SHA-256 in hex (64 bytes), stable across
// resends.
package apns
