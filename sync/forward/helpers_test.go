package forward_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func mustEvent(t testing.TB, key string, recipients ...string) event.Event {
	t.Helper()
	to, _ := json.Marshal(recipients)
	body := fmt.Sprintf(`{"idempotency_key":%q,"type":"job.finished","category":"jobs","recipients":%s,"title":"Export ready","data":{"rows":12345}}`, key, to)
	ev, err := event.Decode([]byte(body), "")
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func count(t testing.TB, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
