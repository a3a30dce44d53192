package main

// What each process holds, sampled through the run: RSS, open files,
// goroutines.

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The baseline's span after a start.
const (
	baselineFrom = 10 * time.Second
	baselineTo   = 30 * time.Second
)

// Growth past the baseline that counts as a leak, judged once traffic
// stopped and everything settled: a goroutine or a file leaked per request
// passes these within seconds of traffic.
const (
	goroutineSlack = 100
	fdSlack        = 50
)

// sample is what a process held at one moment.
type sample struct {
	rss        int64 // bytes
	fds        int
	goroutines int
}

// sampler reads each process's RSS, open files and goroutines every few
// seconds, keeping the peak RSS, the latest sample and, per start, the
// baseline: the most goroutines and open files seen between baselineFrom
// and baselineTo after it, warmed up and under traffic.
type sampler struct {
	mu      sync.Mutex
	peakRSS map[string]int64
	latest  map[string]sample
	// refusals are a central's counters of refusals, the latest read of
	// each of its lives ("central-0#2"): a counter starts at 0 with each.
	refusals map[string][2]float64
}

func newSampler() *sampler {
	return &sampler{peakRSS: map[string]int64{}, latest: map[string]sample{}, refusals: map[string][2]float64{}}
}

// totals are the refusals of the deployment's credentials and the
// refusals held for most devices refusing, counted by every life of
// every central.
func (s *sampler) totals() (credentials, held float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.refusals {
		credentials += c[0]
		held += c[1]
	}
	return credentials, held
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
	// One scrape a sample: the goroutines, and a central's refusals.
	names := []string{"go_goroutines"}
	central := strings.HasPrefix(p.name, "central")
	if central {
		names = append(names, "spoolcast_push_credentials_refused_total", "spoolcast_push_refusals_held_total")
	}
	m, err := metrics(p.base, names...)
	if err != nil {
		return
	}
	sm, err := read(pid)
	if err != nil {
		return
	}
	sm.goroutines = int(m["go_goroutines"])
	p.mu.Lock()
	starts := p.starts
	if up := time.Since(p.started); up > baselineFrom && up < baselineTo {
		if p.baseline == nil {
			p.baseline = &sample{}
		}
		p.baseline.goroutines = max(p.baseline.goroutines, sm.goroutines)
		p.baseline.fds = max(p.baseline.fds, sm.fds)
	}
	p.mu.Unlock()
	if central {
		s.mu.Lock()
		s.refusals[fmt.Sprintf("%s#%d", p.name, starts)] = [2]float64{m["spoolcast_push_credentials_refused_total"], m["spoolcast_push_refusals_held_total"]}
		s.mu.Unlock()
	}
	s.mu.Lock()
	s.peakRSS[p.name] = max(s.peakRSS[p.name], sm.rss)
	s.latest[p.name] = sm
	s.mu.Unlock()
}

// read is pid's RSS and open files.
func read(pid int) (sample, error) {
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
	return sm, nil
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
		base, last := p.baseline, s.latest[p.name]
		p.mu.Unlock()
		if base == nil {
			growth = append(growth, p.name+" started too late for a baseline")
			continue
		}
		growth = append(growth, fmt.Sprintf("%s goroutines %d→%d fds %d→%d", p.name, base.goroutines, last.goroutines, base.fds, last.fds))
		if last.goroutines > base.goroutines+goroutineSlack || last.fds > base.fds+fdSlack {
			grew = true
		}
	}
	s.mu.Unlock()
	return []invariant{
		{"producers saw no 5xx but 503 with Retry-After", len(bad) == 0, fmt.Sprintf("answers %s; %s", strings.Join(answers, " "), strings.Join(bad, ", "))},
		{"relay RSS stayed under the sidecar limit (256 MiB)", !overLimit, "peak " + strings.Join(rss, ", ")},
		{fmt.Sprintf("no process holds more goroutines or open files settled than under traffic (baseline %s–%s after its start, +%d goroutines, +%d files)", baselineFrom, baselineTo, goroutineSlack, fdSlack),
			!grew, strings.Join(growth, "; ")},
	}
}
