package spool_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/spoolcast/spoolcast/spool"
)

// uuidKey is a random UUIDv4, the key most producers send.
func uuidKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// claimConcurrently makes n claims of random keys with a ~300-byte payload from callers goroutines.
func claimConcurrently(tb testing.TB, s *spool.Spool, n, callers int) {
	payload := make([]byte, 300)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if _, err := s.Claim(context.Background(), spool.Entry{Producer: "bench", Key: uuidKey(), Hash: payload[:32], Payload: payload}); err != nil {
					tb.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkClaim measures durable claims per second (synchronous=FULL) of
// random keys with group commit against one transaction per claim, at 1, 16
// and 64 concurrent callers, on an empty spool.
func BenchmarkClaim(b *testing.B) {
	for _, mode := range []struct {
		name     string
		maxBatch int
	}{{"group-commit", 0}, {"commit-per-claim", 1}} {
		for _, callers := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/callers=%d", mode.name, callers), func(b *testing.B) {
				s, err := spool.Open(context.Background(), spool.Config{
					Path:           filepath.Join(b.TempDir(), "spool.db"),
					MaxCommitBatch: mode.maxBatch,
					Logger:         slog.New(slog.DiscardHandler),
				})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close(context.Background())
				b.ResetTimer()
				claimConcurrently(b, s, b.N, callers)
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "claims/s")
			})
		}
	}
}

var (
	keptOnce sync.Once
	keptPath string
)

// keptTemplate is a spool file keeping 300,000 forwarded random keys: a
// relay a day into its key TTL.
func keptTemplate(b *testing.B) string {
	keptOnce.Do(func() {
		dir, err := os.MkdirTemp("", "spool-bench-")
		if err != nil {
			b.Fatal(err)
		}
		keptPath = filepath.Join(dir, "kept.db")
		s, err := spool.Open(context.Background(), spool.Config{Path: keptPath, Sync: spool.SyncNormal, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		claimConcurrently(b, s, 300_000, 64)
		for {
			batch, err := s.NextBatch(context.Background(), 0, spool.BatchLimit{Rows: 5000})
			if err != nil || len(batch) == 0 {
				break
			}
			seqs := make([]int64, len(batch))
			for i, rec := range batch {
				seqs[i] = rec.Seq
			}
			if err := s.MarkForwarded(context.Background(), seqs); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Close(context.Background()); err != nil {
			b.Fatal(err)
		}
	})
	return keptPath
}

// BenchmarkClaimOverKeptKeys is BenchmarkClaim's group commit with 64
// callers on a spool that already keeps 300,000 forwarded random keys.
func BenchmarkClaimOverKeptKeys(b *testing.B) {
	template := keptTemplate(b)
	raw, err := os.ReadFile(template)
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "spool.db")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		b.Fatal(err)
	}
	s, err := spool.Open(context.Background(), spool.Config{Path: path, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(context.Background())
	b.ResetTimer()
	claimConcurrently(b, s, b.N, 64)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "claims/s")
}

// BenchmarkKeptKeyFootprint reports the disk a forwarded key takes while it
// is kept for the key TTL: live pages (file pages less free ones) per kept
// key of a spool keeping 300,000 random keys, 36-character keys as UUIDs are.
func BenchmarkKeptKeyFootprint(b *testing.B) {
	template := keptTemplate(b)
	db, err := sql.Open("sqlite", "file:"+template+"?mode=ro")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	var pages, free, size, kept int64
	if err := db.QueryRow(`SELECT (SELECT page_count FROM pragma_page_count), (SELECT freelist_count FROM pragma_freelist_count),
		(SELECT page_size FROM pragma_page_size), (SELECT kept_rows FROM totals)`).Scan(&pages, &free, &size, &kept); err != nil {
		b.Fatal(err)
	}
	for range b.N {
	}
	b.ReportMetric(float64((pages-free)*size)/float64(kept), "bytes/kept-key")
}
