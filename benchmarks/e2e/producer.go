package main

// The producer: an open-loop generator. Request i of a rate is due at
// t0 + i/rate whatever became of the ones before it, and everything is
// timed from when it was due, so a stall anywhere counts against it.

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// workers are the generator's requests in flight at most, each on a
// keep-alive connection of its own: far above rate × the relay's answer
// time, so that the generator is never what holds a request back.
const workers = 256

// lateBy is how late past its due time a request may begin before the
// generator itself counts as having held it back.
const lateBy = 5 * time.Millisecond

// generatorLag is how far behind its schedule the generator began requests.
type generatorLag struct {
	late int           // requests begun more than lateBy after they were due
	max  time.Duration // the latest
}

// produce sends evs (fresh from the ledger) to the relay at rate, the first
// due at t0; recipients are 1–3 distinct users of n, chosen ahead.
func produce(ctx context.Context, relay string, evs []*event, rate, users int, t0 time.Time, l *ledger) generatorLag {
	rng := mrand.New(mrand.NewPCG(uint64(t0.UnixNano()), 7))
	l.mu.Lock()
	for i, e := range evs {
		e.due = t0.Add(time.Duration(i) * time.Second / time.Duration(rate))
		k := 1 + rng.IntN(min(3, users))
		for len(e.recipients) < k {
			if u := rng.IntN(users); e.recipient(u) < 0 {
				e.recipients = append(e.recipients, u)
			}
		}
		e.frames = make([]arrivals, k)
		e.pushes = make([]arrivals, k)
	}
	l.mu.Unlock()

	transport := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers, DisableCompression: true}
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	defer transport.CloseIdleConnections()
	due := make(chan *event, len(evs))
	go func() {
		defer close(due)
		for _, e := range evs {
			if d := time.Until(e.due); d > 0 {
				time.Sleep(d)
			}
			due <- e
		}
	}()
	var mu sync.Mutex
	var lag generatorLag
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for e := range due {
				began := time.Now()
				if late := began.Sub(e.due); late > lateBy {
					mu.Lock()
					lag.late++
					lag.max = max(lag.max, late)
					mu.Unlock()
				}
				status := post(ctx, client, relay, body(e))
				answered := time.Now()
				l.mu.Lock()
				e.began, e.answered, e.status = began, answered, status
				l.mu.Unlock()
			}
		})
	}
	wg.Wait()
	return lag
}

func post(ctx context.Context, client *http.Client, relay string, b []byte) int {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, relay+"/v1/events", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// What the events say: a few kinds an application sends, each ~300 bytes
// with its key, recipients and a small data object.
var kinds = []struct{ typ, category, title, body string }{
	{"order.shipped", "orders", "Your order has shipped", "Your order of 3 items is on its way and should arrive on Thursday."},
	{"comment.created", "social", "Dana replied to your comment", "Good point — I think we should ship the smaller change first and measure."},
	{"build.finished", "builds", "Build passed on main", "All 1,204 tests passed in 6 min 12 s; the artifact is ready to deploy."},
}

// body is e's request: a random UUIDv4 key, its seq at the head of the title.
func body(e *event) []byte {
	k := kinds[e.seq%len(kinds)]
	recipients := make([]string, len(e.recipients))
	for i, u := range e.recipients {
		recipients[i] = fmt.Sprintf("%q", userName(u))
	}
	return fmt.Appendf(nil, `{"idempotency_key":%q,"type":%q,"category":%q,"recipients":[%s],"title":"#%d %s","body":%q,"data":{"ref":"r_%010d","count":3,"url":"https://example.invalid/r/%010d"}}`,
		uuid4(), k.typ, k.category, strings.Join(recipients, ","), e.seq, k.title, k.body, e.seq, e.seq)
}

func uuid4() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
