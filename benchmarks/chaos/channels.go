package main

// The direct channels: a fake APNs (TLS, HTTP/2, JWT checked) and a fake
// FCM with its OAuth token endpoint, which the centrals send to beside
// Expo. A third of the app users have an APNs device and a third an FCM
// device, besides their Expo phone.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
)

const (
	chaosAPNsKeyID  = "CHAOSKEY01"
	chaosAPNsTeamID = "CHAOSTEAM1"
)

// directChannels are the fakes, and when FCM took each message.
type directChannels struct {
	apns *apnstest.Server
	fcm  *fcmtest.Server

	mu        sync.Mutex
	fcmSeen   map[string][]time.Time // "token notification-id" → arrivals FCM took
	fcmClears []directArrival        // one per id a clear FCM took names
}

// startChannels starts the fakes and returns the centrals' flags for them.
func (w *world) startChannels() ([]string, error) {
	key := apnstest.NewKey()
	keyFile, caFile := filepath.Join(w.dir, "apns.p8"), filepath.Join(w.dir, "apns-ca.pem")
	if err := apnstest.WriteP8(keyFile, key); err != nil {
		return nil, err
	}
	d := &directChannels{apns: apnstest.New(chaosAPNsKeyID, chaosAPNsTeamID, &key.PublicKey), fcmSeen: map[string][]time.Time{}}
	w.channels = d
	if err := os.WriteFile(caFile, d.apns.CertPEM(), 0o600); err != nil {
		return nil, err
	}
	var err error
	if d.fcm, err = fcmtest.Start(fcmtest.Config{}); err != nil {
		return nil, err
	}
	d.fcm.SetOnMessage(func(m fcmtest.Message) {
		d.mu.Lock()
		defer d.mu.Unlock()
		if m.Data["type"] == "clear" {
			var ids []string
			_ = json.Unmarshal([]byte(m.Data["ids"]), &ids)
			for _, id := range ids {
				d.fcmClears = append(d.fcmClears, directArrival{token: m.Token, id: id, at: time.Now()})
			}
			return
		}
		k := m.Token + " " + m.Data["id"]
		d.fcmSeen[k] = append(d.fcmSeen[k], time.Now())
	})
	creds := filepath.Join(w.dir, "fcm.json")
	if err := d.fcm.WriteCredentials(creds); err != nil {
		return nil, err
	}
	return []string{"--apns-key-file", keyFile, "--apns-key-id", chaosAPNsKeyID, "--apns-team-id", chaosAPNsTeamID,
		"--apns-topic", "chaos.spoolcast.app", "--apns-url", d.apns.URL(), "--apns-ca-file", caFile,
		"--fcm-credentials-file", creds, "--fcm-url", d.fcm.URL()}, nil
}

func (d *directChannels) close() {
	if d == nil {
		return
	}
	d.apns.Close()
	_ = d.fcm.Close()
}

// directDevice is the body registering user's APNs or FCM device, or ""
// for a user with neither (a third of them).
func directDevice(user string, i int) string {
	sum := sha256.Sum256([]byte(user))
	switch i % 3 {
	case 0:
		return fmt.Sprintf(`{"token":%q,"platform":"ios","provider":"apns"}`, hex.EncodeToString(sum[:]))
	case 1:
		return fmt.Sprintf(`{"token":"chaos:%s","platform":"android","provider":"fcm"}`, hex.EncodeToString(sum[:]))
	}
	return ""
}

// directArrival is one message that reached a fake: the device, the
// notification, and when.
type directArrival struct {
	token, id string
	at        time.Time
}

// arrivals lists every push that reached APNs (taken or not answered:
// either may have been delivered) or that FCM took, and apart, one clear
// per id each clear names.
func (d *directChannels) arrivals() (pushes, clears []directArrival) {
	for _, r := range d.apns.Requests() {
		if r.Status != 0 && r.Status != 200 {
			continue // refused: not delivered
		}
		var p struct {
			ID   string   `json:"id"`
			Type string   `json:"type"`
			IDs  []string `json:"ids"`
		}
		_ = json.Unmarshal(r.Payload, &p)
		if p.Type == "clear" {
			for _, id := range p.IDs {
				clears = append(clears, directArrival{token: r.Token, id: id, at: r.At})
			}
			continue
		}
		pushes = append(pushes, directArrival{token: r.Token, id: p.ID, at: r.At})
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, ats := range d.fcmSeen {
		token, id, _ := strings.Cut(k, " ")
		for _, at := range ats {
			pushes = append(pushes, directArrival{token: token, id: id, at: at})
		}
	}
	return pushes, append(clears, d.fcmClears...)
}

// apnsKill kills every connection to the fake APNs after a few more
// requests: the streams in flight get no answer (outcome unknown, not sent
// again), the rest are sent on a new connection.
func apnsKill(ctx context.Context, w *world, rng *rand.Rand) (string, error) {
	n := 1 + rng.IntN(20)
	at := time.Now()
	w.apnsKilled.add(at.Add(-2*time.Minute), at.Add(20*time.Second))
	w.channels.apns.KillAfter(n)
	sleep(ctx, 5*time.Second)
	return fmt.Sprintf("connections killed after %d more requests", n), nil
}

// fcmUnavailable makes FCM answer the next requests 503 with Retry-After:
// sent again after it, within the dispatch's lease.
func fcmUnavailable(ctx context.Context, w *world, rng *rand.Rand) (string, error) {
	n := 20 + rng.IntN(100)
	e := fcmtest.Unavailable
	e.RetryAfter = "1"
	w.channels.fcm.FailNext(n, e)
	sleep(ctx, 5*time.Second)
	return fmt.Sprintf("the next %d requests answered 503, Retry-After 1", n), nil
}
