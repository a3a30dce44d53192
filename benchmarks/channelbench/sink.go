package main

import (
	"crypto/rsa"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
)

// A sink takes every request and answers as its provider does when all is
// well, checking nothing and keeping nothing. With -server sink it stands
// in for the fakes, whose own cost a request (apnstest verifies an ES256
// JWT on each, under its lock) can bound a run, to show what the clients
// cost when the server costs next to nothing.
type sink struct {
	ts                    *httptest.Server
	inFlight, maxInFlight atomic.Int64
	conns                 atomic.Int64
}

func newSink(handler func(*sink) http.HandlerFunc) *sink {
	s := &sink{}
	s.ts = httptest.NewUnstartedServer(handler(s))
	s.ts.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			s.conns.Add(1)
		}
	}
	return s
}

// enter counts a request in flight until the function it returns is called.
func (s *sink) enter() func() {
	n := s.inFlight.Add(1)
	for m := s.maxInFlight.Load(); n > m && !s.maxInFlight.CompareAndSwap(m, n); m = s.maxInFlight.Load() {
	}
	return func() { s.inFlight.Add(-1) }
}

func (s *sink) URL() string      { return s.ts.URL }
func (s *sink) MaxInFlight() int { return int(s.maxInFlight.Load()) }
func (s *sink) Connections() int { return int(s.conns.Load()) }

// apnsSink answers every request 200 with an apns-id, over TLS and HTTP/2
// only, as APNs.
type apnsSink struct{ *sink }

func newAPNsSink() apnsSink {
	s := newSink(func(s *sink) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			defer s.enter()()
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("apns-id", "5bd4c2f1-6a7e-4d1b-9c3a-0e8f7b6d5a4c")
			w.WriteHeader(http.StatusOK)
		}
	})
	s.ts.EnableHTTP2 = true // and only HTTP/2: httptest offers h2 alone by ALPN
	s.ts.StartTLS()
	return apnsSink{s}
}

func (s apnsSink) CertPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(s.ts.Certificate())
	return pool
}

func (s apnsSink) Close() { s.ts.Close() }

// fcmSink answers every send 200 with a message name, and every token
// request an access token, over plain HTTP/1.1, as fcmtest.
type fcmSink struct {
	*sink
	account *fcmtest.ServiceAccount
}

const sinkProject = "spoolcast-sink"

func newFCMSink(key *rsa.PrivateKey) fcmSink {
	s := newSink(func(s *sink) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/token" {
				w.Header().Set("Content-Type", "application/json; charset=utf-8")
				_, _ = io.WriteString(w, `{"access_token":"ya29.sink-0123456789abcdefghijklmnopqrstuv","token_type":"Bearer","expires_in":3600}`)
				return
			}
			defer s.enter()()
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json; charset=UTF-8")
			_, _ = io.WriteString(w, `{"name":"projects/`+sinkProject+`/messages/0:1764806400000000%1a2b3c4d5e6f7a8b"}`+"\n")
		}
	})
	s.ts.Start()
	return fcmSink{sink: s, account: &fcmtest.ServiceAccount{
		ProjectID:    sinkProject,
		ClientEmail:  "firebase-adminsdk-sink@" + sinkProject + ".iam.gserviceaccount.com",
		PrivateKeyID: "0123456789abcdef0123456789abcdef01234567",
		TokenURI:     s.ts.URL + "/token",
		Key:          key,
	}}
}

func (s fcmSink) ProjectID() string                { return sinkProject }
func (s fcmSink) Account() *fcmtest.ServiceAccount { return s.account }
func (s fcmSink) Close() error                     { s.ts.Close(); return nil }
