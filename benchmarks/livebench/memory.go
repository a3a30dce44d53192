package main

// Memory per idle socket: central against a bare server.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/spoolcast/spoolcast/internal/wsclient"
)

// settle is how long the servers are left idle before their memory is read.
const settle = 10 * time.Second

type memory struct{ rssPerConn, heapPerConn, stackPerConn float64 }

// measureIdle opens one socket per token, waits for each to be ready (its
// first frame, for central), lets the server settle, and returns the
// growth of its memory per socket.
func measureIdle(pid int, base string, tokens []string, ready bool) (memory, []*wsclient.Conn, error) {
	time.Sleep(2 * time.Second)
	rss0 := rss(pid)
	heap0, stack0 := goMemory(base)
	sockets := make([]*wsclient.Conn, len(tokens))
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i, token := range tokens {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, err := wsclient.Dial(context.Background(), base, token, "")
			if err == nil && ready {
				var m wsclient.Message
				if m, err = c.Next(30 * time.Second); err == nil && m.Type != "ready" {
					err = fmt.Errorf("first frame %s", m.Raw)
				}
			}
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
				return
			}
			sockets[i] = c
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		return memory{}, sockets, fmt.Errorf("%d sockets failed to open: %v", n, firstErr.Load())
	}
	time.Sleep(settle)
	n := float64(len(tokens))
	heap1, stack1 := goMemory(base)
	return memory{
		rssPerConn:   float64(rss(pid)-rss0) / n,
		heapPerConn:  float64(heap1-heap0) / n,
		stackPerConn: float64(stack1-stack0) / n,
	}, sockets, nil
}

// serveBare is the baseline server: upgrade, then a goroutine per
// connection blocked reading frames.
func serveBare(addr string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {}) // no Go metrics: RSS only
	mux.HandleFunc("/v1/stream", func(w http.ResponseWriter, r *http.Request) {
		conn, _, _, err := ws.UpgradeHTTP(r, w)
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			for {
				h, err := ws.ReadHeader(conn)
				if err != nil {
					return
				}
				if _, err := io.CopyN(io.Discard, conn, h.Length); err != nil {
					return
				}
			}
		}()
	})
	fmt.Fprintln(os.Stderr, http.ListenAndServe(addr, mux))
	os.Exit(1)
}

// rss is the process's resident set in bytes.
func rss(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// goMemory reads the heap in use and the goroutine stacks from /metrics.
func goMemory(base string) (heap, stack int64) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		line := s.Text()
		if v, ok := strings.CutPrefix(line, "go_memstats_heap_inuse_bytes "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			heap = int64(f)
		}
		if v, ok := strings.CutPrefix(line, "go_memstats_stack_inuse_bytes "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			stack = int64(f)
		}
	}
	return heap, stack
}

func closeAll(sockets []*wsclient.Conn) {
	for _, c := range sockets {
		if c != nil {
			_ = c.Close()
		}
	}
}
