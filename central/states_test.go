package central_test

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// ingestAs ingests one event per key for user, all in one transaction
// through db (the pool, or a transaction a test holds open).
func ingestAs(t *testing.T, db ingest.DB, user string, keys ...string) {
	t.Helper()
	var items []ingest.Item
	for _, key := range keys {
		ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":%q,"type":"job.finished","category":"jobs","recipients":[%q],"title":%q}`, user+"/"+key, user, key), "")
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, ingest.Item{Producer: "jobs", Event: ev, ReceivedAt: time.Now()})
	}
	if _, err := ingest.Ingest(context.Background(), db, items); err != nil {
		t.Fatal(err)
	}
}

// inbox is a user's view of the API, by the titles of their notifications.
type inbox struct {
	h     *harness
	token string
	ids   map[string]string // title → id
}

// on returns the harness reporting to t (a subtest's).
func (h *harness) on(t *testing.T) *harness {
	out := *h
	out.t = t
	return &out
}

func (h *harness) inbox(user string) *inbox {
	return &inbox{h: h, token: h.iss.Token(user), ids: map[string]string{}}
}

// tab pages through a tab (status) with pages of limit, following Link,
// and returns each page's titles, checking every item's shape.
func (b *inbox) tab(status string, limit int) [][]string {
	b.h.t.Helper()
	var pages [][]string
	path := fmt.Sprintf("/v1/notifications?status=%s&limit=%d", status, limit)
	for {
		r := b.h.request(http.MethodGet, path, b.token, "")
		if r.status != http.StatusOK {
			b.h.t.Fatalf("GET %s = %d %s", path, r.status, r.raw)
		}
		var page []string
		for _, n := range r.body["data"].([]any) {
			item := n.(map[string]any)
			title := item["title"].(string)
			b.ids[title] = item["id"].(string)
			page = append(page, title)
		}
		pages = append(pages, page)
		if r.body["has_more"] != true {
			return pages
		}
		m := regexp.MustCompile(`^<([^>]+)>; rel="next"$`).FindStringSubmatch(r.header.Get("Link"))
		if m == nil || status != "all" && !strings.Contains(m[1], "status="+status) {
			b.h.t.Fatalf("Link = %q; want the next page of status=%s", r.header.Get("Link"), status)
		}
		path = m[1]
	}
}

// items returns every notification of the user not archived and archived
// (the all and archived tabs), by title.
func (b *inbox) items() map[string]map[string]any {
	b.h.t.Helper()
	out := map[string]map[string]any{}
	for _, status := range []string{"all", "archived"} {
		path := "/v1/notifications?limit=100&status=" + status
		for {
			r := b.h.request(http.MethodGet, path, b.token, "")
			for _, n := range r.body["data"].([]any) {
				item := n.(map[string]any)
				title := item["title"].(string)
				b.ids[title] = item["id"].(string)
				out[title] = item
			}
			if r.body["has_more"] != true {
				break
			}
			path = "/v1/notifications?limit=100&status=" + status + "&cursor=" + r.body["next_cursor"].(string)
		}
	}
	return out
}

// do makes an operation: "read x", "unread x", "archive x", "unarchive x",
// "read-all", "archive-all".
func (b *inbox) do(op string) {
	b.h.t.Helper()
	verb, title, _ := strings.Cut(op, " ")
	path := "/v1/notifications/" + verb
	want := http.StatusOK
	if title != "" {
		if b.ids[title] == "" {
			b.items()
		}
		path = "/v1/notifications/" + b.ids[title] + "/" + verb
		want = http.StatusNoContent
	}
	if r := b.h.request(http.MethodPost, path, b.token, ""); r.status != want {
		b.h.t.Fatalf("%s: %d %s; want %d", op, r.status, r.raw, want)
	}
}

// counts returns the counts with archived.
func (b *inbox) counts() (unread, unseen, archived float64) {
	b.h.t.Helper()
	r := b.h.request(http.MethodGet, "/v1/notifications/counts?archived=true", b.token, "")
	if r.status != http.StatusOK {
		b.h.t.Fatalf("counts = %d %s", r.status, r.raw)
	}
	get := func(k string) float64 { return r.body[k].(map[string]any)["count"].(float64) }
	return get("unread"), get("unseen"), get("archived")
}

// flat joins pages.
func flat(pages [][]string) []string {
	var out []string
	for _, p := range pages {
		out = append(out, p...)
	}
	return out
}

// The states follow their changes in the order they were made, whether by
// item or by a watermark: a later change by item overrides the watermark
// that covered the item, a later watermark overrides the changes by item
// before it. Each case starts from five notifications a..e (e newest) and
// checks every item's read_at and archived_at, the three tabs and the
// counts.
func TestInboxStatesFollowTheOrderOfTheirChanges(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	for i, tc := range []struct {
		name     string
		ops      []string
		read     string // the titles read
		archived string // the titles archived
	}{
		{"nothing done: all unread, none archived", nil, "", ""},
		{"a mark read", []string{"read b"}, "b", ""},
		{"a mark read, then unread", []string{"read b", "unread b"}, "", ""},
		{"marks are idempotent", []string{"read b", "read b", "unread c", "archive d", "archive d", "unarchive e"}, "b", "d"},
		{"read-all reads everything", []string{"read-all"}, "abcde", ""},
		{"a mark unread after read-all overrides it for that one", []string{"read-all", "unread c"}, "abde", ""},
		{"a read-all after a mark unread reads it again", []string{"read-all", "unread c", "read-all"}, "abcde", ""},
		{"a mark read before read-all stays read after it", []string{"read a", "read-all", "unread a", "unread b"}, "cde", ""},
		{"a mark unread then read again after read-all", []string{"read-all", "unread c", "read c"}, "abcde", ""},
		{"an archive, then unarchive", []string{"archive a", "unarchive a"}, "", ""},
		{"archive-all archives everything", []string{"archive-all"}, "", "abcde"},
		{"an unarchive after archive-all overrides it for that one", []string{"archive-all", "unarchive b"}, "", "acde"},
		{"an archive-all after an unarchive archives it again", []string{"archive-all", "unarchive b", "archive-all"}, "", "abcde"},
		{"an archive by item survives archive-all and goes with unarchive", []string{"archive a", "archive-all", "unarchive a"}, "", "bcde"},
		{"read and archived are apart", []string{"read-all", "unread d", "archive-all", "unarchive d", "unarchive e", "archive b"}, "abce", "abc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := h.on(t)
			user := fmt.Sprintf("u%d", i)
			ingestAs(t, h.pool, user, "a")
			ingestAs(t, h.pool, user, "b")
			ingestAs(t, h.pool, user, "c")
			ingestAs(t, h.pool, user, "d")
			ingestAs(t, h.pool, user, "e")
			b := h.inbox(user)
			for _, op := range tc.ops {
				b.do(op)
			}
			var all, unread, archived []string
			var wantUnread, wantArchived float64
			for _, title := range []string{"e", "d", "c", "b", "a"} { // feed order
				isRead, isArchived := strings.Contains(tc.read, title), strings.Contains(tc.archived, title)
				if isArchived {
					archived = append(archived, title)
					wantArchived++
				} else {
					all = append(all, title)
				}
				if !isRead && !isArchived {
					unread = append(unread, title)
					wantUnread++
				}
			}
			items := b.items()
			for title, item := range items {
				if got, want := item["read_at"] != nil, strings.Contains(tc.read, title); got != want {
					t.Errorf("%s: read_at %v; want read %v", title, item["read_at"], want)
				}
				if got, want := item["archived_at"] != nil, strings.Contains(tc.archived, title); got != want {
					t.Errorf("%s: archived_at %v; want archived %v", title, item["archived_at"], want)
				}
				if item["seen_at"] != nil {
					t.Errorf("%s: seen_at %v; nothing was seen", title, item["seen_at"])
				}
			}
			for status, want := range map[string][]string{"all": all, "unread": unread, "archived": archived} {
				if got := flat(b.tab(status, 2)); !slices.Equal(got, want) {
					t.Errorf("tab %s = %v; want %v", status, got, want)
				}
			}
			if got := flat(b.tab("unread", 20)); !slices.Equal(got, unread) {
				t.Errorf("unread=true... status=unread = %v; want %v", got, unread)
			}
			r := h.request(http.MethodGet, "/v1/notifications?unread=true&limit=100", b.token, "")
			if n := len(r.body["data"].([]any)); n != len(unread) {
				t.Errorf("unread=true holds %d; want the unread tab's %d", n, len(unread))
			}
			gotUnread, gotUnseen, gotArchived := b.counts()
			if gotUnread != wantUnread || gotArchived != wantArchived || gotUnseen != float64(len(all)) {
				t.Errorf("counts unread %v, unseen %v, archived %v; want %v, %v, %v", gotUnread, gotUnseen, gotArchived, wantUnread, len(all), wantArchived)
			}
			r = h.request(http.MethodGet, "/v1/notifications/unread-count", b.token, "")
			if r.body["count"] != wantUnread {
				t.Errorf("unread-count %v; want %v", r.body["count"], wantUnread)
			}
		})
	}
}

// Each tab pages through its rows exactly, at any page size, across both
// watermarks and the changes by item made against them; a notification
// whose transaction began before a read-all and an archive-all and
// committed after them is unread and in the inbox, as the rules of
// read-all require.
func TestTabsPageExactlyAcrossWatermarksAndALateCommit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	ctx := context.Background()
	user := "tabs"
	var titles []string
	for i := range 12 {
		titles = append(titles, fmt.Sprintf("n%02d", i))
		ingestAs(t, h.pool, user, titles[i])
	}
	b := h.inbox(user)
	b.items()
	// Transactions held open across the watermarks: the late one.
	open, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	ingestAs(t, open, user, "late")
	ingestAs(t, h.pool, user, "n12")
	b.do("read n11")
	b.do("read-all") // through n12
	b.do("unread n03")
	b.do("unread n07")
	b.do("archive n10")
	b.do("archive-all") // through n12, archived with the rest
	b.do("unarchive n07")
	b.do("unarchive n05")
	b.do("archive n05")   // archived by item again
	b.do("unarchive n02") // in the inbox, read
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ingestAs(t, h.pool, user, "n13", "n14") // after both watermarks
	b.do("archive n14")
	b.do("read n13")
	// Feed order: n14, n13 (one transaction, newest id first), n12, then
	// the late one (its transaction began before n12's), n11 … n00.
	want := map[string][]string{
		"all":      {"n13", "late", "n07", "n02"},
		"unread":   {"late", "n07"},
		"archived": {"n14", "n12", "n11", "n10", "n09", "n08", "n06", "n05", "n04", "n03", "n01", "n00"},
	}
	for status, titles := range want {
		for _, limit := range []int{1, 2, 3, 100} {
			pages := b.tab(status, limit)
			if got := flat(pages); !slices.Equal(got, titles) {
				t.Errorf("tab %s by %d = %v; want %v", status, limit, pages, titles)
			}
			for i, p := range pages {
				if len(p) != limit && i < len(pages)-1 || len(p) > limit {
					t.Errorf("tab %s by %d: page %d holds %d", status, limit, i, len(p))
				}
			}
		}
	}
	items := b.items()
	if items["late"]["read_at"] != nil || items["late"]["archived_at"] != nil {
		t.Errorf("the late one: read_at %v, archived_at %v; want neither", items["late"]["read_at"], items["late"]["archived_at"])
	}
	if unread, unseen, archived := b.counts(); unread != 2 || unseen != 4 || archived != 12 {
		t.Errorf("counts unread %v, unseen %v, archived %v; want 2, 4, 12", unread, unseen, archived)
	}
}

// Counts are exact below the cap and capped above it, tab by tab, with
// archived only when asked for; read-all and archive-all take what they
// cover out of them at once.
func TestCountsAreExactAndCapped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	user := "counter"
	var keys []string
	for i := range 130 {
		keys = append(keys, fmt.Sprintf("k%03d", i))
	}
	ingestAs(t, h.pool, user, keys...)
	b := h.inbox(user)
	count := func(r response, k string) (float64, bool) {
		c := r.body[k].(map[string]any)
		return c["count"].(float64), c["capped"].(bool)
	}
	r := h.request(http.MethodGet, "/v1/notifications/counts", b.token, "")
	if _, ok := r.body["archived"]; ok {
		t.Errorf("archived counted unasked: %s", r.raw)
	}
	for _, k := range []string{"unread", "unseen"} {
		if n, capped := count(r, k); n != 100 || !capped {
			t.Errorf("%s = %v capped %v; want 100 capped", k, n, capped)
		}
	}
	b.do("read-all")
	b.items()
	for _, k := range keys[:7] {
		b.do("unread " + k)
	}
	b.do("archive k000")
	for _, k := range keys[100:] {
		b.do("archive " + k)
	}
	r = h.request(http.MethodGet, "/v1/notifications/counts?archived=true", b.token, "")
	if n, capped := count(r, "unread"); n != 6 || capped {
		t.Errorf("unread = %v capped %v; want 6 (seven marked unread, one of them archived)", n, capped)
	}
	if n, capped := count(r, "archived"); n != 31 || capped {
		t.Errorf("archived = %v capped %v; want 31", n, capped)
	}
	if n, capped := count(r, "unseen"); n != 99 || capped {
		t.Errorf("unseen = %v capped %v; want the 99 not archived", n, capped)
	}
	b.do("archive-all")
	r = h.request(http.MethodGet, "/v1/notifications/counts?archived=true", b.token, "")
	if n, _ := count(r, "unread"); n != 0 {
		t.Errorf("unread after archive-all = %v; want 0", n)
	}
	if n, capped := count(r, "archived"); n != 100 || !capped {
		t.Errorf("archived after archive-all = %v capped %v; want 100 capped", n, capped)
	}
	if n, capped := count(r, "unseen"); n != 0 || capped {
		t.Errorf("unseen after archive-all = %v capped %v; want 0", n, capped)
	}
	if r := h.request(http.MethodGet, "/v1/notifications/counts?archived=maybe", b.token, ""); r.status != http.StatusBadRequest {
		t.Errorf("archived=maybe = %d; want 400", r.status)
	}
}

// The tabs' parameters are checked: an unknown status, and unread=true
// beside another status, are 400; since takes neither.
func TestBadStatusesAre400(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	token := h.iss.Token("alice")
	for _, q := range []string{"status=deleted", "status=", "status=unread&unread=false", "status=archived&unread=true", "status=all&since=AQAAAAAAAAAAAAAAAAAAAAEABjwzmwZAAA"} {
		if r := h.request(http.MethodGet, "/v1/notifications?"+q, token, ""); r.status != http.StatusBadRequest {
			t.Errorf("?%s = %d; want 400", q, r.status)
		}
	}
	for _, q := range []string{"status=all", "status=unread&unread=true", "unread=false"} {
		if r := h.request(http.MethodGet, "/v1/notifications?"+q, token, ""); r.status != http.StatusOK {
			t.Errorf("?%s = %d %s; want 200", q, r.status, r.raw)
		}
	}
	if r := h.request(http.MethodPost, "/v1/notifications/AAAAAAAAAAAAAAAAAAAAAQ/archive", token, ""); r.status != http.StatusNotFound {
		t.Errorf("archiving what is not there = %d; want 404", r.status)
	}
}
