package push_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

func TestTheDeliveryLogNamesEachDevicesProviderAndMasksEveryKindOfToken(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	apns := strings.Repeat("9f", 31) + "c01d"
	if _, err := pool.Exec(ctx, `INSERT INTO devices (token, user_id, platform, provider) VALUES ($1, 'alice', 'ios', 'apns')`, apns); err != nil {
		t.Fatal(err)
	}
	for _, token := range []any{apns, "ExponentPushToken[abcdefghijkl]", nil} {
		state := "sent"
		if token == nil {
			state = "skipped"
		}
		if _, err := pool.Exec(ctx, `INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, token, state)
			VALUES (1, now(), 'alice', $1, $2)`, token, state); err != nil {
			t.Fatal(err)
		}
	}
	page, err := push.Deliveries(ctx, pool, push.DeliveryQuery{})
	if err != nil || len(page.Data) != 3 {
		t.Fatalf("%+v, %v", page, err)
	}
	got := map[string]string{}
	for _, d := range page.Data {
		token, provider := "<none>", "<null>"
		if d.Token != nil {
			token = *d.Token
		}
		if d.Provider != nil {
			provider = *d.Provider
		}
		got[token] = provider
	}
	want := map[string]string{"9f9f…c01d": "apns", "ExponentPushToken[abcd…ijkl]": "expo", "<none>": "<null>"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("token → provider %v, want %v", got, want)
	}
}
