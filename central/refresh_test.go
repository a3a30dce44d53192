package central_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

// titles lists a page's titles in order.
func titles(r response) []string {
	var out []string
	for _, it := range r.body["data"].([]any) {
		out = append(out, it.(map[string]any)["title"].(string))
	}
	return out
}

func ingestTitled(t *testing.T, db ingest.DB, user string, titles ...string) {
	t.Helper()
	var items []ingest.Item
	for _, title := range titles {
		ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":%q,"type":"t","recipients":[%q],"title":%q}`, title, user, title), "")
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, ingest.Item{Producer: "p", Event: ev})
	}
	if _, err := ingest.Ingest(context.Background(), db, items); err != nil {
		t.Fatal(err)
	}
}

func TestPullToRefreshReturnsOnlyWhatIsNewInCommitOrder(t *testing.T) {
	// Not parallel: a transaction left open anywhere in the cluster (another
	// test's on purpose) holds back what since may return, and this test
	// counts exactly what each answer holds.
	h := newHarness(t, options{})
	token := h.iss.Token("alice")
	ingestTitled(t, h.pool, "alice", "a", "b")
	first := h.request(http.MethodGet, "/v1/notifications", token, "")
	refresh, _ := first.body["refresh_cursor"].(string)
	if first.status != 200 || refresh == "" || !slices.Equal(titles(first), []string{"b", "a"}) {
		t.Fatalf("first page %d %s", first.status, first.raw)
	}
	since := func(cursor string, extra string) response {
		t.Helper()
		r := h.request(http.MethodGet, "/v1/notifications?since="+cursor+extra, token, "")
		if r.status != 200 {
			t.Fatalf("since: %d %s", r.status, r.raw)
		}
		return r
	}
	if r := since(refresh, ""); len(titles(r)) != 0 || r.body["has_more"] != false {
		t.Errorf("nothing new: %s", r.raw)
	}

	ingestTitled(t, h.pool, "alice", "c")
	ingestTitled(t, h.pool, "bob", "not alice's")
	ingestTitled(t, h.pool, "alice", "d", "e")
	r := since(refresh, "&limit=2")
	if got := titles(r); !slices.Equal(got, []string{"c", "d"}) || r.body["has_more"] != true || !strings.Contains(r.header.Get("Link"), `rel="next"`) {
		t.Fatalf("since, limit 2: %v has_more=%v Link=%q", got, r.body["has_more"], r.header.Get("Link"))
	}
	r = since(r.body["refresh_cursor"].(string), "&limit=2")
	if got := titles(r); !slices.Equal(got, []string{"e"}) || r.body["has_more"] != false {
		t.Fatalf("the rest: %v", got)
	}
	refresh = r.body["refresh_cursor"].(string)

	// A transaction that began first but commits last is not skipped.
	ctx := context.Background()
	late, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(ctx)
	ingestTitled(t, late, "alice", "late")
	ingestTitled(t, h.pool, "alice", "early")
	r = since(refresh, "")
	if got := titles(r); len(got) != 0 {
		t.Fatalf("while an older transaction is open: %v, want nothing yet", got)
	}
	refresh = r.body["refresh_cursor"].(string)
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := titles(since(refresh, "")); !slices.Equal(got, []string{"late", "early"}) {
		t.Errorf("after it commits: %v, want late then early", got)
	}
}

func TestPullToRefreshRefusesWhatItCannotMean(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	token := h.iss.Token("alice")
	first := h.request(http.MethodGet, "/v1/notifications", token, "")
	refresh := first.body["refresh_cursor"].(string)
	for _, q := range []string{"since=garbage", "since=" + refresh + "&unread=true", "since=" + refresh + "&limit=0"} {
		if r := h.request(http.MethodGet, "/v1/notifications?"+q, token, ""); r.status != 400 {
			t.Errorf("%s: %d %s, want 400", q, r.status, r.raw)
		}
	}
	// Another user's cursor shows only the caller's own rows.
	ingestTitled(t, h.pool, "bob", "bob's")
	if r := h.request(http.MethodGet, "/v1/notifications?since="+refresh, token, ""); len(titles(r)) != 0 {
		t.Errorf("alice sees %v", titles(r))
	}
}
