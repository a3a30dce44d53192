package pglisten

import "time"

// SetCheckEvery shortens how long l waits for a notification before it
// checks that its server still takes writes.
func SetCheckEvery(l *Listener, d time.Duration) { l.checkEvery = d }
