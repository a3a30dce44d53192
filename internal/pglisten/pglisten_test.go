package pglisten_test

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pglisten"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// minWait is the longest first wait after a failure (Backoff(1) from 100 ms).
const minWait = 100 * time.Millisecond

func TestTheFirstWaitAfterALostConnectionIsTheShortestAgain(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.EmptyDB(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	admin := pgtest.Connect(t, pgtest.AdminURL(t))
	ctx := context.Background()
	exec := func(q string) {
		t.Helper()
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("ALTER DATABASE " + name + " WITH ALLOW_CONNECTIONS false")

	clk := clock.NewFake(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	l := pglisten.New(dbURL, "wake_test", clk, slog.New(slog.NewTextHandler(tWriter{t}, nil)))
	wake := l.Subscribe()
	l.Start(ctx)
	t.Cleanup(func() {
		if err := l.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})

	// Refused connections: each wait is longer than the one before.
	var wait time.Duration
	for i := range 5 {
		wait = nextWait(t, clk)
		if i == 0 && wait > minWait {
			t.Errorf("first wait after a refused connection = %s, want at most %s", wait, minWait)
		}
		if i == 4 && wait <= minWait {
			t.Errorf("fifth wait in a row = %s; want the backoff to have grown past %s", wait, minWait)
		}
		clk.Advance(wait)
	}

	// Postgres takes connections again; the one made LISTENs. The attempt
	// after the last wait may have been refused before the change, and
	// waits longer still: time moves on to each wait until one connects.
	exec("ALTER DATABASE " + name + " WITH ALLOW_CONNECTIONS true")
	deadline := time.After(10 * time.Second)
	for woken := false; !woken; {
		select {
		case <-wake:
			woken = true
		case <-deadline:
			t.Fatal("no wake-up after the listener connected")
		case <-time.After(20 * time.Millisecond):
			if d, ok := clk.Next(); ok {
				clk.Advance(d)
			}
		}
	}

	// The connection drops: the backoff starts over.
	exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '" + name + "' AND query LIKE 'LISTEN%'")
	if wait := nextWait(t, clk); wait > minWait {
		t.Errorf("first wait after a connection that listened was lost = %s; want at most %s, the backoff reset", wait, minWait)
	}
}

// nextWait waits until the listener asks the clock for a timer and returns
// how long that timer waits.
func nextWait(t *testing.T, clk *clock.Fake) time.Duration {
	t.Helper()
	testsignal.Eventually(t, "the listener's next wait", 10*time.Second, func() bool { return clk.Pending() > 0 })
	d, _ := clk.Next()
	return d
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
