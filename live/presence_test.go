package live_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/live"
)

func TestAStreamRecordsItsUsersPresenceAndHowFarTheyHaveSeen(t *testing.T) {
	t.Parallel()
	url := pgtest.DB(t)
	// A replica killed an hour ago left its rows behind.
	if _, err := pgtest.Connect(t, url).Exec(context.Background(), `INSERT INTO stream_presence (user_id, replica, expires_at)
		VALUES ('u9', 'replica-dead', now() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	s := newStackOn(t, url, func(c *live.Config) { c.Presence, c.Replica = true, "replica-a" })
	present := func(user string) int {
		return pgtest.Count(t, s.pool, `SELECT count(*) FROM stream_presence WHERE user_id = $1 AND replica = 'replica-a' AND expires_at > now()`, user)
	}
	phone := s.dial("u1", "")
	s.ready(phone)
	laptop := s.dial("u1", "")
	s.ready(laptop)
	testsignal.Eventually(t, "u1's presence to be recorded", 10*time.Second, func() bool { return present("u1") == 1 })
	if n := pgtest.Count(t, s.pool, `SELECT count(*) FROM stream_presence WHERE replica = 'replica-dead'`); n != 0 {
		t.Errorf("%d expired presence rows of a dead replica kept", n)
	}
	s.ingest(s.pool, items(t, "seen", "u1", 3))
	frames := next(t, phone, "notification", 3)
	next(t, laptop, "notification", 3)
	// The app has shown the second frame.
	if err := phone.SendText(fmt.Appendf(nil, `{"type":"seen","cursor":%q}`, frames[1].Cursor)); err != nil {
		t.Fatal(err)
	}
	// Messages it does not know, or with a cursor it did not issue, change nothing.
	_ = phone.SendText([]byte(`{"type":"seen","cursor":"not-a-cursor"}`))
	_ = phone.SendText([]byte(`{"type":"hello"}`))
	_ = phone.SendText([]byte(`not json`))
	seenThrough := func() string {
		var title string
		err := s.pool.QueryRow(context.Background(), `SELECT n.title FROM notifications n JOIN stream_seen s USING (user_id)
			WHERE (n.tx, n.id) <= (s.through_tx, s.through_id) ORDER BY n.tx DESC, n.id DESC LIMIT 1`).Scan(&title)
		if err != nil {
			return ""
		}
		return title
	}
	testsignal.Eventually(t, "the seen position to be recorded", 10*time.Second, func() bool { return seenThrough() == "seen-1" })
	// An older cursor never moves it back.
	_ = laptop.SendText(fmt.Appendf(nil, `{"type":"seen","cursor":%q}`, frames[0].Cursor))
	time.Sleep(1500 * time.Millisecond) // past one write
	if got := seenThrough(); got != "seen-1" {
		t.Errorf("seen through %q after an older cursor; want still seen-1", got)
	}
	// The user stays present while one socket is open, and leaves with the last.
	phone.Close()
	time.Sleep(1500 * time.Millisecond)
	if present("u1") != 1 {
		t.Error("u1 left with a socket still open")
	}
	laptop.Close()
	testsignal.Eventually(t, "u1's presence to be removed", 10*time.Second, func() bool { return present("u1") == 0 })
}

// An app asks whether its socket still reaches the server with a text
// {"type":"ping"} (browsers hide the WebSocket's own pings from it) and is
// answered {"type":"pong"}, in order with the frames around it, whether the
// hub records presence or not.
func TestAnAppsPingIsAnsweredWithAPong(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	app := s.dial("u1", "")
	s.ready(app)
	if err := app.SendText([]byte(`{"type":"ping"}`)); err != nil {
		t.Fatal(err)
	}
	next(t, app, "pong", 1)
	s.ingest(s.pool, items(t, "after-pong", "u1", 1))
	next(t, app, "notification", 1)
	_ = app.SendText([]byte(`{"type":"ping","extra":1}`))
	next(t, app, "pong", 1)
}
