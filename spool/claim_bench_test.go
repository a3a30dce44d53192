package spool_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/spoolcast/spoolcast/spool"
)

// BenchmarkClaim measures durable claims per second (synchronous=FULL) with
// group commit against one transaction per claim, at 1, 16 and 64 concurrent
// callers. Each claim carries a ~300-byte payload under a random-looking key.
func BenchmarkClaim(b *testing.B) {
	payload := make([]byte, 300)
	for _, mode := range []struct {
		name     string
		maxBatch int
	}{{"group-commit", 0}, {"commit-per-claim", 1}} {
		for _, callers := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/callers=%d", mode.name, callers), func(b *testing.B) {
				s, err := spool.Open(context.Background(), spool.Config{
					Path:           filepath.Join(b.TempDir(), "spool.db"),
					Sync:           spool.SyncFull,
					MaxCommitBatch: mode.maxBatch,
				})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close(context.Background())
				var next atomic.Int64
				b.ResetTimer()
				var wg sync.WaitGroup
				for range callers {
					wg.Go(func() {
						for {
							i := next.Add(1)
							if i > int64(b.N) {
								return
							}
							key := fmt.Sprintf("%016x", uint64(i)*0x9E3779B97F4A7C15)
							if _, err := s.Claim(context.Background(), spool.Entry{Producer: "bench", Key: key, Hash: payload[:32], Payload: payload}); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "claims/s")
			})
		}
	}
}
