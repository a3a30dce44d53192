package main

// The checks of pushes and delivery policies, against Postgres and what
// the fake Expo took.

import (
	"cmp"
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spoolcast/spoolcast/feed"
)

// checkPushes: each device got each push at most once, every
// notification's push ended (delivered, failed with a reason, or skipped
// with one; none stuck queued or waiting for a receipt), and a push ended
// failed only on the provider's final answer about its token, or where its
// request reached Expo and the answer was lost (outcome unknown: not sent
// again, at most once).
func checkPushes(ctx context.Context, db *pgx.Conn, w *world) ([]invariant, error) {
	// Pushes by device and notification; clears (the silent messages that
	// take a read notification's banner down) by device and the ids each
	// names.
	pushes, clears := map[string]int{}, map[string]int{}
	for _, m := range w.expo.Messages() {
		if m.Data["type"] == "clear" {
			ids, _ := m.Data["ids"].([]any)
			for _, id := range ids {
				clears[fmt.Sprint(m.To, " ", id)]++
			}
			continue
		}
		pushes[fmt.Sprint(m.To, " ", m.Data["notification_id"])]++
	}
	// A push whose receipt said MessageRateExceeded was not delivered:
	// the one sent again after it is the first delivered.
	resent := 0
	for _, m := range w.expo.Undelivered() {
		pushes[fmt.Sprint(m.To, " ", m.Data["notification_id"])]--
		resent++
	}
	// APNs, FCM and the Web Push service: every message that reached
	// them, answered or not.
	direct := map[string][]directArrival{}
	expoPushes := len(pushes)
	webPushes, webClears, webRefused := w.web.arrivals()
	directArrivals, directClears := w.channels.arrivals()
	add := func(arrivals []directArrival) int {
		before := len(pushes)
		for _, a := range arrivals {
			k := a.token + " " + a.id
			pushes[k]++
			direct[k] = append(direct[k], a)
		}
		return len(pushes) - before
	}
	directPushes, browserPushes := add(directArrivals), add(webPushes)
	clearedInLoss := map[string]bool{} // a clear that arrived while the asynchronous failover's lost commits were
	for _, a := range append(webClears, directClears...) {
		k := a.token + " " + a.id
		clears[k]++
		if w.loss.holds(a.at) {
			clearedInLoss[k] = true
		}
	}
	clearTwice, clearLostTwice, clearUnpushed := 0, 0, 0
	for k, n := range clears {
		if pushes[k] == 0 {
			clearUnpushed++
		}
		if n > 1 {
			to, id, _ := strings.Cut(k, " ")
			if clearedInLoss[k] || w.arrivals.arrivedIn(clearKey(to), id, &w.loss) {
				clearLostTwice++ // its clear row was lost in the asynchronous failover, and written again by a later read
				continue
			}
			clearTwice++
		}
	}
	arrivedIn := func(to, id string) bool {
		for _, a := range direct[to+" "+id] {
			if w.loss.holds(a.at) {
				return true
			}
		}
		return w.arrivals.arrivedIn(to, id, &w.loss)
	}
	arrived := func(to, id string) bool { return len(direct[to+" "+id]) > 0 || w.arrivals.arrived(to, id) }
	// An APNs or FCM request that reached the fake and whose answer the
	// channel did not get: the fake may have answered as its connection
	// was killed, so any arrival counts.
	reachedDirect := func(to, id string) bool { return len(direct[to+" "+id]) > 0 }
	twice, lostTwice := 0, 0
	for k, n := range pushes {
		if n > 1 {
			to, id, _ := strings.Cut(k, " ")
			if arrivedIn(to, id) {
				lostTwice++ // its dispatch row was lost in the asynchronous failover
				continue
			}
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
	// A topic's members without an enabled device when their batch ran
	// get no push work at all: those with no device now, and those whose
	// phone another app had taken over then. The first few left are named
	// (user, key, topic, created_at), so that a failing run says which.
	rows, err = db.Query(ctx, `SELECT n.user_id, n.idempotency_key, coalesce(n.topic, ''), n.created_at
		FROM notifications n
		WHERE NOT EXISTS (SELECT 1 FROM push_dispatches d WHERE d.notification_id = n.id)
		  AND NOT (n.topic IS NOT NULL AND NOT EXISTS (SELECT 1 FROM devices v WHERE v.user_id = n.user_id))
		ORDER BY n.created_at`)
	if err != nil {
		return nil, err
	}
	undispatched, handedOver := 0, 0
	var samples []string
	for rows.Next() {
		var user, key, topic string
		var at time.Time
		if err := rows.Scan(&user, &key, &topic, &at); err != nil {
			return nil, err
		}
		if topic != "" && w.handovers.deviceless(user, at) {
			handedOver++
			continue
		}
		undispatched++
		if len(samples) < 5 {
			samples = append(samples, fmt.Sprintf("%s %s %s %s", user, key, cmp.Or(topic, "-"), at.Format(time.RFC3339Nano)))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	undispatchedSample := strings.Join(samples, "; ")
	rows, err = db.Query(ctx, `SELECT coalesce(token, ''), notification_created_at, notification_id, coalesce(error, ''), created_at FROM push_dispatches WHERE state = 'failed'`)
	if err != nil {
		return nil, err
	}
	final, unknown, killed, lostWrite := 0, 0, 0, 0
	wrong := map[string]int{}
	var wrongSamples []string
	for rows.Next() {
		var token, reason string
		var id feed.ID
		var recorded time.Time
		if err := rows.Scan(&token, &id.CreatedAt, &id.Seq, &reason, &recorded); err != nil {
			return nil, err
		}
		switch {
		case strings.HasPrefix(reason, "DeviceNotRegistered"), w.strays.final(token, reason):
			final++
		case strings.Contains(reason, "outcome unknown") && (w.arrivals.answerLost(token, id.String()) || reachedDirect(token, id.String())):
			unknown++
		case strings.Contains(reason, "outcome unknown: APNs") && w.apnsKilled.holds(recorded):
			// its connection killed as its headers went out: the fake
			// never read it, the channel cannot know (at most once)
			unknown++
		case strings.HasPrefix(reason, "interrupted") && arrived(token, id.String()):
			// a replica killed after its request reached Expo, before it
			// recorded the answer: may have happened, so not sent again
			unknown++
		case strings.HasPrefix(reason, "interrupted") && w.centralKilled.holds(recorded):
			// recorded by a replica killed (-9) before its request left:
			// it may have been sent for all the next replica knows, so it
			// is not sent again (at most once), and is lost
			killed++
		case strings.HasPrefix(reason, "interrupted") && w.loss.overlaps(recorded, recorded.Add(dispatchLease)):
			// its dispatch's next write (given back, deferred, its
			// outcome), made within its lease, lost in the asynchronous
			// failover: left queued, so ended as interrupted
			lostWrite++
		default:
			wrong[shorten(reason, 60)]++
			if len(wrongSamples) < 3 {
				wrongSamples = append(wrongSamples, fmt.Sprintf("%s %s written %s", shorten(token, 24), id, recorded.Format("15:04:05.000")))
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var wrongs []string
	for r, n := range wrong {
		wrongs = append(wrongs, fmt.Sprintf("%d× %q", n, r))
	}
	sort.Strings(wrongs)
	return []invariant{
		{"each device got each push at most once", twice == 0 && webRefused == 0,
			fmt.Sprintf("%d pushes reached Expo, %d APNs or FCM, %d the Web Push service (%d it could not decrypt); %d more than once; %d more than once whose first send's dispatch row the asynchronous failover lost (allowed); %d sent again after a receipt said MessageRateExceeded (not delivered: allowed)",
				expoPushes, directPushes, browserPushes, webRefused, twice, lostTwice, resent)},
		{"a clear went only to a device that got the push, at most once", clearTwice == 0 && clearUnpushed == 0,
			fmt.Sprintf("%d clears of a notification on a device; %d more than once; %d to a device that never got its push; %d more than once whose first clear's row the asynchronous failover lost (allowed)",
				len(clears), clearTwice, clearUnpushed, clearLostTwice)},
		{"every notification's push ended (none lost, none stuck queued)", stuck == 0 && unexplained == 0 && undispatched == 0,
			fmt.Sprintf("dispatches: %s; %d stuck, %d failed or skipped without a reason, %d notifications with no dispatch %s; %d topic notifications without one to members whose phone was taken over then (allowed)", strings.Join(states, ", "), stuck, unexplained, undispatched, undispatchedSample, handedOver)},
		{"a push failed only on the provider's final answer, or its answer lost after Expo took it", len(wrong) == 0,
			fmt.Sprintf("%d failed on a final answer (the token), %d with the outcome unknown after the request reached its provider and its answer was lost, %d recorded by a replica killed (-9) before its request left (allowed: at most once), %d left queued when a later write of theirs was lost in the asynchronous failover (allowed); others: %s %s",
				final, unknown, killed, lostWrite, strings.Join(wrongs, ", "), strings.Join(wrongSamples, "; "))},
	}, nil
}

// checkPolicies: every scheduled event fired (none left waiting), every
// notification of a digest event was gathered into exactly one digest and
// no other was, no digest is left open, and the digest pushes that reached
// Expo gather no more notifications than their users' digests did.
func checkPolicies(ctx context.Context, db *pgx.Conn, w *world, l *ledger) ([]invariant, error) {
	var waiting int
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM scheduled_notifications WHERE cancelled_at IS NULL) + (SELECT count(*) FROM push_digests)`).Scan(&waiting); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT n.idempotency_key, n.user_id, n.created_at, n.id,
			(SELECT count(*) FROM push_dispatches d WHERE d.notification_id = n.id AND d.state = 'digested'),
			EXISTS (SELECT 1 FROM push_dispatches d WHERE d.notification_id = n.id AND d.state IN ('skipped', 'suppressed'))
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
			skipped++ // not pushed at all (no device, push off, read before its push was due): nothing to gather
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
	// What the pushes that reached Expo while the asynchronous failover's
	// lost commits were made counted: the flush that recorded them may be
	// among the lost, and its members gathered again into a later push.
	inLoss := map[userKey]map[string]int{}
	digestPushes := 0
	for _, m := range w.expo.Messages() {
		dg, _ := m.Data["digest"].(map[string]any)
		if dg == nil {
			continue
		}
		id := fmt.Sprint(m.Data["notification_id"])
		if _, stored := userOf[id]; !stored && w.arrivals.arrivedIn(m.To, id, &w.loss) {
			continue // its notification was lost in the asynchronous failover, and stored again under another id
		}
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
		if w.arrivals.arrivedIn(m.To, id, &w.loss) {
			if inLoss[k] == nil {
				inLoss[k] = map[string]int{}
			}
			inLoss[k][id] = int(count)
		}
	}
	over, overInLoss := 0, 0
	var examples []string
	for k, byID := range pushed {
		sum, lost := 0, 0
		for id, c := range byID {
			sum += c
			lost += inLoss[k][id]
		}
		switch {
		case sum-lost > gathered[k]:
			over++
			if len(examples) < 3 {
				examples = append(examples, fmt.Sprintf("%s %s: pushed %d, gathered %d", k.user, k.key, sum, gathered[k]))
			}
		case sum > gathered[k]:
			overInLoss++
		}
	}
	return []invariant{
		{"scheduled events fired and digests closed (none left waiting)", waiting == 0,
			fmt.Sprintf("%d scheduled events sent; %d scheduled notifications or digests still waiting", scheduled, waiting)},
		{"each digest event's notification joined exactly one digest, no other did", wrong == 0 && stray == 0,
			fmt.Sprintf("%d digest members in %d (user, key) pairs (%d more skipped or read before their push was due, not pushed at all); %d not gathered exactly once; %d others gathered", members, len(gathered), skipped, wrong, stray)},
		{"digest pushes gather no more than their digests", over == 0,
			fmt.Sprintf("%d digest pushes reached Expo; %d (user, key) pairs pushed more than they gathered %s; %d more, by no more than the pushes made while the asynchronous failover's lost commits were (their flush lost, allowed)",
				digestPushes, over, strings.Join(examples, "; "), overInLoss)},
	}, nil
}

// dispatchLease is the dispatcher's lease (2 minutes, not a flag): every
// write of a dispatch after its creation is made within it.
const dispatchLease = 2 * time.Minute

// clearKey is the device key under which the arrivals recorder keeps the
// clears a device got, apart from its pushes.
func clearKey(token string) string { return "clear:" + token }
