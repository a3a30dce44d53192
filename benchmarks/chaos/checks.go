package main

// What must hold after the run, each checked against Postgres, the apps'
// views, the fake Expo and the processes, with the counts behind it.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/feed"
)

// invariant is one row of the final table.
type invariant struct {
	name   string
	ok     bool
	counts string
}

// checkEvents: every event answered 2xx is stored exactly once per
// recipient, none answered 4xx is, and nothing is stored that no producer
// sent.
func checkEvents(ctx context.Context, db *pgx.Conn, l *ledger, stopped map[string]bool) ([]invariant, error) {
	rows, err := db.Query(ctx, `SELECT idempotency_key, user_id, count(*) FROM notifications WHERE producer = 'chaos' GROUP BY 1, 2`)
	if err != nil {
		return nil, err
	}
	stored := map[string]int{}
	for rows.Next() {
		var key, user string
		var n int
		if err := rows.Scan(&key, &user, &n); err != nil {
			return nil, err
		}
		stored[key+"\x00"+user] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var accepted, promised, missing, doubled, rejected, rejectedStored, unanswered, unansweredStored, unknown, cancelled int
	known := map[string]bool{}
	l.mu.Lock()
	for key, s := range l.events {
		if stopped[key] {
			cancelled++
		}
		for _, u := range s.recipients {
			known[key+"\x00"+u] = true
			n := stored[key+"\x00"+u]
			switch {
			case s.accepted && stopped[key]:
				// stopped whole by its cancel: checkCancels judges it
			case s.accepted:
				promised++
				if n == 0 {
					missing++
				}
				if n > 1 {
					doubled++
				}
			case s.rejected:
				if n > 0 {
					rejectedStored++
				}
			default:
				if n > 0 {
					unansweredStored++
				}
				if n > 1 {
					doubled++
				}
			}
		}
		switch {
		case s.accepted:
			accepted++
		case s.rejected:
			rejected++
		default:
			unanswered++
		}
	}
	l.mu.Unlock()
	for k := range stored {
		if !known[k] {
			unknown++
		}
	}
	return []invariant{
		{"every event answered 2xx is stored for each recipient", missing == 0,
			fmt.Sprintf("%d events, %d notifications promised; %d missing; %d more events stopped by their cancel", accepted-cancelled, promised, missing, cancelled)},
		{"no notification is stored twice", doubled == 0, fmt.Sprintf("%d stored twice or more", doubled)},
		{"no event answered 4xx is stored", rejectedStored == 0, fmt.Sprintf("%d rejected; %d of their notifications stored", rejected, rejectedStored)},
		{"nothing is stored that no producer sent", unknown == 0,
			fmt.Sprintf("%d stored in all; %d unknown; %d events unanswered when producers stopped (%d of their notifications stored, which is allowed)",
				len(stored), unknown, unanswered, unansweredStored)},
	}, nil
}

// expectedFeeds reads each app user's notification ids from Postgres.
func expectedFeeds(ctx context.Context, db *pgx.Conn) (map[string]map[string]bool, error) {
	rows, err := db.Query(ctx, `SELECT user_id, created_at, id FROM notifications WHERE user_id LIKE 'app-%'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]map[string]bool{}
	for rows.Next() {
		var user string
		var id feed.ID
		if err := rows.Scan(&user, &id.CreatedAt, &id.Seq); err != nil {
			return nil, err
		}
		if out[user] == nil {
			out[user] = map[string]bool{}
		}
		out[user][id.String()] = true
	}
	return out, rows.Err()
}

// checkApps: every app saw every notification of its user exactly once,
// in commit order within a socket.
func checkApps(apps []*app, expected map[string]map[string]bool, loss *lossWindow) []invariant {
	var want, missing, phantom, lost, twice, disorder, resumes, refusals, reloaded int
	var examples []string
	for _, a := range apps {
		a.mu.Lock()
		exp := expected[a.user]
		want += len(exp)
		for id := range exp {
			if a.frames[id] == 0 && !a.loaded[id] {
				missing++
				if len(examples) < 3 {
					examples = append(examples, a.user+" "+id)
				}
				if missing == 1 {
					fmt.Printf("chaos: %s never saw %s; its sockets: %s\n", a.user, id, strings.Join(a.sessions, " "))
				}
			}
		}
		for id, n := range a.frames {
			if !exp[id] {
				if fid, err := feed.ParseID(id); err == nil && loss.holds(fid.CreatedAt) {
					lost++ // committed, sent, then lost in the asynchronous failover
				} else {
					phantom++
				}
			}
			if n > 1 {
				twice++
			}
		}
		disorder += a.disorder
		resumes += a.resumes
		refusals += a.refusals
		reloaded += len(a.loaded)
		a.mu.Unlock()
	}
	return []invariant{
		{"every app saw every notification of its user", missing == 0 && phantom == 0,
			fmt.Sprintf("%d notifications of %d apps; %d never seen %s, %d seen that Postgres does not hold (and %d more the asynchronous failover lost, allowed); %d resumes with a cursor, %d cursors refused (%d ids reloaded from the feed)",
				want, len(apps), missing, strings.Join(examples, ", "), phantom, lost, resumes, refusals, reloaded)},
		{"no app saw a notification twice (before any dedupe)", twice == 0, fmt.Sprintf("%d notifications with more than one frame", twice)},
		{"frames came in commit order within each socket", disorder == 0, fmt.Sprintf("%d frames behind the one before", disorder)},
	}
}

// checkReadState: the feed, the unread count and what the sockets saw
// agree on what is read.
func checkReadState(ctx context.Context, apps []*app, base string, loss *lossWindow) ([]invariant, error) {
	var compared, disagree, countOff, refreshed, lost int
	var examples []string
	for _, a := range apps {
		f, err := a.wholeFeed(ctx, base)
		if err != nil {
			return nil, err
		}
		status, raw := a.call(ctx, http.MethodGet, base+"/v1/notifications/unread-count", "")
		if status != http.StatusOK {
			return nil, fmt.Errorf("unread count of %s: %d %s", a.user, status, raw)
		}
		var count struct {
			Count  int  `json:"count"`
			Capped bool `json:"capped"`
		}
		if err := json.Unmarshal(raw, &count); err != nil {
			return nil, err
		}
		unread := 0
		for _, read := range f {
			if !read {
				unread++
			}
		}
		if want := min(unread, 100); count.Count != want || count.Capped != (unread > 100) {
			countOff++
			examples = append(examples, fmt.Sprintf("%s: count %d capped %v, feed %d unread", a.user, count.Count, count.Capped, unread))
		}
		a.mu.Lock()
		refreshed += a.refreshedReads
		for id, read := range a.read {
			feedRead, ok := f[id]
			if !ok {
				continue
			}
			compared++
			if read && !feedRead && loss.holds(a.readFrameAt[id]) {
				lost++ // its read, sent on the stream, was lost in the asynchronous failover
				continue
			}
			if read != feedRead {
				disagree++
				if len(examples) < 5 {
					examples = append(examples, fmt.Sprintf("%s %s: socket read=%v, feed read=%v", a.user, id, read, feedRead))
				}
			}
		}
		a.mu.Unlock()
	}
	return []invariant{{"the feed, the unread count and the sockets agree on read state", disagree == 0 && countOff == 0,
		fmt.Sprintf("%d notifications compared; %d disagree; %d reads lost in the asynchronous failover (allowed); %d unread counts off; %d found read first by the refresh after a resume (read frames are live only) %s",
			compared, disagree, lost, countOff, refreshed, strings.Join(examples, "; "))}}, nil
}

// shorten cuts s to n bytes at most.
func shorten(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// checkCancels: a cancel stops all of an event's recipients or none, and
// central's answer (200 cancelled, 409 already sent) says which. It returns
// the events their cancel stopped.
func checkCancels(ctx context.Context, db *pgx.Conn, l *ledger, loss *lossWindow) (map[string]bool, []invariant, error) {
	l.mu.Lock()
	keys := make([]string, 0, len(l.cancels))
	for k := range l.cancels {
		keys = append(keys, k)
	}
	l.mu.Unlock()
	counts := func(query string) (map[string]int, error) {
		rows, err := db.Query(ctx, query, keys)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		m := map[string]int{}
		for rows.Next() {
			var k string
			var n int
			if err := rows.Scan(&k, &n); err != nil {
				return nil, err
			}
			m[k] = n
		}
		return m, rows.Err()
	}
	stored, err := counts(`SELECT idempotency_key, count(*) FROM notifications WHERE producer = 'chaos' AND idempotency_key = ANY($1) GROUP BY 1`)
	if err != nil {
		return nil, nil, err
	}
	// A recipient stopped by a cancel has a cancelled row in the delivery
	// log, named by its user and the event's send_at (the time of the
	// notification it would have been).
	rows, err := db.Query(ctx, `SELECT user_id, notification_created_at FROM push_dispatches WHERE state = 'cancelled'`)
	if err != nil {
		return nil, nil, err
	}
	stoppedAt := map[string][]time.Time{}
	for rows.Next() {
		var user string
		var at time.Time
		if err := rows.Scan(&user, &at); err != nil {
			return nil, nil, err
		}
		stoppedAt[user] = append(stoppedAt[user], at)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	cancelledOf := func(recipients []string, sendAt time.Time) int {
		n := 0
		for _, u := range recipients {
			for _, at := range stoppedAt[u] {
				if d := at.Sub(sendAt); d > -time.Microsecond && d < time.Microsecond { // Postgres keeps microseconds
					n++
					break
				}
			}
		}
		return n
	}
	stopped := map[string]bool{}
	var viaCentral, nStopped, nSent, split, disagree, exempt, unanswered int
	var examples []string
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, c := range l.cancels {
		r := len(l.events[k].recipients)
		n, kc := stored[k], cancelledOf(l.events[k].recipients, c.sendAt)
		allStopped, allSent := n == 0 && kc == r, n == r && kc == 0
		switch {
		case allStopped:
			nStopped++
			stopped[k] = true
		case allSent:
			nSent++
		default:
			split++
			if len(examples) < 3 {
				examples = append(examples, fmt.Sprintf("%s: %d recipients, %d stored, %d cancelled", k, r, n, kc))
			}
		}
		if !c.viaCentral {
			continue
		}
		viaCentral++
		agrees := true
		switch c.status {
		case http.StatusOK:
			agrees = allStopped
		case http.StatusConflict:
			agrees = allSent
		default:
			unanswered++
		}
		if !agrees {
			if loss.holds(c.answeredAt) {
				exempt++ // central's internal ingress has no spool: an answer the failover lost
				continue
			}
			disagree++
			if len(examples) < 3 {
				examples = append(examples, fmt.Sprintf("%s: answered %d (%d stopped) but %d stored, %d cancelled", k, c.status, c.stopped, n, kc))
			}
		}
	}
	return stopped, []invariant{{"a cancel stops all or none of an event's recipients, as central answers", split == 0 && disagree == 0,
		fmt.Sprintf("%d scheduled events cancelled (%d through central); %d stopped whole, %d sent whole; %d split; %d answers that disagree; %d lost in the asynchronous failover (allowed); %d without a final answer %s",
			len(keys), viaCentral, nStopped, nSent, split, disagree, exempt, unanswered, strings.Join(examples, "; "))}}, nil
}

// checkReuses: a key sent again with another body is refused (422) and
// nothing of that body is stored.
func checkReuses(ctx context.Context, db *pgx.Conn, l *ledger) ([]invariant, error) {
	l.mu.Lock()
	type probe struct{ key, extra string }
	var probes []probe
	answers := map[int]int{}
	accepted := 0
	for k, r := range l.reuses {
		answers[r.status]++
		if r.status/100 == 2 {
			accepted++
		}
		if !slices.Contains(l.events[k].recipients, r.extra) {
			probes = append(probes, probe{k, r.extra})
		}
	}
	l.mu.Unlock()
	storedExtra := 0
	for _, p := range probes {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM notifications WHERE producer = 'chaos' AND idempotency_key = $1 AND user_id = $2`, p.key, p.extra).Scan(&n); err != nil {
			return nil, err
		}
		storedExtra += n
	}
	var as []string
	for st, n := range answers {
		as = append(as, fmt.Sprintf("%d×%d", n, st))
	}
	sort.Strings(as)
	return []invariant{{"a key reused with another body is refused and stores nothing of it", accepted == 0 && storedExtra == 0,
		fmt.Sprintf("%d keys reused; answers %s; %d accepted; %d notifications of the other body stored", len(l.reuses), strings.Join(as, " "), accepted, storedExtra)}}, nil
}
