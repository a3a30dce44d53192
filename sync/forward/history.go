package forward

import (
	"context"
	"time"

	"github.com/spoolcast/spoolcast/internal/pghistory"
)

// checkHistory reads Postgres's history after a commit, at most every
// HistoryInterval, and on the first commit after a failure (a failover
// always shows as failures first: connections lost, or a read-only answer).
// Another history than the one the spool recorded means
// Postgres failed over to a standby (or was restored): with asynchronous
// replication the last commits the relay saw may be lost with the old
// primary, so every event forwarded within the spool's refeed window is put
// back in the queue and forwarded again; Postgres's claim drops what
// survived. The spool records the history, so a relay restarted after a
// failover still finds it changed.
func (f *Forwarder) checkHistory(ctx context.Context) {
	now := f.clock.Now().UnixNano()
	last := f.historyAt.Load()
	if last != 0 && now-last < int64(f.cfg.HistoryInterval) || !f.historyAt.CompareAndSwap(last, now) {
		return
	}
	h, err := pghistory.Read(ctx, f.cfg.DB)
	if err != nil {
		f.log.Debug("read Postgres's history", "err", err)
		f.historyAt.Store(0) // try again after the next commit
		return
	}
	was, err := f.cfg.Spool.History(ctx)
	if err != nil || was == h.String() {
		return
	}
	if was != "" {
		n, err := f.cfg.Spool.Refeed(ctx, time.Time{})
		if err != nil {
			f.log.Warn("Postgres's history changed, and putting back what was forwarded within the refeed window failed; it is tried again", "err", err)
			f.historyAt.Store(0)
			return
		}
		// The refed rows lie below the shared cursor; behind a backlog they
		// would wait for no batch to be in flight. Sending one that is also
		// in flight again is harmless.
		f.rewind.Store(true)
		f.cfg.Metrics.refeeds.Inc()
		f.cfg.Metrics.refed.Add(float64(n))
		f.log.Warn("Postgres's history changed (a failover to a standby, or a restore): forwarding again the events forwarded within the refeed window; what Postgres has is dropped as duplicates",
			"history_was", was, "history", h.String(), "events", n)
	}
	if err := f.cfg.Spool.SetHistory(ctx, h.String()); err != nil {
		f.log.Warn("record Postgres's history in the spool", "err", err)
	}
}
