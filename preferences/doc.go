// Package preferences owns what each user chose for their pushes: the
// categories turned off and the quiet hours, kept in Postgres (Builtin,
// GET|PUT /v1/preferences) or asked of the product's own API (External,
// --prefs-url) through a bounded cache. The dispatcher asks a Source which
// categories are off; a source that cannot answer leaves the user out, so
// that everyone is pushed (fail open, DESIGN.md 4).
//
// It imports push/policy for the quiet hours' shape and never imports push
// or any channel: the dispatcher depends on it, not the reverse.
package preferences
