package main

// The reading run: what live reading costs Postgres per replica. Each
// replica's reader reads once per wake-up (at most every 20 ms while ingest
// commits), whatever its sockets, so the cost grows with the replicas, not
// with the load. With n replicas holding a few sockets each and a fixed
// ingest, it measures over a window the CPU of the Postgres backends that
// serve the readers (found by their statements in pg_stat_activity), their
// reads (spoolcast_live_reads_total), and the whole cluster's CPU.

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/internal/wsclient"
)

// readingResult is what one reading run measured.
type readingResult struct {
	replicas     int
	reads        float64       // reads a second, per replica
	readerCPU    time.Duration // the readers' backends' CPU a second, per replica
	perRead      time.Duration // the readers' backends' CPU per read
	listenCPU    time.Duration // the LISTEN backends' CPU a second, per replica
	clusterCPU   time.Duration // every Postgres process's CPU a second
	framesPerSec float64       // frames the sockets received a second
}

// readerStatements are in the text of the reader's two reads, one each,
// and of no other statement (a resume's probe reads one user's rows:
// h.user_id), in this binary and in earlier ones.
var readerStatements = []string{`FROM notifications h WHERE h.tx >= s.hz`, `FROM read_events h WHERE h.tx >= s.hz`}

// runReading starts replicas centrals from bin, opens sockets on each,
// commits rate notifications a second to their users and measures live
// reading over window.
func runReading(ctx context.Context, e env, bin string, replicas, sockets, rate int, window time.Duration) (readingResult, error) {
	res := readingResult{replicas: replicas}
	var bases []string
	for range replicas {
		c, base, err := startCentral(e, bin, "--log-level", "error")
		if c != nil {
			defer stop(c)
		}
		if err != nil {
			return res, err
		}
		bases = append(bases, base)
	}
	var users []string
	var conns []*wsclient.Conn
	defer func() { closeAll(conns) }()
	for r, base := range bases {
		for i := range sockets {
			u := fmt.Sprintf("reading-%d-%d", r, i)
			token, err := e.issuer.Mint(u, nil, 2*time.Hour)
			if err != nil {
				return res, err
			}
			c, err := wsclient.Dial(ctx, base, token, "")
			if err != nil {
				return res, err
			}
			conns = append(conns, c)
			if m, err := c.Next(30 * time.Second); err != nil || m.Type != "ready" {
				return res, fmt.Errorf("first frame %s: %v", m.Raw, err)
			}
			users = append(users, u)
		}
	}
	var frames sync.WaitGroup
	var mu sync.Mutex
	received := 0
	for _, c := range conns {
		frames.Go(func() {
			for {
				m, err := c.Next(time.Minute)
				if err != nil {
					return
				}
				if m.Type == "notification" {
					mu.Lock()
					received++
					mu.Unlock()
				}
			}
		})
	}
	stopLoad := startLoad(ctx, e, "reading", rate, func() string { return users[rand.N(len(users))] }, nil)
	defer stopLoad()

	time.Sleep(3 * time.Second) // every reader reading at the load's pace
	readers, listeners, err := readerBackends(ctx, e, replicas)
	if err != nil {
		return res, err
	}
	reads0 := 0.0
	for _, b := range bases {
		reads0 += readsOK(b)
	}
	mu.Lock()
	frames0 := received
	mu.Unlock()
	r0, l0, c0, t0 := cpuOf(readers), cpuOf(listeners), e.cluster.CPU(), time.Now()
	time.Sleep(window)
	r1, l1, c1, el := cpuOf(readers), cpuOf(listeners), e.cluster.CPU(), time.Since(t0)
	reads1 := 0.0
	for _, b := range bases {
		reads1 += readsOK(b)
	}
	mu.Lock()
	frames1 := received
	mu.Unlock()
	stopLoad()
	closeAll(conns)
	frames.Wait()

	perSecond := func(d time.Duration) time.Duration { return time.Duration(float64(d) / el.Seconds()) }
	n := float64(replicas)
	res.reads = (reads1 - reads0) / el.Seconds() / n
	res.readerCPU = time.Duration(float64(perSecond(r1-r0)) / n)
	res.listenCPU = time.Duration(float64(perSecond(l1-l0)) / n)
	res.clusterCPU = perSecond(c1 - c0)
	if reads1 > reads0 {
		res.perRead = time.Duration(float64(r1-r0) / (reads1 - reads0))
	}
	res.framesPerSec = float64(frames1-frames0) / el.Seconds()
	return res, nil
}

// readerBackends finds the pids of the Postgres backends serving the
// replicas' readers and their LISTEN connections.
func readerBackends(ctx context.Context, e env, replicas int) (readers, listeners []int, err error) {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		readers, listeners = nil, nil
		rows, err := e.pool.Query(ctx, `SELECT pid, query LIKE 'LISTEN %' FROM pg_stat_activity
			WHERE datname = current_database() AND (strpos(query, $1) > 0 OR strpos(query, $2) > 0 OR query LIKE 'LISTEN %')`, readerStatements[0], readerStatements[1])
		if err != nil {
			return nil, nil, err
		}
		for rows.Next() {
			var pid int
			var listen bool
			if err := rows.Scan(&pid, &listen); err != nil {
				return nil, nil, err
			}
			if listen {
				listeners = append(listeners, pid)
			} else {
				readers = append(readers, pid)
			}
		}
		if err := rows.Err(); err != nil {
			return nil, nil, err
		}
		if len(readers) == replicas {
			return readers, listeners, nil
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("found %d reader backends in pg_stat_activity, want %d", len(readers), replicas)
		}
	}
}

// readsOK is spoolcast_live_reads_total{result="ok"} of a replica.
func readsOK(base string) float64 {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), `spoolcast_live_reads_total{result="ok"} `); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// cpuOf is the user and system CPU time of the processes pids.
func cpuOf(pids []int) time.Duration {
	var ticks int64
	for _, pid := range pids {
		if f := procStat(pid); len(f) > 12 {
			u, _ := strconv.ParseInt(f[11], 10, 64)
			s, _ := strconv.ParseInt(f[12], 10, 64)
			ticks += u + s
		}
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}

// procStat is the fields of /proc/pid/stat after the command's closing
// parenthesis: state is the first, ppid the second, utime the twelfth.
func procStat(pid int) []string {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 || i+2 > len(stat) {
		return nil
	}
	return strings.Fields(string(stat[i+2:]))
}
