package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/spoolcast/spoolcast/relay"
	"github.com/spoolcast/spoolcast/spool"
)

// BenchmarkIngestHandler measures the relay's handler with a real spool
// (synchronous=FULL), without the network: decode, validate, hash, claim and
// answer, from 64 concurrent callers.
func BenchmarkIngestHandler(b *testing.B) {
	sp, err := spool.Open(context.Background(), spool.Config{Path: filepath.Join(b.TempDir(), "spool.db"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer sp.Close(context.Background())
	srv, err := relay.New(relay.Config{Producer: "bench", Spool: sp, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := fmt.Sprintf(`{"idempotency_key":"bench:%d","type":"job.finished","category":"jobs","recipients":["u_1"],"title":"Nightly export finished","body":"Your export of 12,345 rows is ready.","data":{"job_id":"j_1","rows":12345}}`, n.Add(1))
			req := httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, req)
			if w.Code != http.StatusAccepted {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
