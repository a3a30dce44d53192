package expo_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/channel/expo/expotest"
)

func newClient(t *testing.T, fake *expotest.Server) *expo.Client {
	t.Helper()
	return newClientWith(t, fake, expo.Config{MinBackoff: time.Millisecond, RatePerSecond: -1})
}

// newClientWith is a client of fake configured by cfg.
func newClientWith(t *testing.T, fake *expotest.Server, cfg expo.Config) *expo.Client {
	t.Helper()
	ts := httptest.NewServer(fake)
	t.Cleanup(ts.Close)
	cfg.URL = ts.URL + "/--/api/v2/push"
	c, err := expo.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTicketsComeBackInTheOrderOfTheMessages(t *testing.T) {
	t.Parallel()
	fake := expotest.New()
	fake.Unregister("ExponentPushToken[gone]")
	c := newClient(t, fake)
	var msgs []expo.Message
	for i := range 100 {
		msgs = append(msgs, expo.Message{To: fmt.Sprintf("ExponentPushToken[%d]", i), Title: "t", Body: strings.Repeat("b", 50)})
	}
	msgs[42].To = "ExponentPushToken[gone]"
	tickets, err := c.Send(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(tickets) != 100 || tickets[42].Code() != expo.DeviceNotRegistered || tickets[41].Status != "ok" || tickets[41].ID == "" {
		t.Fatalf("tickets = %d, [41] %+v, [42] %+v", len(tickets), tickets[41], tickets[42])
	}
	if got := len(fake.Messages()); got != 99 {
		t.Errorf("the fake got %d messages (a gzip body of 100), want 99 accepted", got)
	}
	if _, err := c.Send(context.Background(), make([]expo.Message, 101)); err == nil {
		t.Error("a send of 101 messages was not refused")
	}
	big := expo.Message{To: "ExponentPushToken[x]", Body: strings.Repeat("x", 5000)}
	if _, err := c.Send(context.Background(), []expo.Message{big}); !errors.Is(err, expo.ErrMessageTooBig) {
		t.Errorf("a 5 KB message = %v; want ErrMessageTooBig before sending", err)
	}
}

func TestReceiptsNotReadyAreAbsentThenArrive(t *testing.T) {
	t.Parallel()
	fake := expotest.New()
	fake.UnregisterAtReceipt("ExponentPushToken[b]")
	c := newClient(t, fake)
	tickets, err := c.Send(context.Background(), []expo.Message{{To: "ExponentPushToken[a]"}, {To: "ExponentPushToken[b]"}})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{tickets[0].ID, tickets[1].ID}
	fake.HoldReceipts(1)
	if got, err := c.Receipts(context.Background(), ids); err != nil || len(got) != 0 {
		t.Fatalf("receipts not ready = %v, %v; want none", got, err)
	}
	got, err := c.Receipts(context.Background(), ids)
	if err != nil || got[ids[0]].Status != "ok" || got[ids[1]].Code() != expo.DeviceNotRegistered {
		t.Fatalf("receipts = %+v, %v", got, err)
	}
}

func TestRetriesHonourRetryAfterAndEndAsARequestError(t *testing.T) {
	t.Parallel()
	fake := expotest.New()
	c := newClient(t, fake)
	fake.Fail(2, http.StatusTooManyRequests, "1")
	start := time.Now()
	if _, err := c.Send(context.Background(), []expo.Message{{To: "ExponentPushToken[a]"}}); err != nil {
		t.Fatalf("send after two 429s = %v; want it retried through", err)
	}
	if took := time.Since(start); took < 2*time.Second {
		t.Errorf("two 429s with Retry-After: 1 took %s; want the waits honoured", took)
	}
	fake.Fail(10, http.StatusInternalServerError, "")
	_, err := c.Send(context.Background(), []expo.Message{{To: "ExponentPushToken[a]"}})
	var re *expo.RequestError
	if !errors.As(err, &re) || re.Status != 500 || re.Unknown || re.Tries != 4 {
		t.Fatalf("send with Expo failing = %v; want a RequestError 500 after 4 tries, taken by no one", err)
	}
	if n := fake.Requests("send"); n != 3+4 {
		t.Errorf("the fake got %d sends; want 3 (two 429s, then ok) + 4 (a 5xx, retried three times)", n)
	}
	if n := fake.Accepted(); n != 1 {
		t.Errorf("the fake accepted %d messages, want 1", n)
	}
}

// A send under RetryFor keeps trying through an outage of Expo for as long
// as the caller allows (a dispatch's lease), past Config.Retries, and no
// longer.
func TestASendUnderRetryForKeepsTryingThroughAnOutageUntilItsTimeIsUp(t *testing.T) {
	t.Parallel()
	msgs := []expo.Message{{To: "ExponentPushToken[a]"}}
	cfg := expo.Config{HTTP: &http.Client{Timeout: 100 * time.Millisecond}, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, RatePerSecond: -1}
	t.Run("through", func(t *testing.T) {
		t.Parallel()
		fake := expotest.New()
		c := newClientWith(t, fake, cfg)
		fake.Fail(20, http.StatusServiceUnavailable, "")
		if _, err := c.Send(expo.RetryFor(context.Background(), time.Minute), msgs); err != nil {
			t.Fatalf("send through twenty 503s = %v", err)
		}
		if n, m := fake.Requests("send"), fake.Accepted(); n != 21 || m != 1 {
			t.Errorf("%d requests and %d messages accepted; want 21 and 1", n, m)
		}
	})
	t.Run("until its time is up", func(t *testing.T) {
		t.Parallel()
		fake := expotest.New()
		c := newClientWith(t, fake, cfg)
		fake.SetFailing(http.StatusServiceUnavailable, "")
		start := time.Now()
		_, err := c.Send(expo.RetryFor(context.Background(), 400*time.Millisecond), msgs)
		took := time.Since(start)
		var re *expo.RequestError
		if !errors.As(err, &re) || re.Status != http.StatusServiceUnavailable || re.Unknown || re.Tries <= 4 {
			t.Fatalf("send with Expo down = %v; want a RequestError 503 after more than 4 tries", err)
		}
		if took > 400*time.Millisecond {
			t.Errorf("the tries took %s, past the 400ms allowed", took)
		}
	})
}

func TestASendIsRetriedUnlessExpoMayHaveTakenIt(t *testing.T) {
	t.Parallel()
	msgs := []expo.Message{{To: "ExponentPushToken[a]"}}
	t.Run("a 5xx is retried, and the messages are taken once", func(t *testing.T) {
		t.Parallel()
		fake := expotest.New()
		c := newClient(t, fake)
		fake.Fail(1, http.StatusBadGateway, "")
		if _, err := c.Send(context.Background(), msgs); err != nil {
			t.Errorf("send answered 502, then ok = %v", err)
		}
		if n, m := fake.Requests("send"), fake.Accepted(); n != 2 || m != 1 {
			t.Errorf("%d requests and %d messages accepted; want 2 and 1", n, m)
		}
	})
	t.Run("a send taken whose connection drops before the answer is not retried", func(t *testing.T) {
		t.Parallel()
		fake := expotest.New()
		c := newClient(t, fake)
		fake.DropAnswers(1)
		_, err := c.Send(context.Background(), msgs)
		var re *expo.RequestError
		if !errors.As(err, &re) || !re.Unknown {
			t.Errorf("send whose answer was lost = %v; want a RequestError whose outcome is unknown", err)
		}
		if n, m := fake.Requests("send"), fake.Accepted(); n != 1 || m != 1 {
			t.Errorf("%d requests and %d messages accepted; want 1 and 1", n, m)
		}
	})
	t.Run("a connection that broke while the request was written is retried", func(t *testing.T) {
		t.Parallel()
		fake := expotest.New()
		var dials atomic.Int32
		var d net.Dialer
		transport := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err == nil && dials.Add(1) == 1 {
				conn = &breakingConn{Conn: conn}
			}
			return conn, err
		}}
		c := newClientWith(t, fake, expo.Config{HTTP: &http.Client{Transport: transport}, MinBackoff: time.Millisecond, RatePerSecond: -1})
		// A request larger than the connection's write buffer, so that it
		// breaks while it is written (one that fits the buffer is handed
		// over whole first, and then counts as written: its answer lost).
		big := make([]expo.Message, expo.MaxMessagesPerSend)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range big {
			b := make([]byte, 2000)
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			big[i] = expo.Message{To: fmt.Sprintf("ExponentPushToken[%d]", i), Body: base64.StdEncoding.EncodeToString(b)}
		}
		if _, err := c.Send(context.Background(), big); err != nil {
			t.Errorf("send whose first connection broke mid-request = %v; want it retried", err)
		}
		if n := fake.Accepted(); n != len(big) {
			t.Errorf("the fake accepted %d messages, want %d", n, len(big))
		}
	})
	t.Run("an answer later than the client's timeout is not retried", func(t *testing.T) {
		t.Parallel()
		fake := expotest.New()
		fake.SetAnswerDelay(time.Minute)
		c := newClientWith(t, fake, expo.Config{HTTP: &http.Client{Timeout: 200 * time.Millisecond}, MinBackoff: time.Millisecond, RatePerSecond: -1})
		_, err := c.Send(context.Background(), msgs)
		var re *expo.RequestError
		if !errors.As(err, &re) || !re.Unknown {
			t.Errorf("send timed out after it was written = %v; want a RequestError whose outcome is unknown", err)
		}
		if n := fake.Accepted(); n != 1 {
			t.Errorf("the fake accepted the message %d times; want once", n)
		}
	})
	t.Run("a connection that never opened is retried", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		closed := ln.Addr().String()
		ln.Close() // connections are refused
		var attempts atomic.Int32
		c, err := expo.New(expo.Config{URL: "http://" + closed, MinBackoff: time.Millisecond, RatePerSecond: -1,
			OnRequest: func(string, time.Duration, error) { attempts.Add(1) }})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Send(context.Background(), msgs)
		var re *expo.RequestError
		if !errors.As(err, &re) || re.Status != 0 || re.Unknown || re.Tries != 4 {
			t.Errorf("send to a closed port = %v; want a RequestError without an answer after 4 tries, surely not sent", err)
		}
		if n := attempts.Load(); n != 4 {
			t.Errorf("%d attempts; want 4 (one try, three retries)", n)
		}
	})
	t.Run("receipts are retried after a 5xx and after a timeout", func(t *testing.T) {
		t.Parallel()
		fake := expotest.New()
		c := newClientWith(t, fake, expo.Config{HTTP: &http.Client{Timeout: 200 * time.Millisecond}, MinBackoff: time.Millisecond, RatePerSecond: -1})
		tickets, err := c.Send(context.Background(), msgs)
		if err != nil {
			t.Fatal(err)
		}
		fake.Fail(1, http.StatusServiceUnavailable, "")
		fake.SetAnswerDelay(time.Minute)
		fake.SetOnAnswer(func(string) { fake.SetAnswerDelay(0) }) // only the first answer that gets that far is late
		got, err := c.Receipts(context.Background(), []string{tickets[0].ID})
		if err != nil || got[tickets[0].ID].Status != "ok" {
			t.Errorf("receipts after a 503 and a timeout = %v, %v; want them retried through", got, err)
		}
		if n := fake.Requests("getReceipts"); n != 3 {
			t.Errorf("the fake got %d receipt requests; want 3", n)
		}
	})
}

// breakingConn is a connection that breaks while the first request on it is
// written: the server gets its first bytes, never the whole request.
type breakingConn struct{ net.Conn }

func (b *breakingConn) Write(p []byte) (int, error) {
	n, _ := b.Conn.Write(p[:min(len(p), 10)])
	_ = b.Conn.Close()
	return n, errors.New("write: connection reset by peer")
}
