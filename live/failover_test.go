package live_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/wsclient"
	"github.com/spoolcast/spoolcast/live"
)

// closedTryAgain reads c until it is closed, which must be with 1013.
func closedTryAgain(t *testing.T, c *wsclient.Conn) {
	t.Helper()
	for {
		if _, err := c.Next(30 * time.Second); err != nil {
			if code, ok := wsclient.Closed(err); !ok || code != live.StatusTryAgainLater {
				t.Fatalf("after the failover: %v; want the socket closed 1013", err)
			}
			return
		}
	}
}

// replayed waits until the standby has replayed everything the cursor's
// read could see.
func replayed(t *testing.T, r *pgtest.Replicated, cursor string) {
	t.Helper()
	c, err := live.ParseCursor(cursor)
	if err != nil || c.WAL == 0 {
		t.Fatalf("cursor %q: %+v %v; want a WAL position", cursor, c, err)
	}
	standby := pgtest.Connect(t, r.Standby.URL)
	testsignal.Eventually(t, "the standby to replay what the cursor saw", 10*time.Second, func() bool {
		var ok bool
		err := standby.QueryRow(context.Background(), `SELECT (pg_last_wal_replay_lsn() - '0/0'::pg_lsn)::bigint >= $1`, int64(c.WAL)).Scan(&ok)
		return err == nil && ok
	})
}

// With synchronous replication a failover loses nothing a socket saw: the
// promoted primary records where its timeline began, and every cursor from
// before (a notification's, a ready frame's), made up to the moment of the
// crash, resumes on it with exactly what committed after it, nothing twice.
func TestSocketsResumeWithTheirCursorsAfterAFailoverToASynchronousStandby(t *testing.T) {
	t.Parallel()
	r := pgtest.Primary(t, true)
	r.Migrate(t)
	s := newStackOn(t, r.URL, nil)
	seen := s.dial("u1", "")
	s.ready(seen)
	s.ingest(s.pool, items(t, "before", "u1", 3))
	last := next(t, seen, "notification", 3)[2].Cursor
	idle := s.dial("u1", "")
	_, head := s.ready(idle)
	fresh := s.dial("u2", "") // a user with no notification yet
	_, empty := s.ready(fresh)

	r.FailOver(t)
	closedTryAgain(t, seen)
	closedTryAgain(t, idle)
	closedTryAgain(t, fresh)
	testsignal.Eventually(t, "the pool to reach the promoted primary", 30*time.Second, func() bool {
		_, err := s.pool.Exec(context.Background(), `SELECT 1`)
		return err == nil
	})
	s.ingest(s.pool, items(t, "after", "u1", 2))
	s.ingest(s.pool, items(t, "later", "u2", 1))

	for _, tc := range []struct{ name, user, cursor, want string }{
		{"a notification's cursor", "u1", last, "after-0,after-1"},
		{"a ready cursor", "u1", head, "after-0,after-1"},
		{"the ready cursor of a user without notifications", "u2", empty, "later-0"},
	} {
		name := tc.name
		c, err := wsclient.Dial(context.Background(), s.base, tc.user, tc.cursor)
		if err != nil {
			t.Fatalf("%s from before the failover: %v; want it to resume", name, err)
		}
		defer c.Close()
		resumed, _ := s.ready(c)
		if got := strings.Join(titles(t, resumed), ","); got != tc.want {
			t.Errorf("%s resumed with %s; want %s", name, got, tc.want)
		}
	}
}

// With asynchronous replication the standby may lack what a socket saw: a
// cursor whose read saw WAL the promoted primary never received is refused
// (the app starts over), one whose read it did receive resumes.
func TestAfterAFailoverThatLostCommitsOnlyCursorsFromWhatSurvivedResume(t *testing.T) {
	t.Parallel()
	r := pgtest.Primary(t, false)
	r.Migrate(t)
	s := newStackOn(t, r.URL, nil)
	c := s.dial("u1", "")
	s.ready(c)
	s.ingest(s.pool, items(t, "kept", "u1", 1))
	kept := next(t, c, "notification", 1)[0].Cursor
	replayed(t, r, kept)
	thaw, err := r.Primary.FreezeWALSenders()
	if err != nil {
		t.Fatal(err)
	}
	defer thaw()
	s.ingest(s.pool, items(t, "lost", "u1", 1))
	lost := next(t, c, "notification", 1)[0].Cursor

	r.FailOver(t)
	closedTryAgain(t, c)
	if _, err := wsclient.Dial(context.Background(), s.base, "u1", lost); err == nil || !strings.Contains(err.Error(), "HTTP 400") {
		t.Errorf("the cursor of a notification the failover lost: %v; want HTTP 400 (start over)", err)
	}
	again, err := wsclient.Dial(context.Background(), s.base, "u1", kept)
	if err != nil {
		t.Fatalf("the cursor of what survived: %v; want it to resume", err)
	}
	defer again.Close()
	if resumed, _ := s.ready(again); len(resumed) != 0 {
		t.Errorf("resumed with %d frames; want none (the lost notification is not on the new primary)", len(resumed))
	}
}
