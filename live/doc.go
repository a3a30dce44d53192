// Package live is the live stream: GET /v1/stream, a WebSocket per app
// session that carries each new notification of its user within moments of
// its commit, on whichever replica holds the socket.
//
// Each replica reads newly committed notifications in commit-safe order and
// writes them to the sockets of their users that it holds. Rows carry the id
// of the transaction that wrote them (tx, xid8); the reader takes rows in
// (tx, id) order, only below the oldest transaction still running
// (pg_snapshot_xmin of the statement's snapshot). Every transaction below
// that horizon has ended, so a row that commits late is read when it
// commits, never skipped, and the reader's position only moves forward, so
// nothing is read twice. The ingest wake-up (NOTIFY) only makes the read
// happen at once; a fallback interval covers a lost hint.
//
// A socket's cursor is the (tx, id) of the last notification it was sent. A
// client that reconnects with it is sent every notification of its user
// after it, oldest first, then a ready frame, then live frames: the socket is
// registered before the resume read, live frames that arrive meanwhile are
// held, and only those after the resume's end are sent.
package live
