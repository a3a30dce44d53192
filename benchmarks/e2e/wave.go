package main

// The reconnect wave (-wave): in the middle of the last rate's measured
// window the last central replica is killed (SIGKILL); its apps move to
// the replicas still up, resuming after their last cursor, while the load
// goes on. What it measures: the latency of the apps that did not move,
// before, during and after the wave; how long the moved apps took to be
// back; and that every frame still arrived once.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// waveResult is what the wave did.
type waveResult struct {
	replica   string
	killedAt  time.Time
	moved     int // apps back on another replica
	attempts  int // the most dial attempts one of them took
	reconnect quantiles
	end       time.Time // the last move's end, plus a second: the wave's window
	windows   []waveWindow
	// missing are the frames a moved app never got, with its move.
	missing []string
	// pushEnds is how the dispatches of the pushes that never reached
	// Expo ended, by state and the head of their error.
	pushEnds map[string]int
}

// waveWindow is one stretch of the measured window: POST → frame for the
// apps that stayed and for those that moved, and POST → push for all.
type waveWindow struct {
	name                 string
	from, to             time.Time
	stayed, movers, push quantiles
}

// tallyWave splits the measured window [from, to) at the kill and at the
// wave's end and times each part; moves are the apps' moves.
func tallyWave(l *ledger, evs []*event, moves []move, replica string, killedAt, from, to time.Time) *waveResult {
	w := &waveResult{replica: replica, killedAt: killedAt, end: killedAt}
	var back []time.Duration
	for _, m := range moves {
		if m.ready.IsZero() {
			continue
		}
		w.moved++
		w.attempts = max(w.attempts, m.attempts)
		back = append(back, m.ready.Sub(killedAt))
		if m.ready.After(w.end) {
			w.end = m.ready
		}
	}
	w.reconnect = quantilesOf(back)
	w.end = w.end.Add(time.Second)
	bounds := []struct {
		name     string
		from, to time.Time
	}{
		{"before the kill", from, killedAt},
		{"the wave (kill → last move + 1 s)", killedAt, w.end},
		{"after", w.end, to},
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range evs {
		for i, u := range e.recipients {
			if m := moves[u]; e.accepted() && e.frames[i].n == 0 && !m.ready.IsZero() && len(w.missing) < 10 {
				w.missing = append(w.missing, fmt.Sprintf("#%d to %s (created %s): lost %s, back %s after %s",
					e.seq, userName(u), e.createdAt.Format("15:04:05.000000"), m.lost.Format("15:04:05.000"), m.ready.Format("15:04:05.000"), m.cursor))
			}
		}
	}
	for _, b := range bounds {
		var stayed, movers, push []time.Duration
		for _, e := range evs {
			if !e.accepted() || e.due.Before(b.from) || !e.due.Before(b.to) {
				continue
			}
			for i, u := range e.recipients {
				if f := e.frames[i]; f.n > 0 {
					if moves[u].ready.IsZero() {
						stayed = append(stayed, f.first.Sub(e.due))
					} else {
						movers = append(movers, f.first.Sub(e.due))
					}
				}
				if p := e.pushes[i]; p.n > 0 {
					push = append(push, p.first.Sub(e.due))
				}
			}
		}
		w.windows = append(w.windows, waveWindow{name: b.name, from: b.from, to: b.to,
			stayed: quantilesOf(stayed), movers: quantilesOf(movers), push: quantilesOf(push)})
	}
	return w
}

func (w *waveResult) print(rate int) {
	fmt.Printf("\nkilled at %s, the last app back at %s\n", w.killedAt.Format("15:04:05.000"), w.end.Add(-time.Second).Format("15:04:05.000"))
	fmt.Printf("\nreconnect wave at %d/s: %s killed (SIGKILL); %d apps moved to the replicas still up, back after p50 %s, p99 %s, max %s (the SDK's backoff included; at most %d attempts)\n\n",
		rate, w.replica, w.moved, ms(w.reconnect.p50), ms(w.reconnect.p99), ms(w.reconnect.mx), w.attempts)
	for _, m := range w.missing {
		fmt.Println("frame missing from a moved app: " + m)
	}
	for end, n := range w.pushEnds {
		fmt.Printf("pushes that never reached Expo, their dispatch %q: %d\n", end, n)
	}
	fmt.Println()
	fmt.Println("| events due | for | stayed: POST→frame p50 | p99 | max | moved: POST→frame p50 | p99 | max | POST→push p50 | p99 | max |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, x := range w.windows {
		if !x.to.After(x.from) {
			continue // the wave outlasted the window: -duration 20s or more gives it room
		}
		fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", x.name, x.to.Sub(x.from).Round(100*time.Millisecond),
			ms(x.stayed.p50), ms(x.stayed.p99), ms(x.stayed.mx), ms(x.movers.p50), ms(x.movers.p99), ms(x.movers.mx),
			ms(x.push.p50), ms(x.push.p99), ms(x.push.mx))
	}
}

// explainMissing reads, for each push that never reached Expo, how its
// dispatch ended (pushes are at most once across a crash: design.md).
func explainMissing(ctx context.Context, url string, l *ledger, evs []*event) (map[string]int, error) {
	type key struct {
		user  string
		title string
	}
	var want []key
	l.mu.Lock()
	for _, e := range evs {
		for i, u := range e.recipients {
			if e.accepted() && e.pushes[i].n == 0 {
				want = append(want, key{userName(u), fmt.Sprintf("#%d %%", e.seq)})
			}
		}
	}
	l.mu.Unlock()
	out := map[string]int{}
	if len(want) == 0 {
		return out, nil
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	for _, k := range want {
		var state string
		err := conn.QueryRow(ctx, `SELECT coalesce((SELECT d.state || coalesce(': ' || split_part(d.error, ':', 1), '')
			FROM push_dispatches d WHERE d.notification_id = n.id AND d.user_id = n.user_id ORDER BY d.updated_at DESC LIMIT 1), 'no dispatch')
			FROM notifications n WHERE n.user_id = $1 AND n.title LIKE $2`, k.user, k.title).Scan(&state)
		if errors.Is(err, pgx.ErrNoRows) {
			state = "no notification"
		} else if err != nil {
			return nil, err
		}
		out[state]++
	}
	return out, nil
}

// atMostOnce counts the pushes explainMissing found the killed replica
// may have sent: dispatches it wrote before its request and left queued
// (the receipt reconciler ends them failed, "interrupted", 10 minutes
// on), or ended failed with the outcome unknown. Neither is sent again.
func atMostOnce(ends map[string]int) int {
	return ends["queued"] + ends["failed: interrupted"] + ends["failed: outcome unknown"]
}
