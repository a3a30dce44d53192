package ingest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/spoolcast/spoolcast/internal/eventtest"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// BenchmarkIngest measures Ingest of 500-event batches (one recipient each)
// against the test Postgres.
func BenchmarkIngest(b *testing.B) {
	pool := pgtest.Pool(b)
	const batch = 500
	items := make([]ingest.Item, batch)
	n := 0
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		for i := range items {
			items[i] = ingest.Item{Producer: "bench", Event: eventtest.Event(b, fmt.Sprintf("k%d", n), fmt.Sprintf("u%d", n%1000))}
			n++
		}
		b.StartTimer()
		if _, err := ingest.Ingest(context.Background(), pool, items); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "notifications/s")
}
