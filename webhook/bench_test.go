package webhook_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/internal/eventtest"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/webhook"
)

// uuid4 is a random UUIDv4, the key producers send.
func uuid4() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// BenchmarkIngestWithWebhooks is what the outbox's triggers cost ingest:
// 500-event batches with random UUIDv4 keys, each for one of 1,000 users,
// without the triggers (as before migration 12), with them and no endpoint,
// and with one endpoint taking notification.created (a delivery row per
// notification, in the same transaction).
func BenchmarkIngestWithWebhooks(b *testing.B) {
	for _, c := range []struct {
		name  string
		setup func(*pgxpool.Pool)
	}{
		{"no-triggers", func(p *pgxpool.Pool) {
			mustExec(b, p, `DROP TRIGGER webhook_notifications ON notifications`)
			mustExec(b, p, `DROP TRIGGER webhook_dispatches_inserted ON push_dispatches`)
		}},
		{"no-endpoint", func(*pgxpool.Pool) {}},
		{"endpoint-created", func(p *pgxpool.Pool) {
			mustExec(b, p, `INSERT INTO webhook_endpoints (id, url, events, secret) VALUES ('ep_b', 'http://127.0.0.1:9/', '{notification.created}', $1)`, webhook.NewSecret())
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			pool := pgtest.Connect(b, pgtest.DB(b))
			c.setup(pool)
			const batch = 500
			items := make([]ingest.Item, batch)
			n := 0
			for b.Loop() {
				b.StopTimer()
				for i := range items {
					items[i] = ingest.Item{Producer: "bench", Event: eventtest.Event(b, uuid4(), fmt.Sprintf("u%d", n%1000))}
					n++
				}
				b.StartTimer()
				if _, err := ingest.Ingest(context.Background(), pool, items); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "notifications/s")
		})
	}
}

func mustExec(b *testing.B, pool *pgxpool.Pool, sql string, args ...any) {
	b.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkDeliver is the deliverer's throughput from the outbox to
// receivers on loopback that answer 204 at once: b.N deliveries of a 1 KiB
// body, spread over 1 or 8 endpoints, each its own receiver, with the
// defaults (32 attempts in flight, 16 per endpoint). Each delivery is a lease, a signed POST and a
// transaction recording it.
func BenchmarkDeliver(b *testing.B) {
	for _, endpoints := range []int{1, 8} {
		b.Run(fmt.Sprintf("endpoints=%d", endpoints), func(b *testing.B) {
			pool := pgtest.Connect(b, pgtest.DB(b))
			for i := range endpoints {
				// A receiver each, as endpoints are: the client keeps
				// connections alive per host.
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
				defer srv.Close()
				mustExec(b, pool, `INSERT INTO webhook_endpoints (id, url, events, secret) VALUES ($1, $2, '{notification.created}', $3)`,
					fmt.Sprintf("ep_%d", i), srv.URL, webhook.NewSecret())
			}
			mustExec(b, pool, `INSERT INTO webhook_deliveries (endpoint_id, type, payload)
				SELECT 'ep_' || (g % $2), 'notification.created', jsonb_build_object('type', 'notification.created', 'data', jsonb_build_object('body', repeat('x', 1000), 'n', g))
				FROM generate_series(1, $1) g`, b.N, endpoints)
			d, err := webhook.NewDeliverer(webhook.DelivererConfig{DB: pool, AllowPrivate: true, Interval: 10 * time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			d.Start(context.Background())
			for {
				var left int
				if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'`).Scan(&left); err != nil {
					b.Fatal(err)
				}
				if left == 0 {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			b.StopTimer()
			if err := d.Stop(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deliveries/s")
		})
	}
}

// BenchmarkPassBehindAFullEndpoint is one deliverer pass while an endpoint
// whose receiver holds its answers is at its cap with a backlog of due
// deliveries, and another endpoint, enabled, has nothing due: what every
// pass costs Postgres while one receiver is down and the others are idle.
func BenchmarkPassBehindAFullEndpoint(b *testing.B) {
	for _, backlog := range []int{10_000, 250_000} {
		b.Run(fmt.Sprintf("backlog=%d", backlog), func(b *testing.B) {
			pool := pgtest.Connect(b, pgtest.DB(b))
			full, idle := newReceiver(b), newReceiver(b)
			release := full.hold(b)
			mustExec(b, pool, `INSERT INTO webhook_endpoints (id, url, events, secret) VALUES ('ep_full', $1, '{notification.created}', $2), ('ep_idle', $3, '{notification.created}', $4)`,
				full.URL, webhook.NewSecret(), idle.URL, webhook.NewSecret())
			mustExec(b, pool, `INSERT INTO webhook_deliveries (endpoint_id, type, payload, created_at, next_attempt_at)
				SELECT 'ep_full', 'notification.created', '{"type": "notification.created", "data": {}}', now() - interval '1 hour', now() - interval '1 hour' + g * interval '1 ms'
				FROM generate_series(1, $1) g`, backlog)
			mustExec(b, pool, `VACUUM ANALYZE webhook_deliveries`)
			d, err := webhook.NewDeliverer(webhook.DelivererConfig{DB: pool, AllowPrivate: true, Timeout: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if _, err := d.Pass(ctx); err != nil { // the full endpoint's share, held
				b.Fatal(err)
			}
			for full.requested() < webhook.DefaultPerEndpoint {
				time.Sleep(time.Millisecond)
			}
			b.ResetTimer()
			for b.Loop() {
				if _, err := d.Pass(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if n := full.requested(); n != webhook.DefaultPerEndpoint {
				b.Fatalf("the full endpoint got %d requests, want its cap of %d", n, webhook.DefaultPerEndpoint)
			}
			release()
			d.Wait()
		})
	}
}

// BenchmarkMaintainBehindABacklog is one maintenance step (retention, the
// disabled endpoints' sweep, the gauges) while an enabled endpoint has a
// backlog of pending deliveries and no endpoint is disabled.
func BenchmarkMaintainBehindABacklog(b *testing.B) {
	pool := pgtest.Connect(b, pgtest.DB(b))
	mustExec(b, pool, `INSERT INTO webhook_endpoints (id, url, events, secret) VALUES ('ep_down', 'http://127.0.0.1:9/', '{notification.created}', $1)`, webhook.NewSecret())
	mustExec(b, pool, `INSERT INTO webhook_deliveries (endpoint_id, type, payload, next_attempt_at)
		SELECT 'ep_down', 'notification.created', '{"type": "notification.created", "data": {}}', now() + g * interval '1 ms'
		FROM generate_series(1, 250000) g`)
	mustExec(b, pool, `VACUUM ANALYZE webhook_deliveries`)
	d, err := webhook.NewDeliverer(webhook.DelivererConfig{DB: pool, AllowPrivate: true})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := d.Maintain(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
