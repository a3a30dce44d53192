package spool_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/spool"
)

// BenchmarkDrain measures the forwarder's side of the spool: reading a batch
// of 500 pending rows and acknowledging them, per row, with and without the
// refeed window (the relay keeps payloads 10 minutes by default). Each round
// of b.N rows is claimed first, outside the timer.
func BenchmarkDrain(b *testing.B) {
	for _, refeed := range []time.Duration{0, 10 * time.Minute} {
		b.Run(fmt.Sprintf("refeed=%s", refeed), func(b *testing.B) {
			ctx := context.Background()
			s, err := spool.Open(ctx, spool.Config{Path: filepath.Join(b.TempDir(), "spool.db"), RefeedWindow: refeed, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(ctx)
			claimConcurrently(b, s, b.N, 64)
			b.ResetTimer()
			var after int64
			for done := 0; done < b.N; {
				batch, err := s.NextBatch(ctx, after, spool.BatchLimit{Rows: 500})
				if err != nil {
					b.Fatal(err)
				}
				if len(batch) == 0 {
					b.Fatalf("drained %d rows of %d", done, b.N)
				}
				seqs := make([]int64, len(batch))
				for i, rec := range batch {
					seqs[i] = rec.Seq
				}
				if err := s.MarkForwarded(ctx, seqs); err != nil {
					b.Fatal(err)
				}
				after, done = seqs[len(seqs)-1], done+len(batch)
			}
		})
	}
}
