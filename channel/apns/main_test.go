package apns

import (
	"context"
	"crypto/ecdsa"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
)

// Every Send's goroutines, the client's connection and the fake's must
// end with their test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testKeyID  = "KEY1234567"
	testTeamID = "TEAM123456"
	testTopic  = "com.example.app"
)

// rig is a Channel talking to a fake APNs that trusts its key.
type rig struct {
	fake *apnstest.Server
	key  *ecdsa.PrivateKey
	ch   *Channel
}

// newRig starts a fake and a Channel for it; edits change the Channel's
// Config (another key, another host).
func newRig(t *testing.T, edits ...func(*Config)) *rig {
	t.Helper()
	key := apnstest.NewKey()
	fake := apnstest.New(testKeyID, testTeamID, &key.PublicKey)
	t.Cleanup(fake.Close)
	cfg := Config{
		Key: key, KeyID: testKeyID, TeamID: testTeamID, Topic: testTopic,
		Host: fake.URL(), RootCAs: fake.CertPool(),
	}
	for _, edit := range edits {
		edit(&cfg)
	}
	ch, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	return &rig{fake: fake, key: key, ch: ch}
}

// send sends msgs with a deadline that fails a hung test, generous for a
// loaded machine under -race.
func (r *rig) send(t *testing.T, msgs ...channel.Message) []channel.Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	return r.ch.Send(ctx, msgs)
}

// deviceToken is a 32-byte device token, in hex, distinct per i.
func deviceToken(i int) string { return fmt.Sprintf("%064x", i+1) }

// message is the ith of a batch: its own device, its own notification.
func message(i int) channel.Message {
	return channel.Message{
		Token: deviceToken(i),
		ID:    fmt.Sprintf("ntf-%d", i),
		Title: "New comment",
		Body:  fmt.Sprintf("comment %d", i),
	}
}

func messages(n int) []channel.Message {
	msgs := make([]channel.Message, n)
	for i := range msgs {
		msgs[i] = message(i)
	}
	return msgs
}

// byToken indexes the fake's requests by device token (the last for each).
func byToken(reqs []apnstest.Request) map[string]apnstest.Request {
	m := map[string]apnstest.Request{}
	for _, r := range reqs {
		m[r.Token] = r
	}
	return m
}

// waitFor waits until cond holds, failing the test after 30s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
