package live

import "time"

// SetTxSlack shortens how far c's reads look back from their lower bound,
// so that a test holds the horizon past it in seconds.
func SetTxSlack(c *Config, d time.Duration) { c.txSlack = d }
