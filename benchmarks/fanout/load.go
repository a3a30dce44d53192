package main

// The load the phases drive: topic events and the Fanout instances writing
// them, direct events offered open loop, and their latency summaries.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/topics"
)

// ingestTopicEvent ingests the benchmark's topic event under key, as the
// API would.
func (b *bench) ingestTopicEvent(ctx context.Context, key string) error {
	ev, err := topicEvent(key)
	if err != nil {
		return err
	}
	res, err := ingest.Ingest(ctx, b.pool, []ingest.Item{{Producer: producer, Event: ev}})
	if err != nil {
		return err
	}
	if res[0].Outcome != event.Accepted || !res[0].Fanouts {
		return fmt.Errorf("ingest %s: %+v; want accepted with a fan-out", key, res[0])
	}
	return nil
}

func topicEvent(key string) (event.Event, error) {
	body, err := json.Marshal(map[string]any{"idempotency_key": key, "type": "launch", "title": "Launch", "topics": []string{topic}})
	if err != nil {
		return event.Event{}, err
	}
	return event.Decode(body, "")
}

// waitFor polls the fan-out of key until done says so; it gives up if an
// instance failed for good. With rates, it prints the progress every tenth
// of the members and appends each tenth's rows a second to rates.
func (b *bench) waitFor(ctx context.Context, key string, run *fanouts, done func(topics.FanoutStatus) bool, rates *[]float64) (topics.FanoutStatus, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	var shown, lastWritten int64
	last := start
	for {
		select {
		case <-run.failed:
			return topics.FanoutStatus{}, run.err()
		case <-tick.C:
		}
		list, _, err := b.store.Fanouts(ctx, topics.FanoutFilter{IdempotencyKey: key})
		if err != nil {
			return topics.FanoutStatus{}, err
		}
		if len(list) != 1 {
			return topics.FanoutStatus{}, fmt.Errorf("%d fan-outs of %s; want one", len(list), key)
		}
		st := list[0]
		if rates != nil && st.Written*10/int64(b.members) > shown {
			shown = st.Written * 10 / int64(b.members)
			now := time.Now()
			rate := float64(st.Written-lastWritten) / now.Sub(last).Seconds()
			*rates = append(*rates, rate)
			fmt.Printf("   %s written at %s (%s rows/s since the last line)\n", commas(st.Written), now.Sub(start).Round(100*time.Millisecond),
				commas(int64(rate)))
			last, lastWritten = now, st.Written
		}
		if done(st) {
			return st, nil
		}
	}
}

// fanouts are the instances writing, each in a goroutine of its own,
// stepping until stopped.
type fanouts struct {
	stopping chan struct{}
	failed   chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	counts   []int
	steps    []step
	failure  error
	failOnce sync.Once
}

// startFanouts starts the instances: each Steps, and sleeps a moment when
// it found nothing (another instance holds the split, or every range) or
// failed, as its interval would have it look again.
func (b *bench) startFanouts(ctx context.Context) *fanouts {
	run := &fanouts{stopping: make(chan struct{}), failed: make(chan struct{}), counts: make([]int, b.workers)}
	for i := range b.workers {
		f, err := topics.NewFanout(topics.FanoutConfig{DB: b.pool, Workers: 1, BatchSize: b.batch, PushRate: topics.DefaultPushRate})
		if err != nil {
			run.fail(err)
			break
		}
		run.wg.Add(1)
		go func() {
			defer run.wg.Done()
			failures := 0
			for {
				select {
				case <-run.stopping:
					return
				case <-run.failed:
					return
				default:
				}
				t := time.Now()
				did, err := f.Step(ctx)
				if err != nil {
					if failures++; failures >= maxFailures {
						run.fail(fmt.Errorf("instance %d: %d Steps in a row failed, the last: %w", i, failures, err))
						return
					}
					time.Sleep(stepPause)
					continue
				}
				failures = 0
				if !did {
					time.Sleep(stepPause)
					continue
				}
				took := time.Since(t)
				run.mu.Lock()
				run.counts[i]++
				run.steps = append(run.steps, step{start: t, took: took})
				run.mu.Unlock()
			}
		}()
	}
	return run
}

func (r *fanouts) fail(err error) {
	r.failOnce.Do(func() {
		r.mu.Lock()
		r.failure = err
		r.mu.Unlock()
		close(r.failed)
	})
}

func (r *fanouts) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failure
}

// stop stops the instances after their Steps in flight.
func (r *fanouts) stop() (*fanouts, error) {
	close(r.stopping)
	r.wg.Wait()
	return r, r.err()
}

// step is a Step that found work.
type step struct {
	start time.Time
	took  time.Duration
}

// times are how long the split took and the batches: the first Step to
// find work is the split, which holds the fan-out while the others find
// nothing. (The last batch completes the fan-out in its Step.)
func (r *fanouts) times() (split time.Duration, batches summary) {
	if len(r.steps) == 0 {
		return 0, summary{}
	}
	steps := slices.SortedFunc(slices.Values(r.steps), func(a, b step) int { return a.start.Compare(b.start) })
	var ds []time.Duration
	for _, s := range steps[1:] {
		ds = append(ds, s.took)
	}
	return steps[0].took, summarize(ds)
}

// directLoad offers direct events open loop.
type directLoad struct {
	stopping chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	lat      []time.Duration
	sent     int
	failures int
	firstErr error
}

// offerDirect offers direct events to random members at b.rate a second
// until stopped: a scheduler queues each at its due time, and the senders
// send them as they come. A due time never waits for a sender; a late
// sender's wait is part of the latency.
func (b *bench) offerDirect(ctx context.Context, tag string) *directLoad {
	d := &directLoad{stopping: make(chan struct{})}
	due := make(chan time.Time, 1<<16)
	interval := time.Second / time.Duration(b.rate)
	start := time.Now()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer close(due)
		for i := 0; ; i++ {
			at := start.Add(time.Duration(i) * interval)
			t := time.NewTimer(time.Until(at))
			select {
			case <-d.stopping:
				t.Stop()
				return
			case <-t.C:
			}
			select {
			case due <- at:
			case <-d.stopping:
				return
			}
		}
	}()
	var seq sync.Mutex
	n := 0
	for range directSenders {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			for at := range due {
				seq.Lock()
				n++
				key := fmt.Sprintf("direct-%s-%d", tag, n)
				seq.Unlock()
				err := sendDirect(ctx, b.pool, key, member(rand.IntN(b.members)))
				lat := time.Since(at)
				d.mu.Lock()
				d.sent++
				if err != nil {
					d.failures++
					if d.firstErr == nil {
						d.firstErr = err
					}
				} else {
					d.lat = append(d.lat, lat)
				}
				d.mu.Unlock()
			}
		}()
	}
	return d
}

// sendDirect ingests one direct event to user, one event a call, as the
// API's ingress does for a request of one event.
func sendDirect(ctx context.Context, pool *pgxpool.Pool, key, user string) error {
	body, err := json.Marshal(map[string]any{"idempotency_key": key, "type": "direct", "title": "Hello", "recipients": []string{user}})
	if err != nil {
		return err
	}
	ev, err := event.Decode(body, "")
	if err != nil {
		return err
	}
	res, err := ingest.Ingest(ctx, pool, []ingest.Item{{Producer: producer, Event: ev}})
	if err != nil {
		return err
	}
	if res[0].Outcome != event.Accepted || res[0].Created != 1 {
		return fmt.Errorf("direct event %s: %+v; want accepted, one created", key, res[0])
	}
	return nil
}

// stop stops offering; the events already due are still sent.
func (d *directLoad) stop() *directLoad {
	close(d.stopping)
	d.wg.Wait()
	return d
}

func (d *directLoad) check() error {
	switch {
	case d.failures > 0:
		return fmt.Errorf("%d of %d direct events failed, the first: %w", d.failures, d.sent, d.firstErr)
	case d.sent == 0:
		return errors.New("no direct event was sent")
	}
	return nil
}

func (d *directLoad) summary() summary { return summarize(d.lat) }

type summary struct{ p50, p99, max time.Duration }

func summarize(ds []time.Duration) summary {
	if len(ds) == 0 {
		return summary{}
	}
	s := slices.Sorted(slices.Values(ds))
	at := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return summary{p50: at(.5), p99: at(.99), max: s[len(s)-1]}
}

func (s summary) String() string {
	return fmt.Sprintf("p50 %s, p99 %s, max %s", round(s.p50), round(s.p99), round(s.max))
}

// round rounds d for reading.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	default:
		return d.Round(10 * time.Microsecond)
	}
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
