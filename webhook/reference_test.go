package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/nodetest"
	"github.com/spoolcast/spoolcast/webhook"
)

// verified is what the Standard Webhooks reference library made of one delivery.
type verified struct {
	OK      bool            `json:"ok"`
	Error   string          `json:"error"`
	Payload json.RawMessage `json:"payload"`
}

// verify checks each delivery against secret with the standardwebhooks npm
// package, an implementation spoolcast did not write.
func verify(t *testing.T, secret string, ds []delivery) []verified {
	t.Helper()
	return verifyAt(t, secret, ds, time.Time{})
}

// verifyAt is verify with the reference's clock at now (zero: the wall clock).
func verifyAt(t *testing.T, secret string, ds []delivery, now time.Time) []verified {
	t.Helper()
	node := nodetest.Node(t)
	nodetest.Install(t, "testdata/npm")
	type in struct {
		Secret    string `json:"secret"`
		ID        string `json:"id"`
		Timestamp string `json:"timestamp"`
		Signature string `json:"signature"`
		Body      string `json:"body"`
		Now       int64  `json:"now,omitempty"`
	}
	var input []in
	for _, d := range ds {
		var unix int64
		if !now.IsZero() {
			unix = now.Unix()
		}
		input = append(input, in{secret, d.ID, d.Timestamp, d.Signature, string(d.Body), unix})
	}
	raw, _ := json.Marshal(input)
	cmd := exec.Command(node, "testdata/npm/verify.js")
	cmd.Stdin = bytes.NewReader(raw)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node verify.js: %v", err)
	}
	var res []verified
	if err := json.Unmarshal(out, &res); err != nil || len(res) != len(ds) {
		t.Fatalf("verify.js answered %s (%v)", out, err)
	}
	return res
}

func TestSignaturesVerifyWithTheStandardWebhooksReference(t *testing.T) {
	e := newEnv(t, webhook.DelivererConfig{})
	r := newReceiver(t)
	ep := e.endpoint(r.URL, webhook.NotificationCreated)
	e.ingest("before-rotation", "alice", "bob")
	e.pass()
	next, _, err := e.store.RotateSecret(context.Background(), ep.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e.ingest("during-overlap", "alice")
	e.pass()
	got := r.deliveries()
	if len(got) != 3 {
		t.Fatalf("got %d deliveries, want 3", len(got))
	}
	for i, v := range verify(t, ep.Secret, got) {
		if !v.OK {
			t.Errorf("delivery %d with the first secret: %s", i, v.Error)
		}
		var b body
		if json.Unmarshal(v.Payload, &b); v.OK && b.Type != webhook.NotificationCreated {
			t.Errorf("delivery %d: the reference read type %q", i, b.Type)
		}
	}
	for i, v := range verify(t, next, got) {
		if want := i == 2; v.OK != want { // only the one signed during the overlap
			t.Errorf("delivery %d with the rotated-in secret: ok %v, want %v (%s)", i, v.OK, want, v.Error)
		}
	}
	// The reference refuses what it must: a changed body, another secret.
	tampered := append([]delivery(nil), got[0])
	tampered[0].Body = bytes.Replace(tampered[0].Body, []byte("alice"), []byte("mallory"), 1)
	tampered[0].Body = bytes.Replace(tampered[0].Body, []byte("bob"), []byte("mallory"), 1)
	if v := verify(t, ep.Secret, tampered); v[0].OK {
		t.Error("the reference verified a changed body")
	}
	if v := verify(t, webhook.NewSecret(), got[:1]); v[0].OK {
		t.Error("the reference verified with another secret")
	}
}

// TestVerifyAcceptsWhatTheReferenceSigns checks the receiver's side (what
// `spoolcast webhook listen` runs) against signatures the reference made.
func TestVerifyAcceptsWhatTheReferenceSigns(t *testing.T) {
	node := nodetest.Node(t)
	nodetest.Install(t, "testdata/npm")
	secret := webhook.NewSecret()
	now := time.Now()
	ts := strconv.FormatInt(now.Unix(), 10)
	body := `{"type":"notification.created","timestamp":"2026-12-01T19:00:00Z","data":{"id":"x"}}`
	raw, _ := json.Marshal([]map[string]string{{"secret": secret, "id": "msg_1", "timestamp": ts, "body": body}})
	cmd := exec.Command(node, "testdata/npm/sign.js")
	cmd.Stdin = bytes.NewReader(raw)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node sign.js: %v", err)
	}
	var sigs []string
	if err := json.Unmarshal(out, &sigs); err != nil || len(sigs) != 1 {
		t.Fatalf("sign.js answered %s", out)
	}
	if err := webhook.Verify(secret, "msg_1", ts, sigs[0], []byte(body), now, 0); err != nil {
		t.Errorf("the reference's signature: %v", err)
	}
	other := webhook.NewSecret()
	if err := webhook.Verify(secret, "msg_1", ts, "v1,bm90IGl0 "+sigs[0], []byte(body), now, 0); err != nil {
		t.Errorf("two signatures, the second right: %v", err)
	}
	for name, err := range map[string]error{
		"another secret": webhook.Verify(other, "msg_1", ts, sigs[0], []byte(body), now, 0),
		"another id":     webhook.Verify(secret, "msg_2", ts, sigs[0], []byte(body), now, 0),
		"another body":   webhook.Verify(secret, "msg_1", ts, sigs[0], []byte(body+" "), now, 0),
		"stale":          webhook.Verify(secret, "msg_1", ts, sigs[0], []byte(body), now.Add(6*time.Minute), 0),
		"no signature":   webhook.Verify(secret, "msg_1", ts, "", []byte(body), now, 0),
	} {
		if err == nil {
			t.Errorf("%s verified", name)
		}
	}
}
