package pglisten_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/pglisten"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
)

// A primary fenced read-only in a switchover keeps the LISTEN connection
// open, but the hints now come from the promoted standby: the listener finds
// its server read-only and listens on the new primary.
func TestTheListenerMovesToThePromotedStandbyWhenItsServerTurnsReadOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a primary and a standby")
	}
	t.Parallel()
	ctx := context.Background()
	r := pgtest.Primary(t, false)
	l := pglisten.New(r.URL, "hints", nil, slog.New(slog.DiscardHandler))
	pglisten.SetCheckEvery(l, 100*time.Millisecond)
	woken := l.Subscribe()
	l.Start(ctx)
	defer l.Stop(ctx)
	<-woken // listening

	fence := pgtest.Connect(t, r.Primary.URL)
	for _, q := range []string{`ALTER SYSTEM SET default_transaction_read_only = on`, `SELECT pg_reload_conf()`} {
		if _, err := fence.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := pgtest.Connect(t, r.Standby.URL)
	drain := func() {
		for {
			select {
			case <-woken:
			default:
				return
			}
		}
	}
	drain()
	testsignal.Eventually(t, "a hint sent on the promoted standby to wake the listener", 20*time.Second, func() bool {
		if _, err := promoted.Exec(ctx, `SELECT pg_notify('hints', '')`); err != nil {
			t.Fatal(err)
		}
		select {
		case <-woken:
			return true
		case <-time.After(50 * time.Millisecond):
			return false
		}
	})
}
