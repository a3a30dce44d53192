package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The load is the relay's loadgen's: random UUIDv4 keys, as most producers
// send, and ~300-byte events, over keep-alive connections.

func uuidV4() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

var bodySeq atomic.Int64

// eventBody returns a ~300-byte event under key, byte for byte the
// loadgen's.
func eventBody(key string) []byte {
	n := bodySeq.Add(1)
	return fmt.Appendf(nil, `{"idempotency_key":%q,"type":"job.finished","category":"jobs","recipients":["u_%06d"],"title":"Nightly export finished","body":"Your export of 12,345 rows is ready to download.","data":{"job_id":"j_%012d","rows":12345,"url":"https://example.invalid/exports/%012d"}}`,
		key, n%1000000, n, n)
}

func newClient(conns int) (*http.Client, func()) {
	transport := &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true}
	return &http.Client{Transport: transport, Timeout: 30 * time.Second}, transport.CloseIdleConnections
}

// post sends one event and returns its status code.
func post(ctx context.Context, client *http.Client, url string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// checkContract sends one new event twice: a target must answer 202, then
// 200 for the duplicate.
func checkContract(url string) error {
	client, done := newClient(1)
	defer done()
	body := eventBody(uuidV4())
	for _, want := range []int{http.StatusAccepted, http.StatusOK} {
		code, err := post(context.Background(), client, url, body)
		if err != nil {
			return fmt.Errorf("contract check: %w", err)
		}
		if code != want {
			return fmt.Errorf("contract check: got %d, want %d (202 for a new key, then 200 for the same key)", code, want)
		}
	}
	return nil
}

// fill sends n new events over conns connections, as fast as the target
// takes them.
func fill(ctx context.Context, url string, conns, n int) error {
	client, done := newClient(conns)
	defer done()
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for failed.Load() == nil && next.Add(1) <= int64(n) {
				code, err := post(ctx, client, url, eventBody(uuidV4()))
				if err == nil && code != http.StatusAccepted {
					err = fmt.Errorf("status %d", code)
				}
				if err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return *err
	}
	return nil
}

type loadResult struct {
	statuses map[int]int64 // measured requests by status
	errors   int64         // measured requests without an answer
	elapsed  time.Duration
	p50, p99 time.Duration
	// acceptedAll counts the 202s over the warm-up too: disk writes are read
	// over the whole load.
	acceptedAll int64
}

func (r loadResult) ok() int64 {
	var n int64
	for code, c := range r.statuses {
		if code/100 == 2 {
			n += c
		}
	}
	return n
}

func (r loadResult) rps() float64 { return float64(r.ok()) / r.elapsed.Seconds() }

func (r loadResult) non2xx() int64 {
	var n int64
	for code, c := range r.statuses {
		if code/100 != 2 {
			n += c
		}
	}
	return n
}

// closedLoop keeps conns requests in flight for warmup+duration, each
// connection sending its next event as soon as the last is answered, and
// measures the requests sent after the warm-up.
func closedLoop(url string, conns int, warmup, duration time.Duration) loadResult {
	client, done := newClient(conns)
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), warmup+duration)
	defer cancel()
	measureFrom := time.Now().Add(warmup)
	var mu sync.Mutex
	res := loadResult{statuses: map[int]int64{}, elapsed: duration}
	var all []time.Duration
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			var lat []time.Duration
			statuses := map[int]int64{}
			var errs, accepted int64
			for ctx.Err() == nil {
				start := time.Now()
				code, err := post(ctx, client, url, eventBody(uuidV4()))
				if code == http.StatusAccepted {
					accepted++
				}
				if start.Before(measureFrom) {
					continue
				}
				if ctx.Err() != nil {
					break // cut off by the end of the run, not by the target
				}
				if err != nil {
					errs++
					continue
				}
				lat = append(lat, time.Since(start))
				statuses[code]++
			}
			mu.Lock()
			defer mu.Unlock()
			all = append(all, lat...)
			for k, v := range statuses {
				res.statuses[k] += v
			}
			res.errors += errs
			res.acceptedAll += accepted
		})
	}
	wg.Wait()
	res.p50, res.p99 = percentiles(all)
	return res
}

func percentiles(lat []time.Duration) (p50, p99 time.Duration) {
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100]
}

// ratePoint is one offered rate of the open-loop sweep.
type ratePoint struct {
	offered  int
	achieved float64 // 2xx answers a second, of requests due in the measured time
	p50, p99 time.Duration
	failed   int64 // due in the measured time and not answered 2xx in time
	keptUp   bool
}

// openLoop offers rate requests a second for warmup+duration over conns
// connections, on a fixed schedule whatever the answers take (requests
// wait for a free connection when all are busy). Latency runs from when a
// request was due, not when it was sent, so a target that falls behind
// shows its backlog instead of slowing the offered load.
func openLoop(url string, conns, rate int, warmup, duration time.Duration) ratePoint {
	client, done := newClient(conns)
	defer done()
	total := int(float64(rate) * (warmup + duration).Seconds())
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	measureFrom, measureTo := start.Add(warmup), start.Add(warmup+duration)
	// Requests still waiting 5 s after the schedule ends are given up.
	ctx, cancel := context.WithDeadline(context.Background(), measureTo.Add(5*time.Second))
	defer cancel()

	due := make(chan time.Time, total)
	go func() {
		defer close(due)
		for i := 0; i < total; {
			for now := time.Since(start); i < total && time.Duration(i)*interval <= now; i++ {
				due <- start.Add(time.Duration(i) * interval)
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()

	var mu sync.Mutex
	var all []time.Duration // of requests due in the measured time, answered 2xx
	var doneInWindow int64  // 2xx answers that arrived in the measured time
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			var lat []time.Duration
			var inWindow int64
			for at := range due {
				if ctx.Err() != nil {
					continue // drain: these count as failed
				}
				code, err := post(ctx, client, url, eventBody(uuidV4()))
				if err != nil || code/100 != 2 {
					continue
				}
				now := time.Now()
				if !now.Before(measureFrom) && now.Before(measureTo) {
					inWindow++
				}
				if !at.Before(measureFrom) && at.Before(measureTo) {
					lat = append(lat, now.Sub(at))
				}
			}
			mu.Lock()
			all = append(all, lat...)
			doneInWindow += inWindow
			mu.Unlock()
		})
	}
	wg.Wait()
	dueMeasured := int64(float64(rate) * duration.Seconds())
	p := ratePoint{offered: rate, achieved: float64(doneInWindow) / duration.Seconds(), failed: max(0, dueMeasured-int64(len(all)))}
	p.p50, p.p99 = percentiles(all)
	// Kept up: answered at (nearly) the offered rate while it was offered,
	// and (nearly) every request answered at all. A target that falls
	// behind answers at its own pace while its backlog grows.
	p.keptUp = p.achieved >= 0.95*float64(rate) && p.failed*100 <= dueMeasured
	return p
}
