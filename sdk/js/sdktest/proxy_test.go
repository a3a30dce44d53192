package sdktest

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxy is the app's one address in front of the replicas: each new
// connection goes to the first replica that accepts it, in order, so that
// while replica 0 lives every stream is on it, and a connection made while
// it is down goes to the next. It can drop every connection it carries (a
// network that broke) and refuse WebSocket upgrades (a proxy that does not
// pass them), answering 403 to a connection whose first request asks for
// one.
type proxy struct {
	ln       net.Listener
	backends func() []string

	refuseUpgrades atomic.Bool

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newProxy(backends func() []string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, backends: backends, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

// URL is the proxy's base URL.
func (p *proxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.handle(c) })
	}
}

// track remembers c until it is closed; it refuses once the proxy is closed.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	c.Close()
}

func (p *proxy) handle(client net.Conn) {
	if !p.track(client) {
		client.Close()
		return
	}
	defer p.untrack(client)
	in := bufio.NewReaderSize(client, 8192)
	if p.refuseUpgrades.Load() {
		_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
		head, err := requestHead(in)
		if err != nil {
			return
		}
		if bytes.Contains(bytes.ToLower(head), []byte("\nupgrade: websocket")) {
			_, _ = io.WriteString(client, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 22\r\nConnection: close\r\n\r\nno upgrades past here\n")
			return
		}
		_ = client.SetReadDeadline(time.Time{})
	}
	var backend net.Conn
	for _, addr := range p.backends() {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			backend = c
			break
		}
	}
	if backend == nil || !p.track(backend) {
		if backend != nil {
			backend.Close()
		}
		return
	}
	defer p.untrack(backend)
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(backend, in)
		backend.Close()
		close(done)
	}()
	_, _ = io.Copy(client, backend)
	client.Close()
	<-done
}

// requestHead peeks at the head of the first request (through its blank
// line, or the first 8 KiB), leaving it to be forwarded.
func requestHead(in *bufio.Reader) ([]byte, error) {
	for n := 1; ; {
		if _, err := in.Peek(n); err != nil {
			return nil, err
		}
		buf, _ := in.Peek(in.Buffered())
		if bytes.Contains(buf, []byte("\r\n\r\n")) || len(buf) == in.Size() {
			return buf, nil
		}
		n = len(buf) + 1
	}
}

// drop closes every connection the proxy carries, as a broken network would.
func (p *proxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Close stops accepting, drops every connection and waits for the proxy's
// goroutines.
func (p *proxy) Close() {
	p.ln.Close()
	p.drop()
	p.mu.Lock()
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
