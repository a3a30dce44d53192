package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/sideshow/apns2"
	"github.com/sideshow/apns2/token"
	"golang.org/x/net/http2"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/apns"
	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
)

// The team, key and app the fake APNs knows.
const (
	apnsKeyID  = "ABC123DEFG"
	apnsTeamID = "DEF123GHIJ"
	apnsTopic  = "com.example.app"
)

// apnsBench is apns.Channel into apnstest (or a sink), against a bare
// HTTP/2 loop.
type apnsBench struct {
	key     *ecdsa.PrivateKey
	msgs    []channel.Message
	batches int
	sink    bool // the runs send to a sink, not to apnstest
	// What the bare loop sends, made before any clock starts: each
	// message's payload, a JWT signed once, one expiration for all.
	payloads   [][]byte
	bearer     string
	expiration string
}

func newAPNs(total, batches int, sink bool) *apnsBench {
	b := &apnsBench{key: apnstest.NewKey(), batches: batches, sink: sink}
	// Device tokens are 32 bytes, in hex.
	b.msgs = messages(total, func(i int) string { return fmt.Sprintf("a1b2c3d4%056x", i) })
	return b
}

func (b *apnsBench) name() string {
	if b.sink {
		return "APNs, into a sink"
	}
	return "APNs"
}

// setup signs the bare loop's JWT and makes its payloads, then sends one
// message both ways into one fake and compares what it received (with
// -server sink too: a sink keeps nothing).
func (b *apnsBench) setup(ctx context.Context) (string, error) {
	tok := &token.Token{AuthKey: b.key, KeyID: apnsKeyID, TeamID: apnsTeamID}
	if _, err := tok.Generate(); err != nil {
		return "", err
	}
	b.bearer = "bearer " + tok.Bearer
	// The channel's default: a day from now, in Unix seconds.
	b.expiration = strconv.FormatInt(time.Now().Add(24*time.Hour).Unix(), 10)
	b.payloads = make([][]byte, len(b.msgs))
	for i, m := range b.msgs {
		p, err := json.Marshal(map[string]any{
			"aps":      map[string]any{"alert": map[string]string{"title": m.Title, "body": m.Body}, "sound": "default"},
			"id":       m.ID,
			"category": m.Category,
		})
		if err != nil {
			return "", err
		}
		b.payloads[i] = p
	}

	fake := apnstest.New(apnsKeyID, apnsTeamID, &b.key.PublicKey)
	r, err := b.newRig(fake, true, true)
	if err != nil {
		return "", err
	}
	defer r.close()
	if err := firstPushes(ctx, r.ch, b.msgs[0], r.sendBare); err != nil {
		return "", err
	}
	reqs := fake.Requests()
	if len(reqs) != 2 {
		return "", fmt.Errorf("the fake received %d requests, want 2", len(reqs))
	}
	ch, bare := reqs[0], reqs[1]
	if err := sameShape(ch.Header, bare.Header, ch.Payload, bare.Payload); err != nil {
		return "", fmt.Errorf("the channel's and the bare loop's requests differ:\n%w", err)
	}
	into := "apnstest (TLS 1.3, HTTP/2 by ALPN, an ES256 JWT verified on each request)"
	if b.sink {
		into = "a sink (TLS 1.3, HTTP/2 by ALPN, nothing checked)"
	}
	return fmt.Sprintf("apns.Channel into %s, bare: x/net/http2's Transport; "+
		"both requests carry the same %d headers and a %d-byte payload", into, len(bare.Header), len(bare.Payload)), nil
}

func (b *apnsBench) start(side string) (rig, error) {
	var srv apnsServer = newAPNsSink()
	if !b.sink {
		srv = apnstest.New(apnsKeyID, apnsTeamID, &b.key.PublicKey)
	}
	return b.newRig(srv, side == sideChannel, side == sideBare)
}

// apnsServer is what a rig needs of the server it sends to: apnstest, or
// a sink.
type apnsServer interface {
	URL() string
	CertPool() *x509.CertPool
	MaxInFlight() int
	Connections() int
	Close()
}

// apnsRig is a fresh server and a channel, a bare client, or both.
type apnsRig struct {
	b    *apnsBench
	fake apnsServer
	ch   *apns.Channel
	tr   *http2.Transport
	bare *http.Client
}

func (b *apnsBench) newRig(srv apnsServer, withChannel, withBare bool) (*apnsRig, error) {
	r := &apnsRig{b: b, fake: srv}
	if withChannel {
		ch, err := apns.New(apns.Config{
			Key: b.key, KeyID: apnsKeyID, TeamID: apnsTeamID, Topic: apnsTopic,
			Host: r.fake.URL(), RootCAs: r.fake.CertPool(), // Concurrency: its default, 100
		})
		if err != nil {
			r.fake.Close()
			return nil, err
		}
		r.ch = ch
	}
	if withBare {
		// The transport the channel builds for a Config with RootCAs.
		r.tr = &http2.Transport{TLSClientConfig: &tls.Config{RootCAs: r.fake.CertPool()}, ReadIdleTimeout: apns2.ReadIdleTimeout}
		r.bare = &http.Client{Transport: r.tr}
	}
	return r, nil
}

func (r *apnsRig) push(ctx context.Context, lo, hi int) error {
	if r.ch != nil {
		return sendBatches(ctx, r.ch, r.b.msgs[lo:hi], r.b.batches)
	}
	return bareLoop(lo, hi, func(i int) error { return r.sendBare(ctx, i) })
}

// sendBare is the bare loop's request for message i: what apns2 sends for
// the channel, built from what was made beforehand.
func (r *apnsRig) sendBare(ctx context.Context, i int) error {
	m := r.b.msgs[i]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.fake.URL()+"/3/device/"+m.Token, bytes.NewReader(r.b.payloads[i]))
	if err != nil {
		return err
	}
	req.Header = http.Header{
		"Authorization":    {r.b.bearer},
		"Content-Type":     {"application/json; charset=utf-8"},
		"Apns-Topic":       {apnsTopic},
		"Apns-Collapse-Id": {m.ID},
		"Apns-Priority":    {"5"},
		"Apns-Expiration":  {r.b.expiration},
		"Apns-Push-Type":   {"alert"},
	}
	res, err := r.bare.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("APNs answered %s", res.Status)
	}
	return nil
}

func (r *apnsRig) seen() (inFlight, conns int) { return r.fake.MaxInFlight(), r.fake.Connections() }

func (r *apnsRig) close() {
	if r.ch != nil {
		_ = r.ch.Close() // closes idle connections only: it cannot fail
	}
	if r.tr != nil {
		r.tr.CloseIdleConnections()
	}
	r.fake.Close()
}
