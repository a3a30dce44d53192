package webpush

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkSend is one Web Push message, encrypted for its subscription
// (an ephemeral P-256 key, ECDH, HKDF, AES-128-GCM) and POSTed with its
// VAPID token (signed once per origin and reused) to a push service on
// loopback that answers 201: what a dispatcher pays per browser. The
// payload is a largest one (MaxPayload bytes).
func BenchmarkSend(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	defer srv.Close()
	sender := newSender(b, newKey(b))
	sub := newSubscription(b, srv.URL+"/push/1")
	msg := Message{Payload: []byte(strings.Repeat("x", MaxPayload)), Urgency: UrgencyNormal}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if res := sender.Send(context.Background(), sub, msg); res.Outcome != Delivered {
				b.Fatal(res.Outcome, res.Err)
			}
		}
	})
}

// BenchmarkEncrypt is the encryption alone, per message.
func BenchmarkEncrypt(b *testing.B) {
	sub := newSubscription(b, "https://push.example.com/1")
	parsed, err := sub.check()
	if err != nil {
		b.Fatal(err)
	}
	msg := Message{Payload: []byte(strings.Repeat("x", MaxPayload))}
	srvURL := "https://push.example.com/1"
	sender := newSender(b, newKey(b))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sender.request(context.Background(), srvURL, parsed, msg); err != nil {
			b.Fatal(err)
		}
	}
}
