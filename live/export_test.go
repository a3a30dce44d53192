package live

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// SetTxSlack shortens how far c's reads look back from their lower bound,
// so that a test holds the horizon past it in seconds.
func SetTxSlack(c *Config, d time.Duration) { c.txSlack = d }

// ReadErrors is spoolcast_live_reads_total{result="error"}.
func ReadErrors(m *Metrics) prometheus.Counter { return m.reads.WithLabelValues("error") }
