// Package webpush sends push messages to browsers' push subscriptions: the
// delivery of RFC 8030, with the payload encrypted as RFC 8291 says
// (aes128gcm, RFC 8188) and the sender identified by VAPID (RFC 8292).
//
// The rule it keeps: one Send is one POST, never retried or redirected here,
// and its Result says what the push service made of it, including when that
// is unknown (an answer that never came: the message may have been
// delivered), so that the caller, which knows what a duplicate costs,
// decides about a retry.
//
// The protocol is written here, on the standard library (crypto/ecdh,
// crypto/hkdf, crypto/aes) and github.com/golang-jwt/jwt/v5, rather than taken
// from github.com/SherClockHolmes/webpush-go (v1.4.0): that library signs a
// new VAPID JWT for every message and has no way to reuse one, ignores its
// VapidExpiration option (exp is always 12 hours), turns a "mailto:" subject
// into "mailto:mailto:…", pads every message to 4 KiB, and offers its
// encryption only inside its send. What remains is about a hundred lines,
// checked against RFC 8291's example and, in the tests, against an
// independent push service (the npm package web-push-testing) that decrypts
// the messages and verifies their VAPID tokens.
package webpush
