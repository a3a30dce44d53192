package spool_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/spool"
)

// BenchmarkDrain measures the forwarder's side of the spool: reading a batch
// of 500 pending rows and acknowledging them, per row, with and without the
// refeed window (the relay keeps payloads 10 minutes by default), and with
// the window's bytes capped at 1 MiB, so that every acknowledgement also
// drops as many old payloads as it keeps, as a relay past its first
// --refeed-max-bytes does. Each round of b.N rows is claimed first, outside
// the timer. cpu-ns/op is the process's CPU per row (the spool's background
// checkpointer included).
func BenchmarkDrain(b *testing.B) {
	for _, c := range []struct {
		refeed   time.Duration
		maxBytes int64
	}{{0, 0}, {10 * time.Minute, 0}, {10 * time.Minute, 1 << 20}} {
		name := fmt.Sprintf("refeed=%s", c.refeed)
		if c.maxBytes > 0 {
			name += fmt.Sprintf(",max=%dKiB", c.maxBytes>>10)
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			s, err := spool.Open(ctx, spool.Config{Path: filepath.Join(b.TempDir(), "spool.db"), RefeedWindow: c.refeed, RefeedMaxBytes: c.maxBytes, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(ctx)
			claimConcurrently(b, s, b.N, 64)
			cpu := processCPU()
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
			b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is the CPU this process has used, its own and the kernel's on
// its behalf: on a shared machine a steadier measure than wall time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
