package expo_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/expo"
	"github.com/spoolcast/spoolcast/internal/expofake"
)

func newClient(t *testing.T, fake *expofake.Server) *expo.Client {
	t.Helper()
	ts := httptest.NewServer(fake)
	t.Cleanup(ts.Close)
	c, err := expo.New(expo.Config{URL: ts.URL + "/--/api/v2/push", MinBackoff: time.Millisecond, RatePerSecond: -1})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTicketsComeBackInTheOrderOfTheMessages(t *testing.T) {
	t.Parallel()
	fake := expofake.New()
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
	fake := expofake.New()
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
	fake := expofake.New()
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
	if !errors.As(err, &re) || re.Status != 500 {
		t.Fatalf("send with Expo failing = %v; want a RequestError 500 after the retries", err)
	}
	if n := fake.Requests("send"); n != 3+4 {
		t.Errorf("the fake got %d sends; want 3 (two 429s, then ok) + 4 (one try, three retries)", n)
	}
}
