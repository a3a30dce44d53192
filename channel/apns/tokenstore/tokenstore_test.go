package tokenstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/apns"
	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
	"github.com/spoolcast/spoolcast/channel/apns/tokenstore"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	keyID  = "KEY1234567"
	teamID = "TEAM123456"
)

// replicas starts n channels over one Postgres, as n central replicas,
// sending to one fake APNs that refuses, as Apple does, a token renewed
// within 20 minutes of the last.
func replicas(t *testing.T, n int, clk *clock.Fake, store func(i int) apns.TokenStore) (*apnstest.Server, []*apns.Channel) {
	t.Helper()
	key := apnstest.NewKey()
	fake := apnstest.New(keyID, teamID, &key.PublicKey)
	t.Cleanup(fake.Close)
	fake.SetClock(clk.Now)
	fake.LimitTokenUpdates(20 * time.Minute)
	var chs []*apns.Channel
	for i := range n {
		ch, err := apns.New(apns.Config{Key: key, KeyID: keyID, TeamID: teamID, Topic: "com.example.app",
			Host: fake.URL(), RootCAs: fake.CertPool(), Clock: clk, Tokens: store(i)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ch.Close() })
		chs = append(chs, ch)
	}
	return fake, chs
}

func message(i int) channel.Message {
	return channel.Message{Token: fmt.Sprintf("%064x", i), ID: fmt.Sprint(i), Title: "t"}
}

// Three replicas pushing every minute for three hours send one token at a
// time for the deployment, renewed every 40 minutes by one of them: Apple
// never answers TooManyProviderTokenUpdates, and every push is delivered.
func TestThreeReplicasShareOneProviderTokenRenewedOnce(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	store := tokenstore.New(pgtest.Pool(t))
	fake, chs := replicas(t, 3, clk, func(int) apns.TokenStore { return store })
	ctx := context.Background()
	for minute := range 180 {
		var wg sync.WaitGroup
		for i, ch := range chs {
			wg.Go(func() {
				if o := ch.Send(ctx, []channel.Message{message(minute*3 + i)})[0]; o.Kind != channel.Delivered {
					t.Errorf("minute %d, replica %d: %+v, want delivered", minute, i, o)
				}
			})
		}
		wg.Wait()
		clk.Advance(time.Minute)
	}
	// Renewed at 0, 40, 80, 120 and 160 minutes.
	if n := fake.JWTs(); n != 5 {
		t.Errorf("%d distinct provider tokens in 3 hours across 3 replicas, want 5", n)
	}
	if n := fake.TooManyTokenUpdates(); n != 0 {
		t.Errorf("%d requests refused TooManyProviderTokenUpdates, want 0", n)
	}
}

// Without a shared store each replica signs its own: what Apple refuses.
// The refusal is the deployment's, for the credentials alert.
func TestReplicasSigningTheirOwnTokensAreRefusedForTheDeployment(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	stores := []apns.TokenStore{tokenstore.New(pgtest.Pool(t)), tokenstore.New(pgtest.Pool(t))}
	fake, chs := replicas(t, 2, clk, func(i int) apns.TokenStore { return stores[i] })
	ctx := context.Background()
	if o := chs[0].Send(ctx, []channel.Message{message(0)})[0]; o.Kind != channel.Delivered {
		t.Fatalf("the first replica: %+v, want delivered", o)
	}
	clk.Advance(time.Minute)
	o := chs[1].Send(ctx, []channel.Message{message(1)})[0]
	if o.Kind != channel.RetryAfter || !o.Credentials || o.Code != "TooManyProviderTokenUpdates" {
		t.Errorf("the second replica, signing its own: %+v, want RetryAfter, Credentials, TooManyProviderTokenUpdates", o)
	}
	if n := fake.TooManyTokenUpdates(); n != 1 {
		t.Errorf("%d refused for too many updates, want 1", n)
	}
}

// APNs calling the shared token expired (this deployment's clocks 30
// minutes behind Apple's: the token is 31 minutes old by them, 61 by
// Apple) renews it once for the deployment, however many replicas were
// refused with it, and the push is sent again without an alert.
func TestAnExpiredSharedTokenIsRenewedOnceForTheDeployment(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	store := tokenstore.New(pgtest.Pool(t))
	fake, chs := replicas(t, 3, clk, func(int) apns.TokenStore { return store })
	fake.SetClock(func() time.Time { return clk.Now().Add(30 * time.Minute) })
	ctx := context.Background()
	for i, ch := range chs {
		if o := ch.Send(ctx, []channel.Message{message(i)})[0]; o.Kind != channel.Delivered {
			t.Fatalf("replica %d: %+v, want delivered", i, o)
		}
	}
	clk.Advance(31 * time.Minute)
	var wg sync.WaitGroup
	outs := make([]channel.Outcome, len(chs))
	for i, ch := range chs {
		wg.Go(func() { outs[i] = ch.Send(ctx, []channel.Message{message(10 + i)})[0] })
	}
	wg.Wait()
	for i, o := range outs {
		if o.Kind != channel.RetryAfter || o.Credentials || o.Code != "ExpiredProviderToken" {
			t.Errorf("replica %d: %+v, want RetryAfter without Credentials (ExpiredProviderToken)", i, o)
		}
	}
	for i, ch := range chs {
		if o := ch.Send(ctx, []channel.Message{message(20 + i)})[0]; o.Kind != channel.Delivered {
			t.Errorf("replica %d sending again: %+v, want delivered with the renewed token", i, o)
		}
	}
	if n := fake.JWTs(); n != 2 {
		t.Errorf("%d distinct tokens, want 2: the expired one and its one renewal", n)
	}
}
