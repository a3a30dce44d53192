package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/proctest"
)

func TestFirstSignalDrainsAndSecondExitsAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay as a subprocess")
	}
	addr := proctest.FreeAddr(t)
	p := proctest.Start(t, nil, "relay", "--producer", "p", "--listen", addr, "--spool", filepath.Join(t.TempDir(), "spool.db"), "--shutdown-timeout", "60s")
	p.WaitHealthy("http://" + addr)

	// A request still arriving keeps the graceful shutdown waiting for it.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"idempotency_key\":")
	time.Sleep(100 * time.Millisecond) // let the server start reading the body

	p.Signal(syscall.SIGTERM)
	select {
	case <-p.Done():
		t.Fatal("the first signal did not wait for the request in flight")
	case <-time.After(500 * time.Millisecond):
	}
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the second signal did not exit at once")
	}
	if code := p.ExitCode(); code != 130 {
		t.Errorf("exit code %d after a second signal, want 130", code)
	}
}

func TestClosingTheTerminalStopsGracefully(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay as a subprocess")
	}
	addr := proctest.FreeAddr(t)
	spool := filepath.Join(t.TempDir(), "spool.db")
	p := proctest.Start(t, nil, "relay", "--producer", "p", "--listen", addr, "--spool", spool)
	p.WaitHealthy("http://" + addr)
	p.Signal(syscall.SIGHUP)
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("SIGHUP did not stop the relay")
	}
	if code := p.ExitCode(); code != 0 {
		t.Errorf("exit code %d after SIGHUP, want 0 (a clean stop)", code)
	}
	if _, err := os.Stat(spool + "-wal"); err == nil {
		if fi, _ := os.Stat(spool + "-wal"); fi.Size() != 0 {
			t.Errorf("the WAL holds %d bytes after SIGHUP: the spool was not closed cleanly", fi.Size())
		}
	}
}
