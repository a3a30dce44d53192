package main

// Commit → frame latency under a fixed offered rate.

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/wsclient"
	"github.com/spoolcast/spoolcast/sync/ingest"
)

type latency struct {
	n, lost            int
	p50, p90, p99, max time.Duration
}

// commitTimes times frames from the return of the commit that wrote them.
// A frame that arrives before its commit's return is noted counts 0.
type commitTimes struct {
	mu      sync.Mutex
	pending map[string]time.Time // title → its commit's return, or its frame's arrival when that came first
}

func newCommitTimes() *commitTimes { return &commitTimes{pending: map[string]time.Time{}} }

// committed notes that the commit of titles returned at at.
func (c *commitTimes) committed(titles []string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range titles {
		if _, early := c.pending[t]; early {
			delete(c.pending, t)
		} else {
			c.pending[t] = at
		}
	}
}

// arrived returns the latency of the frame of title, arrived at at.
func (c *commitTimes) arrived(title string, at time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.pending[title]; ok {
		delete(c.pending, title)
		return at.Sub(t)
	}
	c.pending[title] = at
	return 0
}

// measureLatency commits rate notifications per second to random connected
// users and times each frame from its commit's return to its arrival.
func measureLatency(ctx context.Context, pool *pgxpool.Pool, sockets []*wsclient.Conn, rate int, duration time.Duration) (latency, error) {
	var mu sync.Mutex
	commits := newCommitTimes()
	var samples []time.Duration
	var arrivals []time.Time // when each sample's frame arrived, for the per-window breakdown
	received := make(chan struct{}, 1<<20)
	var readers sync.WaitGroup
	stopRead := make(chan struct{})
	for _, c := range sockets {
		readers.Go(func() {
			for {
				m, err := c.Next(time.Minute)
				at := time.Now()
				if err != nil {
					select {
					case <-stopRead:
					default:
						fmt.Fprintln(os.Stderr, "livebench: socket:", err)
					}
					return
				}
				if m.Type != "notification" {
					continue
				}
				it, err := m.Item()
				if err != nil {
					continue
				}
				lat := commits.arrived(it.Title, at)
				mu.Lock()
				samples = append(samples, lat)
				arrivals = append(arrivals, at)
				mu.Unlock()
				received <- struct{}{}
			}
		})
	}
	waker := ingest.NewWaker(pool, 0, nil, slog.New(slog.DiscardHandler))
	const tick = 10 * time.Millisecond
	perTick := max(1, rate*int(tick)/int(time.Second))
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	end := time.Now().Add(duration)
	sent := 0
	var ingests sync.WaitGroup
	var ingestErr atomic.Value
	for time.Now().Before(end) {
		<-ticker.C
		items := make([]ingest.Item, perTick)
		titles := make([]string, perTick)
		for i := range items {
			titles[i] = "n" + strconv.Itoa(sent)
			ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":%q,"type":"bench","recipients":[%q],"title":%q,"body":"A notification of ordinary size for the latency run."}`,
				titles[i], user(rand.N(len(sockets))), titles[i]), "")
			if err != nil {
				return latency{}, err
			}
			items[i] = ingest.Item{Producer: "livebench", Event: ev}
			sent++
		}
		ingests.Go(func() {
			if _, err := ingest.Ingest(ctx, pool, items); err != nil {
				ingestErr.CompareAndSwap(nil, err)
				return
			}
			now := time.Now()
			waker.Committed()
			commits.committed(titles, now)
		})
	}
	ingests.Wait()
	waker.Stop()
	if err, _ := ingestErr.Load().(error); err != nil {
		return latency{}, err
	}
	got := 0
	timeout := time.After(30 * time.Second)
	for got < sent {
		select {
		case <-received:
			got++
		case <-timeout:
			close(stopRead)
			return latency{n: got, lost: sent - got}, nil
		}
	}
	close(stopRead)
	mu.Lock()
	defer mu.Unlock()
	if len(arrivals) > 0 {
		// Where the tail sits: p99 per 5-second window.
		first := arrivals[0]
		windows := map[int][]time.Duration{}
		for i, at := range arrivals {
			w := int(at.Sub(first) / (5 * time.Second))
			windows[w] = append(windows[w], samples[i])
		}
		fmt.Print("  p99 per 5 s window:")
		for w := 0; w < len(windows); w++ {
			ws := windows[w]
			slices.Sort(ws)
			fmt.Printf(" %s", ws[min(len(ws)-1, len(ws)*99/100)].Round(time.Millisecond))
		}
		fmt.Println()
	}
	slices.Sort(samples)
	q := func(p float64) time.Duration { return samples[min(len(samples)-1, int(p*float64(len(samples))))] }
	return latency{n: len(samples), p50: q(.50), p90: q(.90), p99: q(.99), max: samples[len(samples)-1]}, nil
}
