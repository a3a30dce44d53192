package main

// Web Push: a push service that the centrals send browsers' pushes to.
// Half the app users have a browser subscription beside their phones. The
// service decrypts each message with the subscription's private key (RFC
// 8291, aes128gcm), so that it knows which notification each push carries
// and which a clear takes down; its answers go wrong on the faults' cue.
// (The sender's encryption and VAPID token are checked against an
// implementation spoolcast did not write in channel/webpush's tests.)

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spoolcast/spoolcast/devices"
)

// webSubscriber is one browser's subscription: its keys, as the browser
// keeps them.
type webSubscriber struct {
	key  *ecdh.PrivateKey
	auth []byte
}

// webPushService is the fake push service.
type webPushService struct {
	url string

	mu      sync.Mutex
	subs    map[string]*webSubscriber // by the endpoint's last segment
	pushes  []directArrival           // token: the device's WebPush[…] token
	clears  []directArrival           // one per id a clear names
	refused int                       // messages it could not decrypt
	// fault: how the next requests are answered.
	unavailableUntil time.Time           // 503 until then
	stallUntil       time.Time           // taken, answered after the sender gave up
	limitOnce        int                 // this many more subscriptions get one 429 each
	limited          map[string]struct{} // the subscriptions that got theirs
}

// startWebPush starts the push service and returns the centrals' flags
// for Web Push.
func (w *world) startWebPush() ([]string, error) {
	s := &webPushService{subs: map[string]*webSubscriber{}, limited: map[string]struct{}{}}
	var err error
	if s.url, err = w.serve(s); err != nil {
		return nil, err
	}
	w.web = s
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	file := filepath.Join(w.dir, "vapid.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	return []string{"--vapid-key-file", file, "--vapid-subject", "mailto:chaos@spoolcast.test", "--webpush-allow-private"}, nil
}

// webDevice subscribes a browser for the app user i (half of them) and
// returns the body registering it, or "".
func (s *webPushService) webDevice(user string, i int) (string, error) {
	if i%2 != 0 {
		return "", nil
	}
	key, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	auth := make([]byte, 16)
	if _, err := rand.Read(auth); err != nil {
		return "", err
	}
	id := "sub-" + user
	s.mu.Lock()
	s.subs[id] = &webSubscriber{key: key, auth: auth}
	s.mu.Unlock()
	b64 := base64.RawURLEncoding.EncodeToString
	body, err := json.Marshal(map[string]any{"platform": "web", "subscription": map[string]any{
		"endpoint": s.url + "/push/" + id,
		"keys":     map[string]string{"p256dh": b64(key.PublicKey().Bytes()), "auth": b64(auth)},
	}})
	return string(body), err
}

func (s *webPushService) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	id, ok := strings.CutPrefix(r.URL.Path, "/push/")
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, 8192))
	if r.Method != http.MethodPost || !ok || err != nil {
		http.Error(rw, "not a push", http.StatusBadRequest)
		return
	}
	now := time.Now()
	s.mu.Lock()
	sub := s.subs[id]
	unavailable, stall := now.Before(s.unavailableUntil), now.Before(s.stallUntil)
	_, hadLimit := s.limited[id]
	limit := !unavailable && !hadLimit && s.limitOnce > 0
	if limit {
		s.limitOnce--
		s.limited[id] = struct{}{}
	}
	s.mu.Unlock()
	switch {
	case sub == nil:
		http.Error(rw, "no such subscription", http.StatusNotFound)
		return
	case unavailable:
		http.Error(rw, "unavailable", http.StatusServiceUnavailable)
		return
	case limit:
		rw.Header().Set("Retry-After", "1")
		http.Error(rw, "slow down", http.StatusTooManyRequests)
		return
	}
	plain, err := decryptWebPush(body, sub)
	if err != nil {
		s.mu.Lock()
		s.refused++
		s.mu.Unlock()
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	var m struct {
		Type string   `json:"type"`
		IDs  []string `json:"ids"`
		Data struct {
			NotificationID string `json:"notification_id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(plain, &m); err != nil {
		http.Error(rw, "the message is not JSON", http.StatusBadRequest)
		return
	}
	token := devices.WebToken(s.url + "/push/" + id)
	s.mu.Lock()
	if m.Type == "clear" {
		for _, nid := range m.IDs {
			s.clears = append(s.clears, directArrival{token: token, id: nid, at: now})
		}
	} else {
		s.pushes = append(s.pushes, directArrival{token: token, id: m.Data.NotificationID, at: now})
	}
	s.mu.Unlock()
	if stall {
		// Taken, and answered only after the sender's timeout (10 s): the
		// sender cannot know, and must not send it again.
		select {
		case <-time.After(12 * time.Second):
		case <-r.Context().Done():
		}
	}
	rw.Header().Set("Location", s.url+"/message/"+fmt.Sprint(now.UnixNano()))
	rw.WriteHeader(http.StatusCreated)
}

// decryptWebPush opens an aes128gcm message (RFC 8188) for the
// subscription (RFC 8291 §3.4): one record, its delimiter 0x02.
func decryptWebPush(body []byte, sub *webSubscriber) ([]byte, error) {
	if len(body) < 21 {
		return nil, errors.New("shorter than the aes128gcm header")
	}
	salt, idlen := body[:16], int(body[20])
	_ = binary.BigEndian.Uint32(body[16:20]) // rs: one record in any case
	if len(body) < 21+idlen {
		return nil, errors.New("shorter than its keyid")
	}
	asPublic, sealed := body[21:21+idlen], body[21+idlen:]
	as, err := ecdh.P256().NewPublicKey(asPublic)
	if err != nil {
		return nil, fmt.Errorf("keyid is not a P-256 point: %w", err)
	}
	secret, err := sub.key.ECDH(as)
	if err != nil {
		return nil, err
	}
	ikm, err := hkdf.Key(sha256.New, secret, sub.auth, "WebPush: info\x00"+string(sub.key.PublicKey().Bytes())+string(asPublic), 32)
	if err != nil {
		return nil, err
	}
	prk, err := hkdf.Extract(sha256.New, ikm, salt)
	if err != nil {
		return nil, err
	}
	cek, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: aes128gcm\x00", 16)
	if err != nil {
		return nil, err
	}
	nonce, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: nonce\x00", 12)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(cek)
	if err != nil {
		return nil, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	record, err := gcm.Open(nil, nonce, sealed, nil)
	if err != nil {
		return nil, fmt.Errorf("does not open with the subscription's keys: %w", err)
	}
	i := len(record) - 1
	for i >= 0 && record[i] == 0 {
		i--
	}
	if i < 0 || record[i] != 2 {
		return nil, errors.New("the record has no last-record delimiter")
	}
	return record[:i], nil
}

// arrivals are the pushes the service took, and the clears.
func (s *webPushService) arrivals() (pushes, clears []directArrival, refused int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]directArrival(nil), s.pushes...), append([]directArrival(nil), s.clears...), s.refused
}

// webUnavailable makes the push service answer 503 for 5 s: nothing was
// taken, so the pushes are sent again with backoff within their lease.
func webUnavailable(ctx context.Context, w *world, _ *mrand.Rand) (string, error) {
	w.web.mu.Lock()
	w.web.unavailableUntil = time.Now().Add(5 * time.Second)
	w.web.mu.Unlock()
	sleep(ctx, 5*time.Second)
	return "every request for 5s answered 503", nil
}

// webLosesAnswers makes the push service take the messages of 5 s and
// answer each after the sender gave up: outcome unknown, never sent again.
func webLosesAnswers(ctx context.Context, w *world, _ *mrand.Rand) (string, error) {
	w.web.mu.Lock()
	w.web.stallUntil = time.Now().Add(5 * time.Second)
	w.web.mu.Unlock()
	sleep(ctx, 17*time.Second)
	return "every message for 5s taken, answered after the sender's timeout", nil
}

// webRateLimited answers the next subscriptions' requests 429 with
// Retry-After: 1, once each: deferred, then sent.
func webRateLimited(ctx context.Context, w *world, rng *mrand.Rand) (string, error) {
	n := 2 + rng.IntN(6)
	w.web.mu.Lock()
	w.web.limitOnce = n
	w.web.mu.Unlock()
	sleep(ctx, 5*time.Second)
	return fmt.Sprintf("the next %d subscriptions answered 429 once, Retry-After 1", n), nil
}
