package webpush

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/nodetest"
)

// TestWebPushTestingTakesWhatWeSend holds the sender to an implementation
// of the protocol we did not write: web-push-testing (npm), a push service
// stand-in that decrypts every message with the subscription's private key
// (http_ece) and verifies its VAPID token (jsonwebtoken, against the
// subscription's applicationServerKey) before it keeps the plaintext. It
// does not report the TTL, Urgency and Topic headers (it checks only that
// TTL is a number); TestSendPostsOneEncryptedMessageWithItsHeaders does.
func TestWebPushTestingTakesWhatWeSend(t *testing.T) {
	t.Parallel()
	svc := startWebPushTesting(t)
	key := newKey(t)

	t.Run("messages arrive decrypted, byte for byte", func(t *testing.T) {
		t.Parallel()
		sub, hash := svc.subscribe(t, key.PublicKey())
		sender := newSender(t, key)
		payloads := []string{
			`{"title":"Build finished","body":"spoolcast#1234 passed"}`,
			"héllo, wörld ✓ 🚀",
			"",
			strings.Repeat("x", MaxPayload),
		}
		msgs := []Message{
			{TTL: time.Hour, Urgency: UrgencyHigh, Topic: TopicFor("build:1234")},
			{TTL: -1, Urgency: UrgencyVeryLow},
			{},
			{Urgency: UrgencyNormal},
		}
		for i, p := range payloads {
			msgs[i].Payload = []byte(p)
			res := sender.Send(context.Background(), sub, msgs[i])
			if res.Outcome != Delivered || res.Status != http.StatusCreated {
				t.Fatalf("send %d: %v %d: %v", i, res.Outcome, res.Status, res.Err)
			}
		}
		got := svc.messages(t, hash)
		if len(got) != len(payloads) {
			t.Fatalf("the push service has %d messages, want %d", len(got), len(payloads))
		}
		for i := range payloads {
			if got[i] != payloads[i] {
				t.Errorf("message %d decrypted as %.80q, want %.80q", i, got[i], payloads[i])
			}
		}
	})

	t.Run("a token signed with another key is rejected", func(t *testing.T) {
		t.Parallel()
		sub, hash := svc.subscribe(t, key.PublicKey())
		other := newKey(t)
		// Another key, named in k: refused as not the subscription's.
		res := newSender(t, other).Send(context.Background(), sub, Message{Payload: []byte("a")})
		if res.Outcome != Rejected || res.Status != http.StatusBadRequest {
			t.Errorf("another key: %v %d (%v), want rejected 400", res.Outcome, res.Status, res.Err)
		}
		// The subscription's key in k, but signed by another: refused when
		// the signature is checked.
		forged := *other
		forged.public = key.public
		res = newSender(t, &forged).Send(context.Background(), sub, Message{Payload: []byte("b")})
		if res.Outcome != Rejected || res.Status != http.StatusBadRequest {
			t.Errorf("forged signature: %v %d (%v), want rejected 400", res.Outcome, res.Status, res.Err)
		}
		if got := svc.messages(t, hash); len(got) != 0 {
			t.Errorf("the push service kept %q", got)
		}
	})

	t.Run("an expired token is rejected", func(t *testing.T) {
		t.Parallel()
		sub, _ := svc.subscribe(t, key.PublicKey())
		sender := newSender(t, key)
		sender.clock = clock.NewFake(time.Now().Add(-tokenLifetime - time.Minute))
		res := sender.Send(context.Background(), sub, Message{Payload: []byte("late")})
		if res.Outcome != Rejected || res.Status != http.StatusBadRequest {
			t.Errorf("a token expired a minute ago: %v %d (%v), want rejected", res.Outcome, res.Status, res.Err)
		}
	})

	t.Run("an expired subscription is gone", func(t *testing.T) {
		t.Parallel()
		sub, hash := svc.subscribe(t, key.PublicKey())
		svc.post(t, "/expire-subscription/"+hash, nil, nil)
		res := newSender(t, key).Send(context.Background(), sub, Message{Payload: []byte("anyone?")})
		if res.Outcome != Gone || res.Status != http.StatusGone {
			t.Errorf("%v %d (%v), want gone 410", res.Outcome, res.Status, res.Err)
		}
	})
}

// webPushTesting is a running web-push-testing, on a loopback port.
type webPushTesting struct{ url string }

// startWebPushTesting runs testdata/npm/server.js, web-push-testing's server
// on a port the kernel picks, until the test ends.
func startWebPushTesting(t *testing.T) *webPushTesting {
	t.Helper()
	node := nodetest.Node(t)
	nodetest.Install(t, "testdata/npm")
	cmd := exec.Command(node, "server.js")
	cmd.Dir = "testdata/npm"
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
	svc := &webPushTesting{url: "http://127.0.0.1:" + strconv.Itoa(ready.Port)}
	svc.post(t, "/status", nil, nil)
	return svc
}

// subscribe makes a subscription for applicationServerKey, as a browser's
// pushManager.subscribe would; it returns it and its id at the service.
func (s *webPushTesting) subscribe(t *testing.T, applicationServerKey string) (Subscription, string) {
	t.Helper()
	var out struct{ Data json.RawMessage }
	s.post(t, "/subscribe", map[string]string{"applicationServerKey": applicationServerKey, "userVisibleOnly": "true"}, &out)
	sub, err := ParseSubscription(out.Data)
	if err != nil {
		t.Fatalf("the subscription web-push-testing made, %s: %v", out.Data, err)
	}
	var hash struct{ ClientHash string }
	if err := json.Unmarshal(out.Data, &hash); err != nil || hash.ClientHash == "" {
		t.Fatalf("no clientHash in %s", out.Data)
	}
	return sub, hash.ClientHash
}

// messages returns the plaintexts of the messages the subscription got.
func (s *webPushTesting) messages(t *testing.T, hash string) []string {
	t.Helper()
	var out struct{ Data struct{ Messages []string } }
	s.post(t, "/get-notifications", map[string]string{"clientHash": hash}, &out)
	return out.Data.Messages
}

// post calls the service's API, which answers 200 when it is pleased.
func (s *webPushTesting) post(t *testing.T, path string, in, out any) {
	t.Helper()
	body := []byte("{}")
	if in != nil {
		body, _ = json.Marshal(in)
	}
	resp, err := http.Post(s.url+path, "application/json", bytes.NewReader(body))
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
