package central_test

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/central"
	"github.com/spoolcast/spoolcast/internal/oidctest"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/live"
)

// replicated is a migrated primary with an asynchronous streaming standby,
// and a pool on each as central opens them.
type replicated struct {
	*pgtest.Replicated
	primary, standby *pgxpool.Pool
}

func newReplicated(t *testing.T) *replicated {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a primary and a standby of its own")
	}
	r := pgtest.Primary(t, false)
	r.Migrate(t)
	open := func(url string) *pgxpool.Pool {
		pool, err := pgpool.New(context.Background(), pgpool.Config{URL: url, MaxConns: 4, ConnectTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	return &replicated{Replicated: r, primary: open(r.Primary.URL), standby: open(r.Standby.URL)}
}

// caughtUp waits until the standby has replayed all the primary has written.
func (r *replicated) caughtUp(t *testing.T) {
	t.Helper()
	var pos string
	if err := r.primary.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&pos); err != nil {
		t.Fatal(err)
	}
	testsignal.Eventually(t, "the standby to replay the primary's writes", 20*time.Second, func() bool {
		var ok bool
		err := r.standby.QueryRow(context.Background(), `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, pos).Scan(&ok)
		return err == nil && ok
	})
}

// freeze stops the primary streaming to the standby, which falls behind
// every write from now on, until thaw (or the end of the test).
func (r *replicated) freeze(t *testing.T) (thaw func()) {
	t.Helper()
	thaw, err := r.Primary.FreezeWALSenders()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(thaw) // before the primary stops: a frozen sender holds up its shutdown
	return thaw
}

// central starts a central.Server reading from the standby.
func (r *replicated) central(t *testing.T, iss *oidctest.Issuer, maxLag time.Duration) *harness {
	t.Helper()
	return newHarness(t, options{pool: r.primary, read: r.standby, iss: iss, maxReplicaLag: maxLag, probeInterval: 20 * time.Millisecond})
}

var readsSeries = regexp.MustCompile(`(?m)^spoolcast_feed_reads_total\{reason="([a-z_]+)",target="([a-z]+)"\} (\d+)$`)

// reads is how many feed reads went to target for reason.
func (h *harness) reads(target, reason string) int {
	h.t.Helper()
	for _, m := range readsSeries.FindAllStringSubmatch(string(h.request(http.MethodGet, "/metrics", "", "").raw), -1) {
		if m[1] == reason && m[2] == target {
			n, _ := strconv.Atoi(m[3])
			return n
		}
	}
	return 0
}

// replicaLag is the lag gauge.
func (h *harness) replicaLag() float64 {
	h.t.Helper()
	m := regexp.MustCompile(`(?m)^spoolcast_feed_replica_lag_seconds (\S+)$`).FindSubmatch(h.request(http.MethodGet, "/metrics", "", "").raw)
	if m == nil {
		h.t.Fatal("no spoolcast_feed_replica_lag_seconds in /metrics")
	}
	f, _ := strconv.ParseFloat(string(m[1]), 64)
	return f
}

// servesFromReplica waits until the server's monitor has measured the
// standby current and a read goes there.
func (h *harness) servesFromReplica(token string) {
	h.t.Helper()
	testsignal.Eventually(h.t, "a feed read served by the standby", 10*time.Second, func() bool {
		before := h.reads("replica", "current")
		h.request(http.MethodGet, "/v1/notifications/unread-count", token, "")
		return h.reads("replica", "current") > before
	})
}

// unreadTitles lists a page's unread titles in order.
func unreadTitles(r response) []string {
	var out []string
	for _, it := range r.body["data"].([]any) {
		if item := it.(map[string]any); item["read_at"] == nil {
			out = append(out, item["title"].(string))
		}
	}
	return out
}

func count(t *testing.T, r response) float64 {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("unread count = %d %s", r.status, r.raw)
	}
	return r.body["count"].(float64)
}

func TestFeedReadsAreServedByTheStandbyWhileItIsCurrent(t *testing.T) {
	t.Parallel()
	r := newReplicated(t)
	ctx := context.Background()
	ingestTitled(t, r.primary, "alice", "a", "b")
	dispatch := func(n int) {
		t.Helper()
		if _, err := r.primary.Exec(ctx, `INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, token, state)
			VALUES ($1, now(), 'alice', 'ExponentPushToken[abcdefghijkl]', 'sent')`, n); err != nil {
			t.Fatal(err)
		}
	}
	dispatch(1)
	r.caughtUp(t)
	// A minute of lag allowed: the frozen standby below still counts as current.
	h := r.central(t, nil, time.Minute)
	alice, admin := h.iss.Token("alice"), h.iss.Token("root", "admin")
	h.servesFromReplica(alice)

	r.freeze(t)
	// Rows only the primary has: a read that lacks them came from the standby.
	ingestTitled(t, r.primary, "alice", "only on the primary")
	dispatch(2)
	onReplica := h.reads("replica", "current")
	first := h.request(http.MethodGet, "/v1/notifications", alice, "")
	if first.status != 200 || !slices.Equal(titles(first), []string{"b", "a"}) {
		t.Fatalf("first page = %d %s; want the standby's b, a", first.status, first.raw)
	}
	if n := count(t, h.request(http.MethodGet, "/v1/notifications/unread-count", alice, "")); n != 2 {
		t.Errorf("unread count = %v; want the standby's 2", n)
	}
	if log := h.request(http.MethodGet, "/v1/admin/deliveries", admin, ""); log.status != 200 || len(log.body["data"].([]any)) != 1 {
		t.Errorf("delivery log = %d %s; want the standby's one dispatch", log.status, log.raw)
	}
	if got := h.reads("replica", "current") - onReplica; got != 3 {
		t.Errorf("reads counted on the replica = %d, want 3", got)
	}

	// The refresh cursor was read on the standby, before its page: a since
	// read on the primary from it returns what the page lacked.
	refresh, _ := first.body["refresh_cursor"].(string)
	since := h.request(http.MethodGet, "/v1/notifications?since="+refresh, alice, "")
	if since.status != 200 || !slices.Contains(titles(since), "only on the primary") {
		t.Errorf("since the standby's refresh cursor = %d %s; want the row only the primary has", since.status, since.raw)
	}
	replicaCursor, err := live.ParseCursor(refresh)
	if err != nil {
		t.Fatal(err)
	}
	primaryCursor, err := live.Now(ctx, r.primary, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if replicaCursor.History != primaryCursor.History {
		t.Errorf("the standby's cursor names history %+v, the primary's %+v", replicaCursor.History, primaryCursor.History)
	}
}

func TestAReadRightAfterAWriteShowsItThoughTheStandbyLags(t *testing.T) {
	t.Parallel()
	r := newReplicated(t)
	iss := oidctest.New(t)
	// Two replicas of central behind a load balancer: a write on one, the
	// next read on either.
	wrote, other := r.central(t, iss, time.Minute), r.central(t, iss, time.Minute)
	type carrier int
	const (
		cookie carrier = iota
		header
		memory // neither: the central replica that took the write remembers it
	)
	cases := []struct {
		name    string
		carrier carrier
		readAll bool
	}{
		{"mark read, the cookie carried to another central", cookie, false},
		{"read-all, the cookie carried to another central", cookie, true},
		{"mark read, the header carried to another central", header, false},
		{"read-all, the header carried to another central", header, true},
		{"mark read, nothing carried, the same central", memory, false},
		{"read-all, nothing carried, the same central", memory, true},
	}
	for i := range cases {
		ingestTitled(t, r.primary, fmt.Sprintf("user%d", i), fmt.Sprintf("u%d-1", i), fmt.Sprintf("u%d-2", i), fmt.Sprintf("u%d-3", i))
	}
	r.caughtUp(t)
	wrote.servesFromReplica(iss.Token("user0"))
	other.servesFromReplica(iss.Token("user0"))
	thaw := r.freeze(t)

	positions := map[int]string{}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			token := iss.Token(fmt.Sprintf("user%d", i))
			page := wrote.request(http.MethodGet, "/v1/notifications?limit=1", token, "")
			newest := page.body["data"].([]any)[0].(map[string]any)
			var w response
			if tc.readAll {
				w = wrote.request(http.MethodPost, "/v1/notifications/read-all", token, "")
			} else {
				w = wrote.request(http.MethodPost, "/v1/notifications/"+newest["id"].(string)+"/read", token, "")
			}
			if w.status >= 300 {
				t.Fatalf("write = %d %s", w.status, w.raw)
			}
			at := w.header.Get(central.WrittenAtHeader)
			cookies := (&http.Response{Header: w.header}).Cookies()
			if len(cookies) != 1 || cookies[0].Name != central.WrittenAtCookie || cookies[0].Value != at || at == "" {
				t.Fatalf("write answered %s %q and cookies %v; want the position in both", central.WrittenAtHeader, at, cookies)
			}
			if c := cookies[0]; c.Path != "/v1" || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.MaxAge < 1 || c.Secure {
				t.Errorf("cookie %s; want Path=/v1, HttpOnly, SameSite=Strict, a Max-Age, not Secure over plain HTTP", w.header.Get("Set-Cookie"))
			}
			positions[i] = at

			wantUnread := []string{fmt.Sprintf("u%d-2", i), fmt.Sprintf("u%d-1", i)}
			wantCount := 2.0
			if tc.readAll {
				wantUnread, wantCount = nil, 0
			}
			reader, carried := other, []string{}
			switch tc.carrier {
			case cookie:
				carried = []string{"Cookie", central.WrittenAtCookie + "=" + at}
			case header:
				carried = []string{central.WrittenAtHeader, at}
			case memory:
				reader = wrote
			}
			if tc.carrier != memory {
				// Without what it carries, the other central reads the
				// standby, which has not the write yet.
				if got := unreadTitles(reader.request(http.MethodGet, "/v1/notifications", token, "")); len(got) != 3 {
					t.Fatalf("a read carrying nothing shows unread %v; the standby was to lag", got)
				}
			}
			toPrimary := reader.reads("primary", "unreplayed_write")
			if got := unreadTitles(reader.request(http.MethodGet, "/v1/notifications", token, "", carried...)); !slices.Equal(got, wantUnread) {
				t.Errorf("page after the write shows unread %v, want %v", got, wantUnread)
			}
			if got := unreadTitles(reader.request(http.MethodGet, "/v1/notifications?cursor="+page.body["next_cursor"].(string), token, "", carried...)); !slices.Equal(got, wantUnread) {
				t.Errorf("the next page after the write shows unread %v, want %v", got, wantUnread)
			}
			if n := count(t, reader.request(http.MethodGet, "/v1/notifications/unread-count", token, "", carried...)); n != wantCount {
				t.Errorf("unread count after the write = %v, want %v", n, wantCount)
			}
			if got := reader.reads("primary", "unreplayed_write") - toPrimary; got != 3 {
				t.Errorf("%d reads went to the primary for the unreplayed write, want 3", got)
			}
		})
	}

	t.Run("the cookie is Secure over HTTPS", func(t *testing.T) {
		w := wrote.request(http.MethodPost, "/v1/notifications/read-all", iss.Token("user0"), "", "X-Forwarded-Proto", "https")
		if c := (&http.Response{Header: w.header}).Cookies(); len(c) != 1 || !c[0].Secure {
			t.Errorf("cookie over HTTPS = %s; want Secure", w.header.Get("Set-Cookie"))
		}
	})

	// Once the standby has replayed the write, the same position reads there.
	thaw()
	r.caughtUp(t)
	before := other.reads("replica", "write_replayed")
	if got := unreadTitles(other.request(http.MethodGet, "/v1/notifications", iss.Token("user1"), "", "Cookie", central.WrittenAtCookie+"="+positions[1])); got != nil {
		t.Errorf("after the standby caught up: unread %v, want none", got)
	}
	if other.reads("replica", "write_replayed") != before+1 {
		t.Error("a read whose position the standby has replayed did not go to the standby")
	}
	// A position that does not parse is never a guess: the primary answers.
	before = other.reads("primary", "unreplayed_write")
	if r := other.request(http.MethodGet, "/v1/notifications/unread-count", iss.Token("user1"), "", central.WrittenAtHeader, "not-a-position"); r.status != 200 || other.reads("primary", "unreplayed_write") != before+1 {
		t.Errorf("a malformed position: %d, counted on the primary %v", r.status, other.reads("primary", "unreplayed_write")-before)
	}
}

func TestAStandbyPastTheMaxLagSendsReadsToThePrimary(t *testing.T) {
	t.Parallel()
	r := newReplicated(t)
	ingestTitled(t, r.primary, "alice", "a")
	r.caughtUp(t)
	const maxLag = 300 * time.Millisecond
	h := r.central(t, nil, maxLag)
	alice := h.iss.Token("alice")
	h.servesFromReplica(alice)

	// An idle primary is not a lagging standby, though the last transaction
	// it replayed grows old.
	testsignal.Eventually(t, "the standby's last replayed transaction to be older than the limit", 10*time.Second, func() bool {
		var old bool
		err := r.standby.QueryRow(context.Background(), `SELECT now() - pg_last_xact_replay_timestamp() > $1::interval`, maxLag).Scan(&old)
		return err == nil && old
	})
	before := h.reads("replica", "current")
	if n := count(t, h.request(http.MethodGet, "/v1/notifications/unread-count", alice, "")); n != 1 || h.reads("replica", "current") != before+1 || h.replicaLag() != 0 {
		t.Errorf("idle: unread count %v, on the replica %d, lag %vs; want 1 from the current replica, lag 0", n, h.reads("replica", "current")-before, h.replicaLag())
	}

	thaw := r.freeze(t)
	ingestTitled(t, r.primary, "alice", "b")
	// Reads may go to the standby, which lacks b, until its lag passes the limit.
	testsignal.Eventually(t, "the page to show b, from the primary", 10*time.Second, func() bool {
		return slices.Contains(titles(h.request(http.MethodGet, "/v1/notifications", alice, "")), "b")
	})
	// The gauge is set as the lag is measured, once an interval.
	testsignal.Eventually(t, "the lag gauge to pass the limit", 10*time.Second, func() bool { return h.replicaLag() > maxLag.Seconds() })
	before = h.reads("primary", "replica_lagging")
	if n := count(t, h.request(http.MethodGet, "/v1/notifications/unread-count", alice, "")); n != 2 || h.reads("primary", "replica_lagging") != before+1 {
		t.Errorf("unread count = %v; want the primary's 2, counted as replica_lagging", n)
	}

	thaw()
	r.caughtUp(t)
	h.servesFromReplica(alice)
	testsignal.Eventually(t, "the lag gauge to fall back", 10*time.Second, func() bool { return h.replicaLag() < maxLag.Seconds() })
}

func TestADownStandbySendsReadsToThePrimary(t *testing.T) {
	t.Parallel()
	r := newReplicated(t)
	ingestTitled(t, r.primary, "alice", "a")
	r.caughtUp(t)
	h := r.central(t, nil, time.Minute)
	alice := h.iss.Token("alice")
	h.servesFromReplica(alice)

	if err := r.Standby.Kill(); err != nil {
		t.Fatal(err)
	}
	ingestTitled(t, r.primary, "alice", "b")
	// Every read answers, from the first after the kill: one that fails on
	// the standby is asked of the primary.
	testsignal.Eventually(t, "reads to go to the primary as the standby is down", 10*time.Second, func() bool {
		page := h.request(http.MethodGet, "/v1/notifications", alice, "")
		if page.status != 200 || !slices.Equal(titles(page), []string{"b", "a"}) {
			t.Fatalf("page with the standby down = %d %s; want the primary's b, a", page.status, page.raw)
		}
		return h.reads("primary", "replica_down") > 0
	})
	if n := count(t, h.request(http.MethodGet, "/v1/notifications/unread-count", alice, "")); n != 2 {
		t.Errorf("unread count = %v; want the primary's 2", n)
	}
}

func TestAReadReplicaOfAnotherDatabaseIsNeverRead(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own")
	}
	t.Parallel()
	other := pgtest.Connect(t, pgtest.Cluster(t).URL)
	h := newHarness(t, options{read: other, probeInterval: 20 * time.Millisecond})
	ingestTitled(t, h.pool, "alice", "a")
	alice := h.iss.Token("alice")
	testsignal.Eventually(t, "the replica to be measured", 10*time.Second, func() bool {
		page := h.request(http.MethodGet, "/v1/notifications", alice, "")
		if page.status != 200 || !slices.Equal(titles(page), []string{"a"}) {
			t.Fatalf("page = %d %s; want the primary's a", page.status, page.raw)
		}
		return h.reads("primary", "replica_down") > 1
	})
	if n := h.reads("replica", "current") + h.reads("replica", "primary_down"); n != 0 {
		t.Errorf("%d reads went to a server of another database", n)
	}
}

func TestFeedReadsAnswerFromTheStandbyWhileThePrimaryIsDown(t *testing.T) {
	t.Parallel()
	r := newReplicated(t)
	ctx := context.Background()
	ingestTitled(t, r.primary, "alice", "a", "b")
	r.caughtUp(t)
	h := r.central(t, nil, 5*time.Second)
	alice, admin := h.iss.Token("alice"), h.iss.Token("root", "admin")
	h.servesFromReplica(alice)
	before, err := live.Now(ctx, r.primary, "alice")
	if err != nil {
		t.Fatal(err)
	}
	id := titlesAndIDs(t, h.request(http.MethodGet, "/v1/notifications", alice, ""))["b"]

	if err := r.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	for range 3 { // the first reads after the kill, and later ones
		first := h.request(http.MethodGet, "/v1/notifications?limit=1", alice, "")
		if first.status != 200 || !slices.Equal(titles(first), []string{"b"}) {
			t.Fatalf("first page with the primary down = %d %s", first.status, first.raw)
		}
		if c, err := live.ParseCursor(first.body["refresh_cursor"].(string)); err != nil || c.History != before.History {
			t.Errorf("refresh cursor from the standby: %+v, %v; want the primary's history %+v", c, err, before.History)
		}
		next := h.request(http.MethodGet, "/v1/notifications?limit=1&cursor="+first.body["next_cursor"].(string), alice, "")
		if next.status != 200 || !slices.Equal(titles(next), []string{"a"}) {
			t.Errorf("second page = %d %s", next.status, next.raw)
		}
		if n := count(t, h.request(http.MethodGet, "/v1/notifications/unread-count", alice, "")); n != 2 {
			t.Errorf("unread count = %v, want 2", n)
		}
		if log := h.request(http.MethodGet, "/v1/admin/deliveries", admin, ""); log.status != 200 {
			t.Errorf("delivery log = %d %s", log.status, log.raw)
		}
	}
	if h.reads("primary", "replica_down")+h.reads("primary", "replica_lagging")+h.reads("primary", "replica_failed") != 0 {
		t.Errorf("a read was sent to the primary while the standby could answer it: down %v lagging %v failed %v", h.reads("primary", "replica_down"), h.reads("primary", "replica_lagging"), h.reads("primary", "replica_failed"))
	}
	// Readiness says what the replica can do: serve reads from the standby.
	if r := h.request(http.MethodGet, "/readyz", "", ""); r.status != http.StatusOK {
		t.Errorf("/readyz with the primary down and a current standby = %d %s; want 200: reads are served", r.status, r.raw)
	}

	for _, w := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/notifications/" + id + "/read", ""},
		{http.MethodPost, "/v1/notifications/read-all", ""},
		{http.MethodPut, "/v1/devices", `{"token":"ExponentPushToken[abcdefghijkl]","platform":"ios"}`},
		{http.MethodPut, "/v1/preferences", `{"categories":{"jobs":{"push":false}}}`},
	} {
		if resp := h.request(w.method, w.path, alice, w.body); resp.status != http.StatusServiceUnavailable {
			t.Errorf("%s %s with the primary down = %d %s, want 503", w.method, w.path, resp.status, resp.raw)
		}
	}
	// A read that must show a write the standby has not replayed is not
	// answered from it: it waits for the primary.
	if resp := h.request(http.MethodGet, "/v1/notifications/unread-count", alice, "", central.WrittenAtHeader, "FFFFFFFF/0"); resp.status != http.StatusServiceUnavailable {
		t.Errorf("a read carrying a position beyond the standby = %d %s, want 503", resp.status, resp.raw)
	}
}

// titlesAndIDs maps a page's titles to their ids.
func titlesAndIDs(t *testing.T, r response) map[string]string {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("page = %d %s", r.status, r.raw)
	}
	out := map[string]string{}
	for _, it := range r.body["data"].([]any) {
		item := it.(map[string]any)
		out[item["title"].(string)] = item["id"].(string)
	}
	return out
}
