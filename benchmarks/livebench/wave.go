package main

// The reconnect wave: a replica holding many sockets is killed and every one
// of them reconnects, with its cursor, to the replica that survives, while
// that replica's own sockets keep receiving notifications. What it measures:
// the time until every moved socket is ready again, the Postgres CPU each
// resume costs, and the commit → frame latency of the sockets that did not
// move, during the wave.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spoolcast/spoolcast/internal/wsclient"
)

// waveResult is what one wave measured.
type waveResult struct {
	allReady     time.Duration // from the kill to the last moved socket's ready frame
	failed       int           // moved sockets that never got ready
	cpuPerResume time.Duration // Postgres CPU per moved socket, above the load's own
	stay         latency       // frames of the sockets that did not move, committed during the wave
}

// runWave starts two central replicas from bin on dbURL, opens movers
// sockets to the first and stayers to the second, commits rate
// notifications a second to the stayers' users, kills the first and moves
// every one of its sockets to the second.
func runWave(ctx context.Context, e env, bin string, movers, stayers, rate int) (waveResult, error) {
	var res waveResult
	var bases []string
	var procs []*procHandle
	for range 2 {
		cmd, base, err := startCentral(e, bin, "--max-sockets-per-user", "4", "--rate-limit-user", "off", "--log-level", "error")
		if cmd != nil {
			procs = append(procs, &procHandle{cmd: cmd})
		}
		if err != nil {
			for _, p := range procs {
				stop(p.cmd)
			}
			return res, err
		}
		bases = append(bases, base)
	}
	defer func() {
		for _, p := range procs {
			if !p.killed {
				stop(p.cmd)
			}
		}
	}()
	token := func(u string) string {
		t, err := e.issuer.Mint(u, nil, 2*time.Hour)
		if err != nil {
			panic(err) // a key of our own always signs
		}
		return t
	}
	moverUsers := make([]string, movers)
	cursors := make([]string, movers)
	sockets := make([]*wsclient.Conn, movers)
	if err := openAll(movers, func(i int) error {
		moverUsers[i] = "mover-" + strconv.Itoa(i)
		c, err := wsclient.Dial(ctx, bases[0], token(moverUsers[i]), "")
		if err != nil {
			return err
		}
		m, err := c.Next(30 * time.Second)
		if err != nil || m.Type != "ready" {
			return fmt.Errorf("first frame %s: %v", m.Raw, err)
		}
		sockets[i], cursors[i] = c, m.Cursor
		return nil
	}); err != nil {
		return res, fmt.Errorf("open the movers: %w", err)
	}
	stayerUsers := make([]string, stayers)
	stay := make([]*wsclient.Conn, stayers)
	if err := openAll(stayers, func(i int) error {
		stayerUsers[i] = "stayer-" + strconv.Itoa(i)
		c, err := wsclient.Dial(ctx, bases[1], token(stayerUsers[i]), "")
		if err != nil {
			return err
		}
		if m, err := c.Next(30 * time.Second); err != nil || m.Type != "ready" {
			return fmt.Errorf("first frame %s: %v", m.Raw, err)
		}
		stay[i] = c
		return nil
	}); err != nil {
		return res, fmt.Errorf("open the stayers: %w", err)
	}
	defer closeAll(stay)

	// The stayers' frames, timed from their commit's return.
	var mu sync.Mutex
	commits := newCommitTimes()
	type sample struct {
		at  time.Time
		lat time.Duration
	}
	var samples []sample
	var readers sync.WaitGroup
	for _, c := range stay {
		readers.Go(func() {
			for {
				m, err := c.Next(2 * time.Minute)
				if err != nil {
					return
				}
				now := time.Now()
				if m.Type != "notification" {
					continue
				}
				it, err := m.Item()
				if err != nil {
					continue
				}
				lat := commits.arrived(it.Title, now)
				mu.Lock()
				samples = append(samples, sample{now, lat})
				mu.Unlock()
			}
		})
	}
	stopLoad := startLoad(ctx, e, "livebench-wave", rate, func() string { return stayerUsers[rand.N(stayers)] }, commits)
	defer stopLoad()

	// The load's own Postgres CPU, over as long as the wave will take.
	time.Sleep(2 * time.Second)
	before, t0 := e.cluster.CPU(), time.Now()
	time.Sleep(3 * time.Second)
	loadCPU := float64(e.cluster.CPU()-before) / float64(time.Since(t0))

	closeAll(sockets) // the client side of the killed replica's sockets
	_ = procs[0].cmd.Process.Signal(syscall.SIGKILL)
	_ = procs[0].cmd.Wait()
	procs[0].killed = true
	killed, cpu0 := time.Now(), e.cluster.CPU()
	var failed atomic.Int64
	moved := make([]*wsclient.Conn, movers)
	_ = openAll(movers, func(i int) error {
		for try := 0; ; try++ {
			c, err := wsclient.Dial(ctx, bases[1], token(moverUsers[i]), cursors[i])
			if err == nil {
				for {
					m, err := c.Next(time.Minute)
					if err != nil {
						break
					}
					if m.Type == "ready" {
						moved[i] = c
						return nil
					}
				}
				c.Close()
			}
			if try == 20 || !strings.Contains(fmt.Sprint(err), "HTTP 503") && err != nil && try > 3 {
				failed.Add(1)
				return err
			}
			time.Sleep(time.Duration(50+rand.N(200)) * time.Millisecond)
		}
	})
	res.allReady = time.Since(killed)
	waveCPU := float64(e.cluster.CPU() - cpu0)
	res.failed = int(failed.Load())
	res.cpuPerResume = time.Duration((waveCPU - loadCPU*float64(res.allReady)) / float64(movers))
	defer closeAll(moved)
	time.Sleep(2 * time.Second)
	stopLoad()
	time.Sleep(5 * time.Second) // for the frames the wave held back
	for _, c := range stay {
		_ = c.Close()
	}
	readers.Wait()

	mu.Lock()
	defer mu.Unlock()
	var during []time.Duration
	for _, s := range samples { // committed while the wave lasted, whenever they arrived
		if at := s.at.Add(-s.lat); !at.Before(killed) && at.Before(killed.Add(res.allReady)) {
			during = append(during, s.lat)
		}
	}
	if len(during) == 0 {
		var last time.Time
		for _, s := range samples {
			if s.at.After(last) {
				last = s.at
			}
		}
		return res, fmt.Errorf("no frame committed during the wave reached a stayer (%d frames in all, the last %s after the kill; the wave took %s)",
			len(samples), last.Sub(killed).Round(time.Millisecond), res.allReady.Round(time.Millisecond))
	}
	slices.Sort(during)
	q := func(p float64) time.Duration { return during[min(len(during)-1, int(p*float64(len(during))))] }
	res.stay = latency{n: len(during), p50: q(.50), p90: q(.90), p99: q(.99), max: during[len(during)-1]}
	return res, nil
}

type procHandle struct {
	cmd    *exec.Cmd
	killed bool
}

// openAll runs open for 0..n-1, 256 at a time, and returns the first error.
func openAll(n int, open func(i int) error) error {
	var first atomic.Value
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := open(i); err != nil {
				first.CompareAndSwap(nil, err)
			}
		})
	}
	wg.Wait()
	if err, ok := first.Load().(error); ok {
		return err
	}
	return nil
}
