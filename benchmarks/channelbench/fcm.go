package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/jwt"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/fcm"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
)

// fcmBench is fcm.Channel into fcmtest (or a sink), against a bare loop
// of the same POSTs.
type fcmBench struct {
	sink bool // the runs send to a sink, not to fcmtest
	// key is the fakes' service account key: generating one takes a
	// tenth of a second, so every fake shares it.
	key     *rsa.PrivateKey
	msgs    []channel.Message
	batches int
	// bodies are the bare loop's request bodies, made before any clock
	// starts.
	bodies [][]byte
}

func newFCM(total, batches int, sink bool) (*fcmBench, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	b := &fcmBench{key: key, batches: batches, sink: sink}
	// Registration tokens are about 160 characters.
	b.msgs = messages(total, func(i int) string {
		return fmt.Sprintf("d%07dXNlcjEyMzQ1Njc4OTA:APA91b%s", i, strings.Repeat("H", 134))
	})
	return b, nil
}

func (b *fcmBench) name() string {
	if b.sink {
		return "FCM, into a sink"
	}
	return "FCM"
}

// setup makes the bare loop's bodies, then sends one message both ways
// into one fake and compares what it received.
func (b *fcmBench) setup(ctx context.Context) (string, error) {
	// The channel's defaults: NORMAL priority, a day's TTL.
	expiration := strconv.FormatInt(time.Now().Add(24*time.Hour).Unix(), 10)
	b.bodies = make([][]byte, len(b.msgs))
	for i, m := range b.msgs {
		body, err := json.Marshal(map[string]any{"message": map[string]any{
			"token":        m.Token,
			"notification": map[string]string{"title": m.Title, "body": m.Body},
			"data":         map[string]string{"id": m.ID, "category": m.Category},
			"android": map[string]any{"collapse_key": m.ID, "priority": "NORMAL", "ttl": "86400s",
				"notification": map[string]string{"tag": m.ID}},
			"apns": map[string]any{"headers": map[string]string{"apns-priority": "5", "apns-expiration": expiration, "apns-collapse-id": m.ID}},
		}})
		if err != nil {
			return "", err
		}
		b.bodies[i] = body
	}

	fake, err := fcmtest.Start(fcmtest.Config{Key: b.key})
	if err != nil {
		return "", err
	}
	r, err := b.newRig(ctx, fake, true, true)
	if err != nil {
		return "", err
	}
	defer r.close()
	if err := firstPushes(ctx, r.ch, b.msgs[0], r.sendBare); err != nil {
		return "", err
	}
	msgs := fake.Messages()
	if len(msgs) != 2 {
		return "", fmt.Errorf("the fake took %d messages, want 2", len(msgs))
	}
	// The fake keeps no headers: both sides send Authorization (a bearer
	// token the fake issued) and Content-Type, by their code.
	if err := sameShape(nil, nil, msgs[0].Body, msgs[1].Body); err != nil {
		return "", fmt.Errorf("the channel's and the bare loop's requests differ:\n%w", err)
	}
	into := "fcmtest (plain HTTP/1.1, each message parsed and checked)"
	if b.sink {
		into = "a sink (plain HTTP/1.1, nothing checked)"
	}
	return fmt.Sprintf("fcm.Channel into %s, a connection per request in flight; bare: the same Transport's settings; "+
		"both POST a %d-byte body with a bearer token", into, len(msgs[1].Body)), nil
}

func (b *fcmBench) start(side string) (rig, error) {
	var srv fcmServer = newFCMSink(b.key)
	if !b.sink {
		var err error
		if srv, err = fcmtest.Start(fcmtest.Config{Key: b.key}); err != nil {
			return nil, err
		}
	}
	return b.newRig(context.Background(), srv, side == sideChannel, side == sideBare)
}

// fcmServer is what a rig needs of the server it sends to: fcmtest, or a
// sink.
type fcmServer interface {
	URL() string
	ProjectID() string
	Account() *fcmtest.ServiceAccount
	MaxInFlight() int
	Close() error
}

// fcmRig is a fresh server and a channel, a bare client, or both.
type fcmRig struct {
	b       *fcmBench
	fake    fcmServer
	ch      *fcm.Channel
	tr      *http.Transport
	bare    *http.Client
	sendURL string
	bearer  string // the bare loop's access token, fetched once
}

func (b *fcmBench) newRig(ctx context.Context, fake fcmServer, withChannel, withBare bool) (*fcmRig, error) {
	r := &fcmRig{b: b, fake: fake}
	var err error
	if withChannel {
		if r.ch, err = fcm.New(fcm.Config{Credentials: fake.Account().JSON(), Endpoint: fake.URL()}); err != nil {
			fake.Close()
			return nil, err
		}
	}
	if withBare {
		// The transport the channel builds without Config.HTTPClient.
		r.tr = http.DefaultTransport.(*http.Transport).Clone()
		r.tr.MaxIdleConnsPerHost = concurrency
		r.tr.HTTP2 = &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 10 * time.Second}
		r.bare = &http.Client{Transport: r.tr}
		r.sendURL = fake.URL() + "/v1/projects/" + url.PathEscape(fake.ProjectID()) + "/messages:send"
		if r.bearer, err = r.accessToken(ctx); err != nil {
			r.close()
			return nil, fmt.Errorf("the bare loop's access token: %w", err)
		}
	}
	return r, nil
}

// accessToken buys an access token from the fake's token endpoint with a
// JWT grant signed by its service account's key, as the channel does.
func (r *fcmRig) accessToken(ctx context.Context) (string, error) {
	sa := r.fake.Account()
	der, err := x509.MarshalPKCS8PrivateKey(sa.Key)
	if err != nil {
		return "", err
	}
	grant := &jwt.Config{
		Email:        sa.ClientEmail,
		PrivateKey:   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		PrivateKeyID: sa.PrivateKeyID,
		Scopes:       []string{fcmtest.Scope},
		TokenURL:     sa.TokenURI,
	}
	tok, err := grant.TokenSource(context.WithValue(ctx, oauth2.HTTPClient, r.bare)).Token()
	if err != nil {
		return "", err
	}
	return "Bearer " + tok.AccessToken, nil
}

func (r *fcmRig) push(ctx context.Context, lo, hi int) error {
	if r.ch != nil {
		return sendBatches(ctx, r.ch, r.b.msgs[lo:hi], r.b.batches)
	}
	return bareLoop(lo, hi, func(i int) error { return r.sendBare(ctx, i) })
}

// sendBare is the bare loop's request for message i.
func (r *fcmRig) sendBare(ctx context.Context, i int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.sendURL, bytes.NewReader(r.b.bodies[i]))
	if err != nil {
		return err
	}
	req.Header = http.Header{
		"Authorization": {r.bearer},
		"Content-Type":  {"application/json; charset=UTF-8"},
	}
	res, err := r.bare.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, res.Body) // to its end, so that the connection is used again
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("FCM answered %s", res.Status)
	}
	return nil
}

// seen counts no connections: fcmtest does not.
func (r *fcmRig) seen() (inFlight, conns int) { return r.fake.MaxInFlight(), 0 }

func (r *fcmRig) close() {
	if r.ch != nil {
		_ = r.ch.Close() // closes idle connections only: it cannot fail
	}
	if r.tr != nil {
		r.tr.CloseIdleConnections()
	}
	_ = r.fake.Close() // closes its listeners and connections: nothing left to fail
}
