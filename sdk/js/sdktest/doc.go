// Package sdktest runs the JavaScript SDK's tests (sdk/js) from `go test`,
// against real central replicas on a real Postgres, so that `make test` and
// CI cover them. The rule it keeps: the SDK is tested against the server it
// talks to, never a mock of it; a test run that cannot find Node skips,
// unless SPOOLCAST_REQUIRE_NODE=1 makes that a failure.
//
// The Go test starts two replicas behind a TCP proxy that always sends a
// new connection to a live one (the app's one address), a third replica
// with a low --rate-limit-user, and a control server the Node tests call to
// mint tokens, post events, stop, kill and start replicas, and make the
// proxy drop connections or refuse WebSocket upgrades. The React hooks'
// tests render them in a DOM (happy-dom) against another such rig; the
// packed tarballs are installed into an empty project, where the hooks,
// the client and every ts and tsx block of docs/apps.md must type-check.
package sdktest
