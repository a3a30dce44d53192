package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/internal/oidctest"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/proctest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// chromium finds Debian's Chromium. Without it the browser tests fail,
// saying how to install it: a skip goes unseen in `go test ./...`, and a
// suite that passes without them claims more than it ran. CI sets
// SPOOLCAST_REQUIRE_CHROMIUM=1; =0 skips them on purpose.
func chromium(t *testing.T) string {
	t.Helper()
	path, skip, err := findChromium(exec.LookPath, os.Getenv("SPOOLCAST_REQUIRE_CHROMIUM"))
	if skip != "" {
		t.Skip(skip)
	}
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// findChromium looks for Chromium and says what its absence means: a
// failure, unless require is "0".
func findChromium(lookPath func(string) (string, error), require string) (path, skip string, err error) {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := lookPath(name); err == nil {
			return p, "", nil
		}
	}
	if require == "0" {
		return "", "no Chromium, and SPOOLCAST_REQUIRE_CHROMIUM=0: the browser tests are skipped", nil
	}
	return "", "", errors.New("the browser tests need Chromium, which is not installed: scripts/ensure-deps chromium " +
		"(apt-get install chromium); SPOOLCAST_REQUIRE_CHROMIUM=0 skips them instead")
}

// Without Chromium the browser tests fail unless skipping them was asked
// for; CI's SPOOLCAST_REQUIRE_CHROMIUM=1 fails them too.
func TestAMissingChromiumFailsTheBrowserTestsUnlessSkippingThemIsAsked(t *testing.T) {
	none := func(string) (string, error) { return "", exec.ErrNotFound }
	for _, c := range []struct {
		require  string
		wantSkip bool
	}{{"", false}, {"1", false}, {"0", true}} {
		_, skip, err := findChromium(none, c.require)
		switch {
		case c.wantSkip && (skip == "" || err != nil):
			t.Errorf("SPOOLCAST_REQUIRE_CHROMIUM=%q without Chromium: skip %q, err %v; want a skip", c.require, skip, err)
		case !c.wantSkip && (skip != "" || err == nil || !strings.Contains(err.Error(), "scripts/ensure-deps chromium")):
			t.Errorf("SPOOLCAST_REQUIRE_CHROMIUM=%q without Chromium: skip %q, err %v; want a failure saying how to install it", c.require, skip, err)
		}
	}
	found := func(name string) (string, error) { return "/usr/bin/" + name, nil }
	if path, skip, err := findChromium(found, ""); path != "/usr/bin/chromium" || skip != "" || err != nil {
		t.Errorf("with Chromium installed: %q, %q, %v", path, skip, err)
	}
}

// stack is a relay and a central (with --inbox) on a test database, as
// subprocesses, central restartable on the same address.
type stack struct {
	t       *testing.T
	db      string
	pool    *pgxpool.Pool
	iss     *oidctest.Issuer
	relay   string
	addr    string
	flags   []string // central's flags beyond the stack's own
	central *proctest.Process
}

func (s *stack) startCentral() {
	s.t.Helper()
	s.central = s.centralAt(s.addr)
}

func (s *stack) centralAt(addr string) *proctest.Process {
	s.t.Helper()
	args := []string{"central", "--listen", addr, "--database-url", s.db, "--inbox",
		"--oidc-issuer", s.iss.URL(), "--oidc-audience", oidctest.Audience, "--jwks-url", s.iss.JWKSURL(),
		"--push=false", "--maintenance-interval", "0", "--live-poll-interval", "100ms", "--log-level", "warn"}
	p := proctest.Start(s.t, nil, append(args, s.flags...)...)
	p.WaitHealthy("http://" + addr)
	return p
}

// post sends an event for u1 to the relay and waits until it is in Postgres.
func (s *stack) post(key, title string) {
	s.t.Helper()
	s.postFor("u1", key, title)
}

func (s *stack) postFor(user, key, title string) {
	s.t.Helper()
	body := fmt.Sprintf(`{"idempotency_key":%q,"type":"build.finished","recipients":[%q],"title":%q,"body":"Posted by the browser test."}`, key, user, title)
	resp, err := http.Post("http://"+s.relay+"/v1/events", "application/json", strings.NewReader(body))
	if err != nil || resp.StatusCode != http.StatusAccepted {
		s.t.Fatalf("post %s: %v %v", key, resp, err)
	}
	resp.Body.Close()
	testsignal.Eventually(s.t, key+" to reach Postgres", 20*time.Second, func() bool {
		var n int
		err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM notifications WHERE title = $1`, title).Scan(&n)
		return err == nil && n == 1
	})
}

// startStack starts a relay and a central on a fresh database.
func startStack(t *testing.T) *stack {
	t.Helper()
	s := &stack{t: t, db: pgtest.DB(t), iss: oidctest.New(t), relay: proctest.FreeAddr(t), addr: proctest.FreeAddr(t)}
	var err error
	if s.pool, err = pgxpool.New(context.Background(), s.db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.pool.Close)
	relay := proctest.Start(t, nil, "relay", "--producer", "ci", "--listen", s.relay, "--spool", filepath.Join(t.TempDir(), "spool.db"),
		"--database-url", s.db, "--log-level", "warn")
	relay.WaitHealthy("http://" + s.relay)
	s.startCentral()
	return s
}

// page is one headless Chromium tab.
type page struct {
	t    *testing.T
	ctx  context.Context
	step string // what the test waits for: named in failures and the screenshot's log line
}

// openBrowser starts Chromium; when the test ends, it saves a screenshot of
// the page as it was (at the end, or where the test failed) for a person to
// look at. options go after the allocator's own (more Chromium flags).
func openBrowser(t *testing.T, options ...chromedp.ExecAllocatorOption) *page {
	t.Helper()
	browser := chromium(t)
	alloc, cancel := chromedp.NewExecAllocator(context.Background(), append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(browser), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(900, 1200)}, options...)...)
	t.Cleanup(cancel)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(cancel)
	ctx, cancel = context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(cancel)
	p := &page{t: t, ctx: ctx, step: "start"}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100)); err == nil {
			path := filepath.Join(screenshots(t), "inbox.png")
			if os.WriteFile(path, png, 0o644) == nil {
				t.Logf("screenshot after %q: %s", p.step, path)
			}
		}
	})
	return p
}

// screenshots is the folder a test keeps its screenshots in:
// $SPOOLCAST_SCREENSHOTS/<test name> when that is set (CI keeps it), else
// the test's artifact directory (kept under go test -artifacts -outputdir,
// a temporary one otherwise). PNGs are never committed.
func screenshots(t *testing.T) string {
	t.Helper()
	root := os.Getenv("SPOOLCAST_SCREENSHOTS")
	if root == "" {
		return t.ArtifactDir()
	}
	dir := filepath.Join(root, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// shot keeps a screenshot of the page as it is now, named for the state it shows.
func (p *page) shot(name string) {
	p.t.Helper()
	png, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(screenshots(p.t), name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("screenshot of %s: %s", name, path)
}

// wait polls a JavaScript condition until it holds.
func (p *page) wait(what, cond string) {
	p.t.Helper()
	p.step = what
	deadline := time.Now().Add(30 * time.Second)
	var err error
	for {
		_, err = chromedp.Run(p.ctx, chromedp.Poll[chromedp.Void](cond, chromedp.WithPollingTimeout(time.Until(deadline))))
		// A poll begun while a navigation replaces the page's context
		// fails at once: poll again in the new one.
		if err == nil || !strings.Contains(err.Error(), "Cannot find context with specified id") || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		text, _ := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.body.innerText`))
		p.t.Fatalf("%s: %v\nthe page shows:\n%s", what, err, text)
	}
}

func TestTheInboxShowsTheFeedLiveArrivalsAndWhatWasMissedWhileDisconnected(t *testing.T) {
	s := startStack(t)
	for i := range 25 {
		s.post(fmt.Sprintf("old-%d", i), fmt.Sprintf("Older build %02d", i))
	}
	p := openBrowser(t)
	ctx, wait := p.ctx, p.wait
	var err error
	const items = `[...document.querySelectorAll('#feed li .title')].map(e => e.textContent)`

	token := s.iss.Token("u1")
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+s.addr+"/inbox#token="+token)); err != nil {
		t.Fatal(err)
	}
	wait("the stream is live", `document.getElementById('status').textContent === 'live'`)
	wait("the first page of the feed", `document.querySelectorAll('#feed li').length >= 20`)
	wait("no notify control, as central has no VAPID key", `performance.getEntriesByType('resource').some(e => e.name.endsWith('/v1/push/vapid-public-key')) && document.getElementById('push').hidden`)
	if url, err := chromedp.Run(ctx, chromedp.Location()); err != nil || strings.Contains(url, token) {
		t.Errorf("the token stays in the address bar: %s", url)
	}
	p.step = "infinite scroll"
	if err := chromedp.Do(ctx, chromedp.ScrollIntoView(chromedp.ID("more"))); err != nil {
		t.Fatal(err)
	}
	wait("the next page on scrolling", `document.querySelectorAll('#feed li').length === 25`)
	wait("the unread badge", `document.getElementById('badge').textContent === '25'`)

	s.post("live-1", "Deploy finished")
	wait("a live arrival at the top", items+`[0] === 'Deploy finished'`)
	wait("the badge counting it", `document.getElementById('badge').textContent === '26'`)

	p.step = "mark one read"
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#feed li:first-child`))); err != nil {
		t.Fatal(err)
	}
	wait("the badge dropping", `document.getElementById('badge').textContent === '25'`)
	wait("the item shown read", `!document.querySelector('#feed li:first-child').classList.contains('unread')`)

	// Central goes away (a deploy): the page reconnects when it is back and
	// gets what was posted meanwhile, once each.
	s.central.Stop()
	wait("the page noticing", `document.getElementById('status').textContent === 'reconnecting'`)
	s.post("missed-1", "Missed while away 1")
	s.post("missed-2", "Missed while away 2")
	s.startCentral()
	wait("the missed notifications after reconnecting", items+`.slice(0, 2).join('|') === 'Missed while away 2|Missed while away 1'`)
	wait("live again", `document.getElementById('status').textContent === 'live'`)
	titles, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](items))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, title := range titles {
		seen[title]++
	}
	if len(titles) != 28 || len(seen) != 28 {
		t.Errorf("%d items, %d distinct; want 28 once each: %v", len(titles), len(seen), titles)
	}
	wait("the badge after reconnecting", `document.getElementById('badge').textContent === '27'`)

	// Another session (a phone, through another replica) marks everything
	// read while this page is away: read frames are live only, so the page
	// must ask again after reconnecting.
	const noneUnread = `getComputedStyle(document.getElementById('badge')).display === 'none' && document.querySelectorAll('#feed li.unread').length === 0`
	s.central.Stop()
	wait("the page noticing again", `document.getElementById('status').textContent === 'reconnecting'`)
	otherAddr := proctest.FreeAddr(t)
	other := s.centralAt(otherAddr)
	p.step = "read-all in another session"
	req, _ := http.NewRequest(http.MethodPost, "http://"+otherAddr+"/v1/notifications/read-all", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("read-all in another session: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	other.Stop()
	s.startCentral()
	wait("live after the other session's read-all", `document.getElementById('status').textContent === 'live'`)
	wait("nothing unread after reconnecting", noneUnread)

	s.post("live-2", "Tests passed")
	wait("a new arrival unread", `document.getElementById('badge').textContent === '1' && document.querySelectorAll('#feed li.unread').length === 1`)
	p.step = "mark all read"
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("read-all"))); err != nil {
		t.Fatal(err)
	}
	wait("no unread left", noneUnread)

	// Signing out leaves nothing of u1; u2 signs in by pasting a token with
	// its scheme, as copied from a header, and sees only their own.
	s.postFor("u2", "u2-1", "For the second user")
	p.step = "sign out"
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("sign-out"))); err != nil {
		t.Fatal(err)
	}
	wait("the sign-in form, empty", `!document.getElementById('sign-in').hidden && document.querySelectorAll('#feed li').length === 0 && document.getElementById('token').value === ''`)
	p.step = "sign in as u2"
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.ID("token"), "Bearer "+s.iss.Token("u2"))); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("sign-in-button"))); err != nil {
		t.Fatal(err)
	}
	wait("u2's feed alone", items+`.join('|') === 'For the second user' && document.getElementById('badge').textContent === '1'`)
	wait("u2 live", `document.getElementById('status').textContent === 'live'`)
	p.step = "done"
}

// A page of the feed that fails is tried again by itself, no sooner than the
// server's Retry-After; the page says so meanwhile. The failures come from a
// proxy in front of central that answers the first two feed reads with 503.
func TestTheInboxTriesAFailedPageAgain(t *testing.T) {
	s := startStack(t)
	s.post("old-1", "Before the outage")
	target, _ := url.Parse("http://" + s.addr)
	var failed atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/notifications" && failed.Load() < 2 {
			failed.Add(1)
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"type":"urn:spoolcast:problem:unavailable","title":"Unavailable","status":503,"detail":"the notification store is unavailable"}`))
			return
		}
		httputil.NewSingleHostReverseProxy(target).ServeHTTP(w, r) // the stream's upgrade included
	}))
	t.Cleanup(proxy.Close)

	p := openBrowser(t)
	if err := chromedp.Do(p.ctx, chromedp.Navigate(proxy.URL+"/inbox#token="+s.iss.Token("u1"))); err != nil {
		t.Fatal(err)
	}
	p.wait("the failure shown", `document.getElementById('more').textContent.startsWith('Could not load: the notification store is unavailable')`)
	p.wait("the feed after the retries", `[...document.querySelectorAll('#feed li .title')].map(e => e.textContent).join('|') === 'Before the outage'`)
	if n := failed.Load(); n != 2 {
		t.Errorf("%d feed reads failed, want 2", n)
	}
}

// A frame may bring a notification older than ones already shown (its
// transaction started first and committed last): the page puts it at its
// place in feed order, and read-all, which covers the newest and everything
// older in feed order, shows it read too.
func TestALateCommitGoesToItsFeedPlaceAndReadAllCoversIt(t *testing.T) {
	s := startStack(t)
	s.post("first", "Newest before the late one")
	p := openBrowser(t)
	if err := chromedp.Do(p.ctx, chromedp.Navigate("http://"+s.addr+"/inbox#token="+s.iss.Token("u1"))); err != nil {
		t.Fatal(err)
	}
	p.wait("live", `document.getElementById('status').textContent === 'live'`)
	p.wait("the feed", `document.querySelectorAll('#feed li').length === 1`)
	s.post("second", "Newest of all")
	p.wait("the newest at the top", `document.querySelector('#feed li .title').textContent === 'Newest of all'`)

	// As ingest would commit it after a transaction that started later: a
	// created_at a minute old.
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO notifications (user_id, created_at, type, category, producer, idempotency_key, notification_key, title)
		VALUES ('u1', now() - interval '1 minute', 'build.finished', 'builds', 'ci', 'late', 'late', 'Committed late')`); err != nil {
		t.Fatal(err)
	}
	const items = `[...document.querySelectorAll('#feed li .title')].map(e => e.textContent).join('|')`
	p.wait("the late one below the newer ones", items+` === 'Newest of all|Newest before the late one|Committed late'`)
	p.wait("three unread", `document.getElementById('badge').textContent === '3'`)

	p.step = "mark all read"
	if err := chromedp.Do(p.ctx, chromedp.Click(chromedp.ID("read-all"))); err != nil {
		t.Fatal(err)
	}
	p.wait("all three read", `getComputedStyle(document.getElementById('badge')).display === 'none' && document.querySelectorAll('#feed li.unread').length === 0`)
}

// Read-all marks read what had committed when it was asked. A notification
// whose transaction was open meanwhile commits after it, older in feed order
// than the newest one read: it arrives unread, the badge counts it, and the
// read frame of the read-all leaves it unread.
func TestANotificationCommittedAfterReadAllArrivesUnread(t *testing.T) {
	s := startStack(t)
	s.post("first", "Read by read-all")
	p := openBrowser(t)
	if err := chromedp.Do(p.ctx, chromedp.Navigate("http://"+s.addr+"/inbox#token="+s.iss.Token("u1"))); err != nil {
		t.Fatal(err)
	}
	p.wait("live", `document.getElementById('status').textContent === 'live'`)
	p.wait("the feed", `document.querySelectorAll('#feed li').length === 1`)

	ctx := context.Background()
	open, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	if _, err := open.Exec(ctx, `INSERT INTO notifications (user_id, created_at, type, category, producer, idempotency_key, notification_key, title)
		VALUES ('u1', now() - interval '1 minute', 'build.finished', 'builds', 'ci', 'late', 'late', 'Committed after read-all')`); err != nil {
		t.Fatal(err)
	}
	p.step = "mark all read"
	if err := chromedp.Do(p.ctx, chromedp.Click(chromedp.ID("read-all"))); err != nil {
		t.Fatal(err)
	}
	p.wait("the shown one read", `getComputedStyle(document.getElementById('badge')).display === 'none' && document.querySelectorAll('#feed li.unread').length === 0`)
	// The page shows it at once; the server must have it before the late
	// one commits, or read-all would rightly cover that one too.
	testsignal.Eventually(t, "read-all to reach Postgres", 20*time.Second, func() bool {
		return pgtest.Count(t, s.pool, `SELECT count(*) FROM read_marks WHERE user_id = 'u1'`) == 1
	})
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_ = ingest.WakeUp(ctx, s.pool)
	const items = `[...document.querySelectorAll('#feed li')].map(e => e.querySelector('.title').textContent + (e.classList.contains('unread') ? '*' : '')).join('|')`
	p.wait("the late one unread below the read one", items+` === 'Read by read-all|Committed after read-all*'`)
	p.wait("one unread", `document.getElementById('badge').textContent === '1'`)
	// The API agrees: one unread, the late one.
	req, _ := http.NewRequest(http.MethodGet, "http://"+s.addr+"/v1/notifications?unread=true", nil)
	req.Header.Set("Authorization", "Bearer "+s.iss.Token("u1"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var page struct {
		Data []struct{ Title string } `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil || len(page.Data) != 1 || page.Data[0].Title != "Committed after read-all" {
		t.Errorf("unread page = %+v, %v; want the late one alone", page.Data, err)
	}
}

// Behind a proxy that refuses WebSocket upgrades, the page (through the
// SDK) finds the API answering and falls back to the same stream as
// server-sent events: it goes live there, gets arrivals, and across a
// restart of central gets what was posted meanwhile once each, resumed by
// the event stream's cursor.
func TestTheInboxFallsBackToServerSentEventsWhereUpgradesAreRefused(t *testing.T) {
	s := startStack(t)
	s.post("before", "Before the proxy")
	target, _ := url.Parse("http://" + s.addr)
	var refused, eventStreams atomic.Int32
	forward := httputil.NewSingleHostReverseProxy(target)
	forward.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		t.Logf("proxy: %s %s: %v", r.Method, r.URL.Path, err) // central is down for a while
		w.WriteHeader(http.StatusBadGateway)
	}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			refused.Add(1)
			http.Error(w, "no upgrades past here", http.StatusForbidden)
			return
		}
		if r.URL.Path == "/v1/stream" && strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			eventStreams.Add(1)
		}
		forward.ServeHTTP(w, r) // flushes an event stream as it comes
	}))
	t.Cleanup(proxy.Close)

	p := openBrowser(t)
	if err := chromedp.Do(p.ctx, chromedp.Navigate(proxy.URL+"/inbox#token="+s.iss.Token("u1"))); err != nil {
		t.Fatal(err)
	}
	const items = `[...document.querySelectorAll('#feed li .title')].map(e => e.textContent).join('|')`
	p.wait("live", `document.getElementById('status').textContent === 'live'`)
	p.wait("the feed", items+` === 'Before the proxy'`)
	if n, m := refused.Load(), eventStreams.Load(); n < 3 || m != 1 {
		t.Errorf("%d upgrades refused, %d event streams; want at least 3, then 1", n, m)
	}
	s.post("live", "Over server-sent events")
	p.wait("a live arrival", items+` === 'Over server-sent events|Before the proxy'`)

	s.central.Stop()
	p.wait("the page noticing", `document.getElementById('status').textContent === 'reconnecting'`)
	s.post("missed-1", "Missed while away 1")
	s.post("missed-2", "Missed while away 2")
	s.startCentral()
	p.wait("the missed ones once each, live again", items+` === 'Missed while away 2|Missed while away 1|Over server-sent events|Before the proxy' && document.getElementById('status').textContent === 'live'`)
	p.wait("the badge", `document.getElementById('badge').textContent === '4'`)
	if m := eventStreams.Load(); m < 2 {
		t.Errorf("%d event streams; want the resume to be one", m)
	}
	p.step = "done"
}
