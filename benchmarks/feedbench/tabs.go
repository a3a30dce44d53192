package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/feed"
)

// tabDepths are the depths each tab is read at, as far as it reaches.
var tabDepths = []int{0, 10_000, 100_000, 300_000}

// measureTabs reads the tabs (status=all, unread, archived) at depth through
// the handler, and the counts, after giving the measured user's rows their
// states by item: every third archived, every second read (so a third of
// the rows is in each of archived and unread, two thirds in all). Then, on
// top, a read-all and an archive-all with 1,000 rows each marked unread
// and unarchived after them: the tabs beneath the watermarks read only the
// rows changed back.
func measureTabs(ctx context.Context, pool *pgxpool.Pool, api http.Handler, token string, iterations int) error {
	start := time.Now()
	for _, q := range []string{
		`UPDATE notifications SET archived_at = created_at + interval '1 hour' WHERE user_id = 'deep' AND id % 3 = 0`,
		`UPDATE notifications SET read_at = created_at + interval '1 hour' WHERE user_id = 'deep' AND id % 2 = 0`,
		`VACUUM ANALYZE notifications`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	fmt.Printf("\nstates by item set in %s\n\n", time.Since(start).Round(time.Second))
	fmt.Println("| states | tab | depth | handler p50 | handler p99 | vs depth 0 |")
	fmt.Println("|---|---|---:|---:|---:|---:|")
	if err := readTabs(ctx, pool, api, token, "by item", iterations); err != nil {
		return err
	}
	if err := countsLatency(api, token, "by item", iterations); err != nil {
		return err
	}

	store := feed.NewStore(pool, nil)
	if _, _, err := store.MarkAllRead(ctx, "deep"); err != nil {
		return err
	}
	if _, _, err := store.MarkAllArchived(ctx, "deep"); err != nil {
		return err
	}
	// 1,000 rows spread over the whole depth, changed back by item.
	rows, err := pool.Query(ctx, `SELECT created_at, id FROM notifications WHERE user_id = 'deep' AND id % 1000 = 7 ORDER BY created_at DESC, id DESC`)
	if err != nil {
		return err
	}
	var back []feed.ID
	for rows.Next() {
		var id feed.ID
		if err := rows.Scan(&id.CreatedAt, &id.Seq); err != nil {
			return err
		}
		back = append(back, id)
	}
	rows.Close()
	for _, id := range back {
		if err := store.MarkUnread(ctx, "deep", id); err != nil {
			return err
		}
		if err := store.Unarchive(ctx, "deep", id); err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE notifications`); err != nil {
		return err
	}
	if err := readTabs(ctx, pool, api, token, fmt.Sprintf("watermarks, %d changed back", len(back)), iterations); err != nil {
		return err
	}
	return countsLatency(api, token, "watermarks", iterations)
}

// readTabs reads a page of 20 of each tab at each depth it reaches.
func readTabs(ctx context.Context, pool *pgxpool.Pool, api http.Handler, token, states string, iterations int) error {
	for _, status := range []string{"all", "unread", "archived"} {
		var base time.Duration
		for _, depth := range tabDepths {
			cursor, ok, err := tabCursor(api, token, status, depth)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			path := "/v1/notifications?limit=20&status=" + status
			if cursor != "" {
				path += "&cursor=" + cursor
			}
			p50, p99, err := timeHandler(api, token, path, iterations, 20)
			if err != nil {
				return fmt.Errorf("%s at %d: %w", status, depth, err)
			}
			if depth == 0 {
				base = p50
			}
			fmt.Printf("| %s | %s | %d | %s | %s | %.2f× |\n", states, status, depth, p50.Round(time.Microsecond), p99.Round(time.Microsecond), float64(p50)/float64(base))
		}
	}
	return nil
}

// tabCursor walks a tab's pages of 1,000 to depth and returns the cursor
// there; ok is false when the tab holds fewer rows than depth + 20.
func tabCursor(api http.Handler, token, status string, depth int) (cursor string, ok bool, err error) {
	for walked := 0; walked < depth; walked += 100 {
		path := "/v1/notifications?limit=100&status=" + status
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		var page struct {
			Data       []json.RawMessage `json:"data"`
			NextCursor *string           `json:"next_cursor"`
		}
		if err := getJSON(api, token, path, &page); err != nil {
			return "", false, err
		}
		if page.NextCursor == nil || len(page.Data) < 100 {
			return "", false, nil
		}
		cursor = *page.NextCursor
	}
	return cursor, true, nil
}

func getJSON(api http.Handler, token, path string, into any) error {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	w := httptest.NewRecorder()
	api.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		return fmt.Errorf("%s: %d %s", path, w.Code, w.Body.String())
	}
	return json.Unmarshal(w.Body.Bytes(), into)
}

// timeHandler serves path iterations times after a tenth as warm-up, each
// answer holding want items (0: any), and returns the p50 and p99.
func timeHandler(api http.Handler, token, path string, iterations, want int) (p50, p99 time.Duration, err error) {
	took := make([]time.Duration, 0, iterations)
	for i := range iterations + iterations/10 {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		t0 := time.Now()
		api.ServeHTTP(w, req)
		d := time.Since(t0)
		if w.Code != http.StatusOK {
			return 0, 0, fmt.Errorf("%d %s", w.Code, w.Body.String())
		}
		if want > 0 {
			var page struct {
				Data []json.RawMessage `json:"data"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil || len(page.Data) != want {
				return 0, 0, fmt.Errorf("%d items, want %d: %v", len(page.Data), want, err)
			}
		}
		if i >= iterations/10 {
			took = append(took, d)
		}
	}
	slices.Sort(took)
	return took[len(took)/2], took[len(took)*99/100], nil
}

// countsLatency times GET /v1/notifications/counts?archived=true.
func countsLatency(api http.Handler, token, states string, iterations int) error {
	var c map[string]struct {
		Count  int  `json:"count"`
		Capped bool `json:"capped"`
	}
	if err := getJSON(api, token, "/v1/notifications/counts?archived=true", &c); err != nil {
		return err
	}
	p50, p99, err := timeHandler(api, token, "/v1/notifications/counts?archived=true", iterations, 0)
	if err != nil {
		return err
	}
	fmt.Printf("| %s | counts (unread %d%s, unseen %d%s, archived %d%s) | | %s | %s | |\n", states,
		c["unread"].Count, plus(c["unread"].Capped), c["unseen"].Count, plus(c["unseen"].Capped), c["archived"].Count, plus(c["archived"].Capped),
		p50.Round(time.Microsecond), p99.Round(time.Microsecond))
	return nil
}

func plus(capped bool) string {
	if capped {
		return "+"
	}
	return ""
}
