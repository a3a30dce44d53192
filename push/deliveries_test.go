package push_test

import (
	"context"
	"errors"
	"testing"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/push"
)

func TestADeliveryCursorIsCheckedBeforeAnyRead(t *testing.T) {
	t.Parallel()
	if err := (push.DeliveryQuery{}).Validate(); err != nil {
		t.Errorf("no cursor: %v", err)
	}
	if err := (push.DeliveryQuery{Cursor: "nope"}).Validate(); !errors.Is(err, push.ErrBadCursor) {
		t.Errorf("a cursor this server did not make: %v, want ErrBadCursor", err)
	}
	pool := pgtest.Pool(t)
	ctx := context.Background()
	for range 2 {
		if _, err := pool.Exec(ctx, `INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, token, state)
			VALUES (1, now(), 'alice', 'ExponentPushToken[abcdefghijkl]', 'sent')`); err != nil {
			t.Fatal(err)
		}
	}
	// Deliveries reads through a transaction as well as a pool (a read replica's).
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	page, err := push.Deliveries(ctx, tx, push.DeliveryQuery{Limit: 1})
	if err != nil || len(page.Data) != 1 || page.NextCursor == nil {
		t.Fatalf("first page: %+v, %v", page, err)
	}
	if err := (push.DeliveryQuery{Cursor: *page.NextCursor}).Validate(); err != nil {
		t.Errorf("a cursor the log made: %v", err)
	}
}
