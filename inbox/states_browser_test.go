package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// What a person sees, read through the DOM.
const (
	titlesOf = `((id) => [...document.querySelectorAll('#' + id + ' li .title')].map(e => e.textContent))`
	// shownOf is a list's items, in order, each unread one starred: "Build 3*|Build 2".
	shownOf = `((id) => [...document.querySelectorAll('#' + id + ' li')].map(li => li.querySelector('.title').textContent + (li.classList.contains('unread') ? '*' : '')).join('|'))`
	// tabsShown is each tab's name as a screen reader hears it, and whether it is selected: "All|Unread 3*|Archived" (* selected).
	tabsShown = `[...document.querySelectorAll('[role=tab]')].map(t => t.textContent.replace(/\s+/g, ' ').trim() + (t.getAttribute('aria-selected') === 'true' ? '*' : '')).join('|')`
)

// postIn sends an event for user in category to the relay and waits until it is in Postgres.
func (s *stack) postIn(user, key, title, category string) {
	s.t.Helper()
	body := fmt.Sprintf(`{"idempotency_key":%q,"type":"build.finished","category":%q,"recipients":[%q],"title":%q,"body":"Posted by the browser test."}`, key, category, user, title)
	resp, err := http.Post("http://"+s.relay+"/v1/events", "application/json", strings.NewReader(body))
	if err != nil || resp.StatusCode != http.StatusAccepted {
		s.t.Fatalf("post %s: %v %v", key, resp, err)
	}
	resp.Body.Close()
	s.waitStored(title)
}

func (s *stack) waitStored(title string) {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM notifications WHERE title = $1`, title).Scan(&n); err == nil && n == 1 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s never reached Postgres", title)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// insertAged stores a notification for user created age ago, as if it had been there that long.
func (s *stack) insertAged(user, title, category string, age time.Duration) {
	s.t.Helper()
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO notifications (user_id, created_at, type, category, producer, idempotency_key, notification_key, title)
		VALUES ($1, now() - $2::interval, 'build.finished', $3, 'ci', $4, $4, $4)`, user, fmt.Sprintf("%d milliseconds", age.Milliseconds()), category, title); err != nil {
		s.t.Fatal(err)
	}
}

// api calls central as user and decodes the answer into out (when not nil).
func (s *stack) api(user, method, path string, out any) {
	s.t.Helper()
	req, _ := http.NewRequest(method, "http://"+s.addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+s.iss.Token(user))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		s.t.Fatalf("%s %s: %s", method, path, resp.Status)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			s.t.Fatal(err)
		}
	}
}

// openInbox opens the inbox of user at base and waits until it is live with its first page.
func openInbox(t *testing.T, p *page, base, user string, s *stack) {
	t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.Navigate(base+"/inbox#token="+s.iss.Token(user))); err != nil {
		t.Fatal(err)
	}
	p.wait("live", `document.getElementById('status').textContent === 'live'`)
}

// another opens a second tab of the same browser: another page of the same user.
func (p *page) another() *page {
	p.t.Helper()
	if err := chromedp.Do(p.ctx); err != nil { // the browser starts with its first tab
		p.t.Fatal(err)
	}
	ctx, cancel := chromedp.NewContext(p.ctx)
	p.t.Cleanup(cancel)
	return &page{t: p.t, ctx: ctx, step: "start"}
}

func (p *page) eval(expr string) string {
	p.t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[any](expr))
	if err != nil {
		p.t.Fatalf("%s: %v", expr, err)
	}
	return fmt.Sprint(v)
}

func (p *page) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	p.step = what
	if err := chromedp.Do(p.ctx, actions...); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

// The page a person keeps open: the tabs with their counts, the items with
// their category as a label and how long ago they came ("3 min ago", kept
// current), marks and archives per item moving them between the tabs, the
// tabs reached and moved through with the keyboard, the bell counting what
// is new until it is opened, and a screenshot of each state.
func TestTheInboxShowsTabsCountsLabelsAndRelativeTimes(t *testing.T) {
	s := startStack(t)
	s.insertAged("u1", "Nightly backup done", "ops", 3*time.Minute+10*time.Second)
	s.insertAged("u1", "Disk almost full", "ops", 45*time.Second)
	s.postIn("u1", "k1", "Deploy 41 finished", "builds")
	p := openBrowser(t)
	openInbox(t, p, "http://"+s.addr, "u1", s)
	p.wait("three items", shownOf+`('feed') === 'Deploy 41 finished*|Disk almost full*|Nightly backup done*'`)
	p.wait("the tabs and their counts", tabsShown+` === 'All*|Unread 3|Archived'`)
	p.wait("the labels", `[...document.querySelectorAll('#feed .label')].map(e => e.textContent).join() === 'builds,ops,ops'`)
	p.wait("the times", `[...document.querySelectorAll('#feed time')].map(e => e.textContent).join() === 'just now,just now,3 min ago'`)
	if title := p.eval(`document.querySelector('#feed li:last-child time').title`); !strings.Contains(title, "20") {
		t.Errorf("a time's title is %q; want the full date", title)
	}
	p.wait("the bell counting three new", `document.getElementById('bell-count').textContent === '3' && document.getElementById('bell').getAttribute('aria-label') === 'Notifications, 3 new'`)
	p.wait("the empty states hidden, no skeleton", `document.getElementById('empty').hidden && document.querySelector('#panel-all .skeletons').hidden`)
	p.shot("light-all")
	p.wait("the time kept current: 45 s old becomes 1 min", `[...document.querySelectorAll('#feed time')].map(e => e.textContent).join() === 'just now,1 min ago,3 min ago'`)

	// Per item: mark read, then unread; archive.
	p.do("mark the newest read", chromedp.Click(chromedp.CSS(`#feed li:first-child button[data-kind=read]`)))
	p.wait("read, and the count", shownOf+`('feed') === 'Deploy 41 finished|Disk almost full*|Nightly backup done*' && `+tabsShown+` === 'All*|Unread 2|Archived'`)
	if label := p.eval(`document.querySelector('#feed li:first-child button[data-kind=read]').getAttribute('aria-label')`); label != "Mark unread: Deploy 41 finished" {
		t.Errorf("the button's label is %q", label)
	}
	p.do("mark it unread", chromedp.Click(chromedp.CSS(`#feed li:first-child button[data-kind=read]`)))
	p.wait("unread again", tabsShown+` === 'All*|Unread 3|Archived'`)
	p.do("archive the oldest", chromedp.Click(chromedp.CSS(`#feed li:last-child button[data-kind=archive]`)))
	p.wait("it left All, the counts follow", shownOf+`('feed') === 'Deploy 41 finished*|Disk almost full*' && `+tabsShown+` === 'All*|Unread 2|Archived 1'`)
	p.wait("focus moved to the item now in its place", `document.activeElement.dataset.kind === 'archive' && document.activeElement.closest('li').querySelector('.title').textContent === 'Disk almost full'`)

	// The keyboard: the selected tab is the tab stop, arrows move and select.
	p.do("focus the tabs", chromedp.Focus(chromedp.CSS(`#tab-all`)))
	focused := `document.activeElement.id + ' ' + document.activeElement.getAttribute('aria-selected') + ' ' + document.activeElement.getAttribute('aria-controls') + ' ' + !document.getElementById(document.activeElement.getAttribute('aria-controls')).hidden`
	for _, step := range []struct{ key, want string }{
		{kb.ArrowRight, "tab-unread true panel-unread true"},
		{kb.ArrowRight, "tab-archived true panel-archived true"},
		{kb.ArrowRight, "tab-all true panel-all true"},
		{kb.ArrowLeft, "tab-archived true panel-archived true"},
		{kb.Home, "tab-all true panel-all true"},
		{kb.End, "tab-archived true panel-archived true"},
	} {
		p.do("press "+step.key, chromedp.KeyEvent(step.key))
		p.wait("focus on "+step.want, focused+` === '`+step.want+`'`)
	}
	p.wait("one tab stop", `[...document.querySelectorAll('[role=tab]')].map(t => t.tabIndex).join() === '-1,-1,0'`)
	p.wait("the archived one in Archived", shownOf+`('feed-archived') === 'Nightly backup done*'`)
	p.shot("light-archived")
	p.do("back to Unread", chromedp.KeyEvent(kb.ArrowLeft))
	p.wait("Unread's list", shownOf+`('feed-unread') === 'Deploy 41 finished*|Disk almost full*'`)
	p.do("unarchive from Archived", chromedp.Click(chromedp.CSS(`#tab-archived`)), chromedp.Click(chromedp.CSS(`#feed-archived li button[data-kind=archive]`)))
	p.wait("Archived empty, and says so", `document.querySelectorAll('#feed-archived li').length === 0 && !document.getElementById('empty-archived').hidden`)
	p.wait("back in Unread, at its place", shownOf+`('feed-unread') === 'Deploy 41 finished*|Disk almost full*|Nightly backup done*' && `+tabsShown+` === 'All|Unread 3|Archived*'`)
	p.shot("light-archived-empty")

	// The bell: opening it shows the latest and counts them seen, here and in the API.
	p.do("open the bell", chromedp.Click(chromedp.CSS(`#bell`)))
	p.wait("the popover with the latest", `!document.getElementById('bell-popover').hidden && document.getElementById('bell').getAttribute('aria-expanded') === 'true' && `+titlesOf+`('bell-list').join('|') === 'Deploy 41 finished|Disk almost full|Nightly backup done'`)
	p.wait("nothing new left", `document.getElementById('bell-count').hidden && document.getElementById('bell').getAttribute('aria-label') === 'Notifications'`)
	p.shot("light-bell")
	var counts struct{ Unseen struct{ Count int } }
	deadline := time.Now().Add(10 * time.Second)
	for s.api("u1", http.MethodGet, "/v1/notifications/counts", &counts); counts.Unseen.Count != 0; s.api("u1", http.MethodGet, "/v1/notifications/counts", &counts) {
		if time.Now().After(deadline) {
			t.Fatalf("unseen is %d after the bell was opened; want 0", counts.Unseen.Count)
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.do("close it with Escape", chromedp.KeyEvent(kb.Escape))
	p.wait("closed, focus back on the bell", `document.getElementById('bell-popover').hidden && document.activeElement.id === 'bell'`)

	// A new arrival: at the top of All and Unread, said in the live region, new on the bell.
	s.postIn("u1", "k2", "Deploy 42 finished", "builds")
	p.do("to All", chromedp.Click(chromedp.CSS(`#tab-all`)))
	p.wait("the arrival", titlesOf+`('feed')[0] === 'Deploy 42 finished' && document.getElementById('announcer').textContent === 'New notification: Deploy 42 finished'`)
	p.wait("one new on the bell", `document.getElementById('bell-count').textContent === '1'`)

	// Mark all read, archive all.
	p.do("mark all read", chromedp.Click(chromedp.CSS(`#read-all`)))
	p.wait("nothing unread", `document.querySelectorAll('#feed li.unread').length === 0 && `+tabsShown+` === 'All*|Unread|Archived' && !document.getElementById('empty-unread').hidden`)
	p.do("archive all", chromedp.Click(chromedp.CSS(`#archive-all`)))
	p.wait("All empty, and says so", `document.querySelectorAll('#feed li').length === 0 && !document.getElementById('empty').hidden && `+tabsShown+` === 'All*|Unread|Archived 4'`)
	p.shot("light-empty")
	p.step = "done"
}

// An archive in one tab of the browser disappears from another tab's list
// live, and the other's counts follow; a read there, an unarchive here,
// come back the same way. Two pages of the same user, each its own stream.
func TestAnArchiveInOneTabDisappearsFromAnothersListLive(t *testing.T) {
	s := startStack(t)
	for i := 1; i <= 3; i++ {
		s.postIn("u1", fmt.Sprintf("k%d", i), fmt.Sprintf("Build %d", i), "builds")
	}
	a := openBrowser(t)
	b := a.another()
	openInbox(t, a, "http://"+s.addr, "u1", s)
	openInbox(t, b, "http://"+s.addr, "u1", s)
	for _, p := range []*page{a, b} {
		p.wait("the three", shownOf+`('feed') === 'Build 3*|Build 2*|Build 1*' && `+tabsShown+` === 'All*|Unread 3|Archived'`)
	}
	b.do("open Archived in b", chromedp.Click(chromedp.CSS(`#tab-archived`)))
	b.wait("Archived empty in b", `!document.getElementById('empty-archived').hidden`)

	a.do("archive Build 2 in a", chromedp.Click(chromedp.CSS(`#feed li:nth-child(2) button[data-kind=archive]`)))
	a.wait("gone at once in a", shownOf+`('feed') === 'Build 3*|Build 1*'`)
	b.wait("in b's Archived, live", shownOf+`('feed-archived') === 'Build 2*' && document.getElementById('empty-archived').hidden`)
	b.wait("b's counts follow", tabsShown+` === 'All|Unread 2|Archived 1*'`)
	b.do("back to All in b", chromedp.Click(chromedp.CSS(`#tab-all`)))
	b.wait("gone from b's All", shownOf+`('feed') === 'Build 3*|Build 1*'`)
	a.shot("a-after-archiving")
	b.shot("b-seeing-it-leave")

	b.do("read Build 3 in b", chromedp.Click(chromedp.CSS(`#feed li:first-child`)))
	a.wait("read in a", shownOf+`('feed') === 'Build 3|Build 1*' && `+tabsShown+` === 'All*|Unread 1|Archived 1'`)
	a.do("unarchive Build 2 in a", chromedp.Click(chromedp.CSS(`#tab-archived`)), chromedp.Click(chromedp.CSS(`#feed-archived li button[data-kind=archive]`)))
	b.wait("back in b's All at its place", shownOf+`('feed') === 'Build 3|Build 2*|Build 1*' && `+tabsShown+` === 'All*|Unread 2|Archived'`)
	b.step, a.step = "done", "done"
}

// Dark mode follows the system (prefers-color-scheme), every color from
// the same variables: the page, an item, a label and the popover are dark,
// their text light; light is the default.
func TestTheInboxIsDarkWhenTheSystemIs(t *testing.T) {
	s := startStack(t)
	s.postIn("u1", "k1", "Deploy finished", "builds")
	p := openBrowser(t)
	colors := `[getComputedStyle(document.body).backgroundColor, getComputedStyle(document.body).color, getComputedStyle(document.querySelector('#feed li')).backgroundColor, getComputedStyle(document.querySelector('#feed .label')).color].join(' / ')`
	openInbox(t, p, "http://"+s.addr, "u1", s)
	p.wait("the item", `document.querySelectorAll('#feed li').length === 1`)
	if got, want := p.eval(colors), "rgb(245, 245, 247) / rgb(29, 29, 31) / rgb(255, 255, 255) / rgb(26, 79, 153)"; got != want {
		t.Errorf("light: %s; want %s", got, want)
	}
	p.step = "dark"
	if _, err := chromedp.Call(p.ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}}); err != nil {
		t.Fatal(err)
	}
	p.wait("dark colors", colors+` === 'rgb(28, 28, 30) / rgb(242, 242, 247) / rgb(44, 44, 46) / rgb(169, 205, 255)'`)
	p.shot("dark-all")
	p.do("open the bell", chromedp.Click(chromedp.CSS(`#bell`)))
	p.wait("a dark popover", `getComputedStyle(document.getElementById('bell-popover')).backgroundColor === 'rgb(44, 44, 46)'`)
	p.shot("dark-bell")
	p.do("close it", chromedp.KeyEvent(kb.Escape))
	p.do("open the preferences", chromedp.Click(chromedp.CSS(`#prefs-open`)))
	p.wait("a dark panel", `document.getElementById('prefs').open && getComputedStyle(document.getElementById('prefs')).backgroundColor === 'rgb(44, 44, 46)' && !document.getElementById('prefs-form').hidden`)
	p.shot("dark-preferences")
	p.step = "done"
}

// The preferences panel reads and writes /v1/preferences: a category
// turned off and quiet hours in a time zone are what the API then has; a
// window the server refuses says why; focus goes into the panel and back.
func TestThePreferencesPanelKeepsCategoriesAndQuietHours(t *testing.T) {
	s := startStack(t)
	s.postIn("u1", "k1", "Deploy finished", "builds")
	s.postIn("u1", "k2", "New follower", "social")
	p := openBrowser(t)
	openInbox(t, p, "http://"+s.addr, "u1", s)
	p.wait("the items", `document.querySelectorAll('#feed li').length === 2`)
	p.do("open the preferences", chromedp.Click(chromedp.CSS(`#prefs-open`)))
	p.wait("the categories shown, on", `[...document.querySelectorAll('#prefs-categories input')].map(i => i.dataset.category + ':' + i.checked).join() === 'builds:true,social:true' && document.activeElement === document.querySelector('#prefs-categories input')`)
	p.wait("no quiet hours, the browser's zone offered", `!document.getElementById('quiet-on').checked && document.getElementById('quiet-start').disabled && document.getElementById('quiet-zone').value === Intl.DateTimeFormat().resolvedOptions().timeZone`)
	p.shot("light-preferences")
	p.do("social off, quiet hours on", chromedp.Click(chromedp.CSS(`#prefs-categories input[data-category=social]`)), chromedp.Click(chromedp.CSS(`#quiet-on`)))
	p.do("set the window", chromedp.Evaluate[chromedp.Void](`(() => {
		document.getElementById('quiet-start').value = '22:30';
		document.getElementById('quiet-end').value = '06:45';
		document.getElementById('quiet-zone').value = 'Europe/Berlin';
	})()`))
	p.do("save", chromedp.Click(chromedp.CSS(`#prefs-save`)))
	p.wait("saved", `document.getElementById('prefs-message').textContent === 'Saved.'`)
	var prefs struct {
		Categories map[string]struct{ Push bool } `json:"categories"`
		QuietHours *struct {
			Start, End string
			TimeZone   string `json:"time_zone"`
		} `json:"quiet_hours"`
	}
	s.api("u1", http.MethodGet, "/v1/preferences", &prefs)
	if c := prefs.Categories; len(c) != 2 || !c["builds"].Push || c["social"].Push || prefs.QuietHours == nil ||
		*prefs.QuietHours != (struct {
			Start, End string
			TimeZone   string `json:"time_zone"`
		}{"22:30", "06:45", "Europe/Berlin"}) {
		t.Errorf("the API has %+v %+v", prefs.Categories, prefs.QuietHours)
	}
	p.do("a window the server refuses", chromedp.Evaluate[chromedp.Void](`document.getElementById('quiet-end').value = '22:30'`), chromedp.Click(chromedp.CSS(`#prefs-save`)))
	p.wait("the refusal, said", `document.getElementById('prefs-message').textContent.startsWith('Not saved: ') && document.getElementById('prefs-message').classList.contains('error')`)
	p.do("close", chromedp.KeyEvent(kb.Escape))
	p.wait("closed, focus back", `!document.getElementById('prefs').open && document.activeElement.id === 'prefs-open'`)
	p.do("open again", chromedp.Click(chromedp.CSS(`#prefs-open`)))
	p.wait("what was saved", `document.querySelector('#prefs-categories input[data-category=social]').checked === false && document.getElementById('quiet-on').checked && document.getElementById('quiet-start').value === '22:30' && document.getElementById('quiet-zone').value === 'Europe/Berlin'`)
	p.step = "done"
}

// A first page that comes fast shows no skeleton at all (nothing flashes);
// one that is slow shows skeletons after a moment, then the items, and an
// empty feed says so only once it is known to be empty.
func TestLoadingNeverFlashes(t *testing.T) {
	s := startStack(t)
	s.postIn("u1", "k1", "Deploy finished", "builds")
	// Records whether a skeleton or an empty state was ever on screen.
	const watch = `(() => {
		window.flashed = [];
		new MutationObserver(() => {
			for (const el of document.querySelectorAll('.skeletons, .empty')) if (!el.hidden && el.closest('[hidden]') === null && !window.flashed.includes(el.className)) window.flashed.push(el.className);
		}).observe(document, { subtree: true, childList: true, attributes: true, attributeFilter: ['hidden'] });
	})()`
	target, _ := url.Parse("http://" + s.addr)
	var slow time.Duration
	forward := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/notifications" {
			time.Sleep(slow)
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)

	p := openBrowser(t)
	if _, err := chromedp.Call(p.ctx, cdppage.AddScriptToEvaluateOnNewDocument, cdppage.AddScriptToEvaluateOnNewDocumentParams{Source: watch}); err != nil {
		t.Fatal(err)
	}
	openInbox(t, p, proxy.URL, "u1", s)
	p.wait("the item", `document.querySelectorAll('#feed li').length === 1`)
	// How long the first page took from the page's start: the skeletons wait 300 ms.
	took, _ := strconv.Atoi(p.eval(`Math.round(performance.getEntriesByType('resource').find(e => e.name.includes('/v1/notifications?')).responseEnd - performance.getEntriesByType('navigation')[0].domInteractive)`))
	switch flashed := p.eval(`window.flashed.join()`); {
	case strings.Contains(flashed, "empty"):
		t.Errorf("a feed with an item showed its empty state while loading (%q)", flashed)
	case flashed != "" && took < 250:
		t.Errorf("a first page in %d ms showed %q", took, flashed)
	case flashed != "":
		t.Logf("the first page took %d ms on this machine: skeletons were due", took)
	}

	slow = 1500 * time.Millisecond
	p.do("an empty feed, slow", chromedp.Navigate("about:blank"), chromedp.Navigate(proxy.URL+"/inbox#token="+s.iss.Token("u2")))
	p.wait("skeletons while it is slow", `!document.querySelector('#panel-all .skeletons').hidden && document.querySelectorAll('#panel-all .skeleton').length === 3 && document.getElementById('panel-all').getAttribute('aria-busy') === 'true'`)
	p.wait("hidden before the empty state shows", `document.getElementById('empty').hidden`)
	p.shot("light-loading")
	p.wait("then the empty state, and no skeleton", `!document.getElementById('empty').hidden && document.querySelector('#panel-all .skeletons').hidden && document.getElementById('panel-all').getAttribute('aria-busy') === 'false'`)
	p.step = "done"
}
