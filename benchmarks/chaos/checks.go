package main

// What must hold after the run, each checked against Postgres, the apps'
// views, the fake Expo and the processes, with the counts behind it.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
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

// sample is what a process held at one moment.
type sample struct {
	rss        int64 // bytes
	fds        int
	goroutines int
}

// sampler reads each process's RSS, open files and goroutines every few
// seconds, keeping the peak RSS and, per start, the first sample taken once
// the process had settled and the latest.
type sampler struct {
	mu      sync.Mutex
	peakRSS map[string]int64
	latest  map[string]sample
}

func newSampler() *sampler {
	return &sampler{peakRSS: map[string]int64{}, latest: map[string]sample{}}
}

func (s *sampler) run(ctx context.Context, procs []*proc) {
	for ctx.Err() == nil {
		for _, p := range procs {
			s.take(p)
		}
		sleep(ctx, 2*time.Second)
	}
}

func (s *sampler) take(p *proc) {
	pid := p.pid()
	if pid == 0 {
		return
	}
	sm, err := read(pid, p.base)
	if err != nil {
		return
	}
	p.mu.Lock()
	if p.firstSample == nil && time.Since(p.started) > 10*time.Second {
		first := sm
		p.firstSample = &first
	}
	p.mu.Unlock()
	s.mu.Lock()
	s.peakRSS[p.name] = max(s.peakRSS[p.name], sm.rss)
	s.latest[p.name] = sm
	s.mu.Unlock()
}

func read(pid int, base string) (sample, error) {
	var sm sample
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return sm, err
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			sm.rss = kb << 10
		}
	}
	f.Close()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return sm, err
	}
	sm.fds = len(fds)
	g, err := metric(base, "go_goroutines")
	if err != nil {
		return sm, err
	}
	sm.goroutines = int(g)
	return sm, nil
}

// checkEvents: every event answered 2xx is stored exactly once per
// recipient, none answered 4xx is, and nothing is stored that no producer
// sent.
func checkEvents(ctx context.Context, db *pgx.Conn, l *ledger) ([]invariant, error) {
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
	var accepted, promised, missing, doubled, rejected, rejectedStored, unanswered, unansweredStored, unknown int
	known := map[string]bool{}
	l.mu.Lock()
	for key, s := range l.events {
		for _, u := range s.recipients {
			known[key+"\x00"+u] = true
			n := stored[key+"\x00"+u]
			switch {
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
			fmt.Sprintf("%d events, %d notifications promised; %d missing", accepted, promised, missing)},
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
func checkApps(apps []*app, expected map[string]map[string]bool) []invariant {
	var want, missing, phantom, twice, disorder, resumes, refusals, reloaded int
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
				phantom++
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
			fmt.Sprintf("%d notifications of %d apps; %d never seen %s, %d seen that Postgres does not hold; %d resumes with a cursor, %d cursors refused (%d ids reloaded from the feed)",
				want, len(apps), missing, strings.Join(examples, ", "), phantom, resumes, refusals, reloaded)},
		{"no app saw a notification twice (before any dedupe)", twice == 0, fmt.Sprintf("%d notifications with more than one frame", twice)},
		{"frames came in commit order within each socket", disorder == 0, fmt.Sprintf("%d frames behind the one before", disorder)},
	}
}

// checkReadState: the feed, the unread count and what the sockets saw
// agree on what is read.
func checkReadState(ctx context.Context, apps []*app, base string) ([]invariant, error) {
	var compared, disagree, countOff, refreshed int
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
		fmt.Sprintf("%d notifications compared; %d disagree; %d unread counts off; %d found read first by the refresh after a resume (read frames are live only) %s",
			compared, disagree, countOff, refreshed, strings.Join(examples, "; "))}}, nil
}

// checkPushes: each device got each push at most once, and every
// notification's push ended: delivered, failed with a reason, or skipped
// with one; none stuck queued or waiting for a receipt.
func checkPushes(ctx context.Context, db *pgx.Conn, w *world) ([]invariant, error) {
	pushes := map[string]int{}
	for _, m := range w.expo.Messages() {
		pushes[fmt.Sprint(m.To, " ", m.Data["notification_id"])]++
	}
	twice := 0
	for _, n := range pushes {
		if n > 1 {
			twice++
		}
	}
	rows, err := db.Query(ctx, `SELECT state, coalesce(error, '') <> '', count(*) FROM push_dispatches GROUP BY 1, 2 ORDER BY 1, 2`)
	if err != nil {
		return nil, err
	}
	var states []string
	stuck, unexplained := 0, 0
	for rows.Next() {
		var state string
		var reason bool
		var n int
		if err := rows.Scan(&state, &reason, &n); err != nil {
			return nil, err
		}
		states = append(states, fmt.Sprintf("%s %d", state, n))
		switch {
		case state == "queued" || state == "sent":
			stuck += n
		case (state == "failed" || state == "skipped") && !reason:
			unexplained += n
		}
	}
	rows.Close()
	var undispatched int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM notifications n
		WHERE NOT EXISTS (SELECT 1 FROM push_dispatches d WHERE d.notification_id = n.id)`).Scan(&undispatched); err != nil {
		return nil, err
	}
	return []invariant{
		{"each device got each push at most once", twice == 0, fmt.Sprintf("%d pushes reached Expo; %d more than once", len(pushes), twice)},
		{"every notification's push ended (none lost, none stuck queued)", stuck == 0 && unexplained == 0 && undispatched == 0,
			fmt.Sprintf("dispatches: %s; %d stuck, %d failed or skipped without a reason, %d notifications with no dispatch", strings.Join(states, ", "), stuck, unexplained, undispatched)},
	}, nil
}

// checkPolicies: every scheduled event fired (none left waiting), every
// notification of a digest event was gathered into exactly one digest and
// no other was, no digest is left open, and the digest pushes that reached
// Expo gather no more notifications than their users' digests did.
func checkPolicies(ctx context.Context, db *pgx.Conn, w *world, l *ledger) ([]invariant, error) {
	var waiting int
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM scheduled_notifications) + (SELECT count(*) FROM push_digests)`).Scan(&waiting); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT n.idempotency_key, n.user_id, n.created_at, n.id,
			(SELECT count(*) FROM push_dispatches d WHERE d.notification_id = n.id AND d.state = 'digested'),
			EXISTS (SELECT 1 FROM push_dispatches d WHERE d.notification_id = n.id AND d.state = 'skipped')
		FROM notifications n WHERE n.producer = 'chaos'`)
	if err != nil {
		return nil, err
	}
	type userKey struct{ user, key string }
	gathered := map[userKey]int{}
	userOf := map[string]string{} // a notification's public id → its user
	var members, skipped, wrong, stray int
	l.mu.Lock()
	for rows.Next() {
		var key, user string
		var id feed.ID
		var digested int
		var skip bool
		if err := rows.Scan(&key, &user, &id.CreatedAt, &id.Seq, &digested, &skip); err != nil {
			l.mu.Unlock()
			rows.Close()
			return nil, err
		}
		userOf[id.String()] = user
		dk, isDigest := l.digests[key]
		switch {
		case isDigest && digested == 0 && skip:
			skipped++ // not pushed at all (no device, push off): nothing to gather
		case isDigest:
			members++
			if digested != 1 {
				wrong++
			}
			gathered[userKey{user, dk}] += digested
		case digested > 0:
			stray++
		}
	}
	scheduled := len(l.scheduled)
	l.mu.Unlock()
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// One count per digest push (its latest notification), whichever device got it.
	pushed := map[userKey]map[string]int{}
	digestPushes := 0
	for _, m := range w.expo.Messages() {
		dg, _ := m.Data["digest"].(map[string]any)
		if dg == nil {
			continue
		}
		id := fmt.Sprint(m.Data["notification_id"])
		// By the notification's user: a device may have changed hands since.
		k := userKey{userOf[id], fmt.Sprint(dg["key"])}
		if pushed[k] == nil {
			pushed[k] = map[string]int{}
		}
		count, _ := dg["count"].(float64)
		if _, seen := pushed[k][id]; !seen {
			digestPushes++
		}
		pushed[k][id] = int(count)
	}
	over := 0
	var examples []string
	for k, byID := range pushed {
		sum := 0
		for _, c := range byID {
			sum += c
		}
		if sum > gathered[k] {
			over++
			if len(examples) < 3 {
				examples = append(examples, fmt.Sprintf("%s %s: pushed %d, gathered %d", k.user, k.key, sum, gathered[k]))
			}
		}
	}
	return []invariant{
		{"scheduled events fired and digests closed (none left waiting)", waiting == 0,
			fmt.Sprintf("%d scheduled events sent; %d scheduled notifications or digests still waiting", scheduled, waiting)},
		{"each digest event's notification joined exactly one digest, no other did", wrong == 0 && stray == 0,
			fmt.Sprintf("%d digest members in %d (user, key) pairs (%d more skipped, not pushed at all); %d not gathered exactly once; %d others gathered", members, len(gathered), skipped, wrong, stray)},
		{"digest pushes gather no more than their digests", over == 0,
			fmt.Sprintf("%d digest pushes reached Expo; %d (user, key) pairs pushed more than they gathered %s", digestPushes, over, strings.Join(examples, "; "))},
	}, nil
}

// checkProcesses: producers saw no 5xx but 503 with Retry-After, relays
// stayed under the sidecar's memory limit, and no process's goroutines or
// open files grew without bound.
func checkProcesses(l *ledger, s *sampler, procs []*proc) []invariant {
	l.mu.Lock()
	bad := append([]string(nil), l.bad5xx...)
	var answers []string
	for status, n := range l.answers {
		answers = append(answers, fmt.Sprintf("%d×%d", n, status))
	}
	l.mu.Unlock()
	sort.Strings(answers)
	const relayLimit = 256 << 20 // the sidecar's memory limit in the deploy example
	var rss []string
	overLimit := false
	var growth []string
	grew := false
	s.mu.Lock()
	for _, p := range procs {
		peak := s.peakRSS[p.name]
		if strings.HasPrefix(p.name, "relay") {
			rss = append(rss, fmt.Sprintf("%s %d MiB", p.name, peak>>20))
			overLimit = overLimit || peak > relayLimit
		}
		p.mu.Lock()
		first, last := p.firstSample, s.latest[p.name]
		p.mu.Unlock()
		if first == nil {
			continue
		}
		growth = append(growth, fmt.Sprintf("%s goroutines %d→%d fds %d→%d", p.name, first.goroutines, last.goroutines, first.fds, last.fds))
		if last.goroutines > 2*first.goroutines+200 || last.fds > 2*first.fds+100 {
			grew = true
		}
	}
	s.mu.Unlock()
	return []invariant{
		{"producers saw no 5xx but 503 with Retry-After", len(bad) == 0, fmt.Sprintf("answers %s; %s", strings.Join(answers, " "), strings.Join(bad, ", "))},
		{"relay RSS stayed under the sidecar limit (256 MiB)", !overLimit, "peak " + strings.Join(rss, ", ")},
		{"no process's goroutines or open files grew without bound", !grew, strings.Join(growth, "; ")},
	}
}
