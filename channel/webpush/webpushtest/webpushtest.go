// Package webpushtest runs web-push-testing (npm), a Web Push service
// stand-in that speaks RFC 8030, decrypts every message with the
// subscription's private key (RFC 8291) and checks its VAPID token (RFC
// 8292) before it keeps the plaintext: an implementation spoolcast did not
// write, for tests to send to.
package webpushtest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/nodetest"
)

// npmDir is the package.json of web-push-testing and its runner, beside this file.
func npmDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "npm")
}

// Service is a running web-push-testing, on a loopback port.
type Service struct{ URL string }

// Start runs npm/server.js, web-push-testing's server
// on a port the kernel picks, until the test ends.
func Start(t testing.TB) *Service {
	t.Helper()
	node := nodetest.Node(t)
	nodetest.Install(t, npmDir())
	cmd := exec.Command(node, "server.js")
	cmd.Dir = npmDir()
	stdout := &output{first: make(chan string, 1)}
	stderr := &output{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	stdin, err := cmd.StdinPipe() // it exits when this closes: when the test ends, or the test process dies
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("web-push-testing output:\n%s%s", stdout, stderr)
		}
	})

	var ready struct{ Port int }
	select {
	case line := <-stdout.first:
		if err := json.Unmarshal([]byte(line), &ready); err != nil || ready.Port == 0 {
			t.Fatalf("web-push-testing said %q, want {\"port\": N}", line)
		}
	case err := <-exited:
		t.Fatalf("web-push-testing exited before listening: %v\n%s", err, stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("web-push-testing not listening after 30s\n%s", stderr)
	}
	svc := &Service{URL: "http://127.0.0.1:" + strconv.Itoa(ready.Port)}
	svc.post(t, "/status", nil, nil)
	return svc
}

// Subscribe makes a subscription for applicationServerKey, as a browser's
// pushManager.subscribe would; it returns it as PushSubscription.toJSON()
// has it, and its id at the service.
func (s *Service) Subscribe(t testing.TB, applicationServerKey string) (subscription json.RawMessage, hash string) {
	t.Helper()
	var out struct{ Data json.RawMessage }
	s.post(t, "/subscribe", map[string]string{"applicationServerKey": applicationServerKey, "userVisibleOnly": "true"}, &out)
	var h struct{ ClientHash string }
	if err := json.Unmarshal(out.Data, &h); err != nil || h.ClientHash == "" {
		t.Fatalf("no clientHash in %s", out.Data)
	}
	return out.Data, h.ClientHash
}

// Expire makes the subscription expired: the service answers 410 to it.
func (s *Service) Expire(t testing.TB, hash string) {
	t.Helper()
	s.post(t, "/expire-subscription/"+hash, nil, nil)
}

// Messages returns the plaintexts of the messages the subscription got.
func (s *Service) Messages(t testing.TB, hash string) []string {
	t.Helper()
	var out struct{ Data struct{ Messages []string } }
	s.post(t, "/get-notifications", map[string]string{"clientHash": hash}, &out)
	return out.Data.Messages
}

// post calls the service's API, which answers 200 when it is pleased.
func (s *Service) post(t testing.TB, path string, in, out any) {
	t.Helper()
	body := []byte("{}")
	if in != nil {
		body, _ = json.Marshal(in)
	}
	resp, err := http.Post(s.URL+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("web-push-testing %s: %v", path, err)
	}
	defer resp.Body.Close()
	var raw bytes.Buffer
	_, _ = raw.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("web-push-testing %s: %d %s", path, resp.StatusCode, raw.Bytes())
	}
	if out != nil {
		if err := json.Unmarshal(raw.Bytes(), out); err != nil {
			t.Fatalf("web-push-testing %s: %v in %s", path, err, raw.Bytes())
		}
	}
}

// output keeps what a process prints; first, if set, receives the first line.
type output struct {
	first chan string

	mu     sync.Mutex
	buf    bytes.Buffer
	passed bool // the first line, to first
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Write(p)
	if o.first != nil && !o.passed {
		if line, _, ok := bytes.Cut(o.buf.Bytes(), []byte("\n")); ok {
			o.first <- string(line)
			o.passed = true
		}
	}
	return len(p), nil
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}
