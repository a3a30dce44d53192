package forward

import (
	"context"

	"github.com/spoolcast/spoolcast/spool"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// Cancellations (spool.Record.CancelOf) are forwarded in spool order: each
// is applied once every event spooled before it has landed or been set
// aside, so that the DELETE after its POST finds the event in Postgres, and
// one before it finds nothing, however the rows are batched. A worker
// applies its batch's rows in order, and the batches in flight are all
// below the one taken last, so take hands out a cancellation only in a
// batch taken alone, from the top.

func isCancel(rec spool.Record) bool {
	_, ok := rec.CancelOf()
	return ok
}

// cancel applies one spooled cancellation with ingest.Cancel, as of the
// time the relay received it, counts its outcome and acknowledges it.
// refused is Postgres refusing it for good (set aside like an event, on the
// same evidence); err is a failure to retry as it is. Like ingest, Cancel
// is idempotent: a cancellation sent twice is answered cancelled twice.
func (f *Forwarder) cancel(ctx context.Context, rec spool.Record, acks *batchAcks) (refused, err error) {
	producer, _ := rec.CancelOf()
	cctx, stop := context.WithTimeout(ctx, f.cfg.IngestTimeout)
	res, err := ingest.Cancel(cctx, f.cfg.DB, producer, rec.Key, rec.ReceivedAt)
	stop()
	if err != nil {
		if refusedForGood(err) {
			return err, nil
		}
		if markErr := f.cfg.Spool.MarkFailed(ctx, []int64{rec.Seq}); markErr != nil {
			f.log.Debug("count failed attempt", "err", markErr)
		}
		return nil, err
	}
	f.landed.Store(f.clock.Now().UnixNano())
	f.forgetRefusals([]int64{rec.Seq})
	f.checkHistory(ctx)
	if f.cfg.AfterIngest != nil {
		f.cfg.AfterIngest()
	}
	f.cfg.Metrics.cancels.WithLabelValues(res.Outcome.String()).Inc()
	switch res.Outcome {
	case ingest.CancelUnknown:
		f.unknownLog.Do(func(suppressed int64) {
			f.log.Warn("cancellation of an unknown event: Postgres has no event with this key for the producer (never sent, spooled after the cancellation, or its key expired); nothing was cancelled",
				"producer", producer, "key", rec.Key, "outcome", res.Outcome.String(), "suppressed", suppressed)
		})
	case ingest.CancelTooLate:
		f.tooLateLog.Do(func(suppressed int64) {
			f.log.Warn("cancellation too late: the event was sent already (it had no send_at, or its send_at passed first)",
				"producer", producer, "key", rec.Key, "outcome", res.Outcome.String(), "suppressed", suppressed)
		})
	}
	acks.Go(func() {
		if err := f.cfg.Spool.MarkForwarded(context.WithoutCancel(ctx), []int64{rec.Seq}); err != nil {
			f.log.Warn("acknowledge a forwarded cancellation; it will be sent again", "err", err)
		}
	})
	return nil, nil
}
