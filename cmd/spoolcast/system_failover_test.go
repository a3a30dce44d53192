package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/expofake"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/internal/wsclient"
)

// streamApp is an app on the live stream: it reconnects with its last
// cursor whenever its socket closes, and counts every notification it saw.
type streamApp struct {
	user, token, base string

	mu       sync.Mutex
	cursor   string
	seen     map[string]int // notification id → frames
	resumes  int            // connections made with a cursor
	refusals int            // handshakes that refused the cursor
}

func (a *streamApp) run(ctx context.Context) {
	for ctx.Err() == nil {
		a.mu.Lock()
		cursor := a.cursor
		a.mu.Unlock()
		c, err := wsclient.Dial(ctx, a.base, a.token, cursor)
		if err != nil {
			if strings.Contains(err.Error(), "HTTP 400") {
				a.mu.Lock()
				a.refusals++
				a.cursor = "" // an app would reload its feed here
				a.mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if cursor != "" {
			a.mu.Lock()
			a.resumes++
			a.mu.Unlock()
		}
		a.read(ctx, c)
		c.Close()
	}
}

// read takes frames until the socket closes or ctx ends.
func (a *streamApp) read(ctx context.Context, c *wsclient.Conn) {
	for ctx.Err() == nil {
		m, err := c.Next(time.Second)
		if err != nil {
			if _, closed := wsclient.Closed(err); closed || !isTimeout(err) {
				return
			}
			continue
		}
		if m.Cursor == "" {
			continue
		}
		a.mu.Lock()
		if m.Type == "notification" {
			it, err := m.Item()
			if err == nil {
				a.seen[it.ID]++
			}
		}
		a.cursor = m.Cursor
		a.mu.Unlock()
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// uuid4 is a random UUIDv4, the key producers send.
func uuid4() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// The whole pipeline under a failover with synchronous replication: two
// relays under load, central with open sockets and pushes in flight, the
// primary killed and its standby promoted. Every event answered 202 ends up
// on the new primary exactly once per recipient; every app's socket resumes
// with its cursor and sees each notification of its user exactly once; each
// device gets each push once, and every dispatch ends delivered.
func TestThePipelineLosesAndRepeatsNothingAcrossAFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a primary, a standby, central and two relays as subprocesses")
	}
	t.Parallel()
	r := pgtest.Primary(t, true)
	r.Migrate(t)
	expo := expofake.New()
	expo.SetAnswerDelay(50 * time.Millisecond) // sends in flight at the kill
	expoServer := httptest.NewServer(expo)
	t.Cleanup(expoServer.Close)
	base, iss := startCentralProcess(t, r.URL, "--push=true", "--expo-url", expoServer.URL,
		"--receipt-interval", "500ms", "--db-connect-timeout", "1s")
	var relays []string
	for i := range 2 {
		addr := proctest.FreeAddr(t)
		p := proctest.Start(t, nil, "relay", "--producer", fmt.Sprintf("p%d", i), "--listen", addr,
			"--spool", filepath.Join(t.TempDir(), "spool.db"), "--database-url", r.URL, "--log-level", "warn")
		p.WaitHealthy("http://" + addr)
		relays = append(relays, "http://"+addr)
	}

	const users = 8
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var apps []*streamApp
	var wg sync.WaitGroup
	for i := range users {
		user := fmt.Sprintf("user-%d", i)
		a := &streamApp{user: user, token: iss.Token(user), base: base, seen: map[string]int{}}
		req, _ := http.NewRequest(http.MethodPut, base+"/v1/devices", strings.NewReader(fmt.Sprintf(`{"token":"ExponentPushToken[%s]","platform":"ios"}`, user)))
		req.Header.Set("Authorization", "Bearer "+a.token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode >= 300 {
			t.Fatalf("register %s's device: %v %v", user, resp, err)
		}
		resp.Body.Close()
		apps = append(apps, a)
		wg.Go(func() { a.run(ctx) })
	}
	defer wg.Wait()
	defer cancel()

	var mu sync.Mutex
	accepted := map[string][]string{} // key → recipients, of every event answered 202
	post := func(worker, n int) bool {
		key := uuid4()
		recipients := []string{fmt.Sprintf("user-%d", (worker+n)%users)}
		if n%3 == 0 {
			recipients = append(recipients, fmt.Sprintf("user-%d", (worker+n+1)%users))
		}
		body, _ := json.Marshal(map[string]any{"idempotency_key": key, "type": "t", "recipients": recipients, "title": key})
		resp, err := http.Post(relays[n%2]+"/v1/events", "application/json", strings.NewReader(string(body)))
		if err != nil {
			return true
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusAccepted {
			mu.Lock()
			accepted[key] = recipients
			mu.Unlock()
		}
		time.Sleep(5 * time.Millisecond)
		return true
	}
	stop := proctest.Load(4, post)
	time.Sleep(2 * time.Second)
	if err := r.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.Standby.Promote(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	stop()

	db := pgtest.Connect(t, r.URL)
	want := 0
	for _, rs := range accepted {
		want += len(rs)
	}
	testsignal.Eventually(t, fmt.Sprintf("the %d accepted notifications to be on the new primary", want), 60*time.Second, func() bool {
		return pgtest.Count(t, db, `SELECT count(*) FROM notifications`) >= want
	})
	rows, err := db.Query(context.Background(), `SELECT idempotency_key, user_id, count(*) FROM notifications GROUP BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]int{}
	for rows.Next() {
		var key, user string
		var n int
		if err := rows.Scan(&key, &user, &n); err != nil {
			t.Fatal(err)
		}
		stored[key+"/"+user] = n
	}
	rows.Close()
	for key, rs := range accepted {
		for _, u := range rs {
			if n := stored[key+"/"+u]; n != 1 {
				t.Errorf("event %s for %s is stored %d times; want once", key, u, n)
			}
		}
	}
	if len(stored) != want {
		t.Errorf("%d notifications stored; want the %d accepted", len(stored), want)
	}

	// Every app sees each notification of its user exactly once.
	perUser := map[string]int{}
	for _, rs := range accepted {
		for _, u := range rs {
			perUser[u]++
		}
	}
	testsignal.Eventually(t, "every app to see its user's notifications", 60*time.Second, func() bool {
		for _, a := range apps {
			a.mu.Lock()
			n := len(a.seen)
			a.mu.Unlock()
			if n < perUser[a.user] {
				return false
			}
		}
		return true
	})
	cancel()
	wg.Wait()
	for _, a := range apps {
		twice := 0
		for _, n := range a.seen {
			if n > 1 {
				twice++
			}
		}
		if len(a.seen) != perUser[a.user] || twice > 0 || a.refusals > 0 || a.resumes == 0 {
			t.Errorf("%s's app saw %d notifications (%d more than once) of %d, resumed %d times, refused %d; want each once, resumed, never refused",
				a.user, len(a.seen), twice, perUser[a.user], a.resumes, a.refusals)
		}
	}

	// Each device got each push once, and every dispatch ended delivered.
	testsignal.Eventually(t, "every dispatch to end", 60*time.Second, func() bool {
		return pgtest.Count(t, db, `SELECT count(*) FROM push_dispatches WHERE state IN ('queued', 'sent')`) == 0 &&
			pgtest.Count(t, db, `SELECT count(*) FROM push_dispatches`) >= want
	})
	states := map[string]int{}
	rows, err = db.Query(context.Background(), `SELECT state || coalesce(': ' || error, ''), count(*) FROM push_dispatches GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			t.Fatal(err)
		}
		states[state] = n
	}
	rows.Close()
	if states["delivered"] != want || len(states) != 1 {
		t.Errorf("dispatch states %v; want all %d delivered", states, want)
	}
	pushes := map[string]int{}
	for _, m := range expo.Messages() {
		pushes[fmt.Sprint(m.To, m.Data["notification_id"])]++
	}
	for p, n := range pushes {
		if n > 1 {
			t.Errorf("push %s sent %d times", p, n)
		}
	}
	if len(pushes) != want {
		t.Errorf("%d distinct pushes reached Expo; want %d", len(pushes), want)
	}
	t.Logf("%d events (%d notifications) accepted across the failover", len(accepted), want)
}
