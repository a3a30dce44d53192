package push_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/push"
)

// Without a ttl Expo keeps a message 0 s on iOS and four weeks on Android:
// a push is kept the day APNs and FCM direct keep it, a clear an hour.
func TestExpoIsToldHowLongToKeepEachPushAndClear(t *testing.T) {
	t.Parallel()
	s := newClearStack(t, true)
	read := s.pushed("k", 1)[0]
	if err := s.store.MarkRead(context.Background(), "u1", read); err != nil {
		t.Fatal(err)
	}
	racePasses(t, 3, s.dispatcher)
	pushes, clears := 0, 0
	for _, m := range s.fake.Messages() {
		if m.To != phone {
			continue
		}
		switch {
		case m.TTL == nil:
			t.Errorf("a message to Expo without a ttl: %+v", m)
		case m.ContentAvailable && m.Title == "":
			clears++
			if *m.TTL != 3600 {
				t.Errorf("a clear's ttl = %d s, want 3600", *m.TTL)
			}
		default:
			pushes++
			if *m.TTL != 24*3600 {
				t.Errorf("a push's ttl = %d s, want 86400", *m.TTL)
			}
		}
	}
	if pushes != 1 || clears != 1 {
		t.Errorf("Expo got %d pushes and %d clears for the phone, want one of each", pushes, clears)
	}
}

// Expo: for MessageRateExceeded, "implement exponential backoff and slowly
// retry sending messages". A receipt saying so means Expo did not deliver
// the push: it is sent again, a minute later, then two, until one is
// delivered or the next try would be past --push-max-age (1h here).
func TestAReceiptSayingMessageRateExceededSendsThePushAgainWithBackoff(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	s := newStackOn(t, clk)
	phone, quiet := "ExponentPushToken[busy]", "ExponentPushToken[quiet]"
	s.register("u1", phone, quiet)
	s.fake.ExceedRateAtReceipt(phone, 2)
	s.ingest("e1", "general", "u1")
	s.drain()

	toPhone := func() int {
		n := 0
		for _, m := range s.fake.Messages() {
			if m.To == phone {
				n++
			}
		}
		return n
	}
	for try, wait := range []time.Duration{time.Minute, 2 * time.Minute} {
		if err := s.receipts.Pass(context.Background()); err != nil {
			t.Fatal(err)
		}
		s.drain() // not due yet: nothing is sent
		if got := toPhone(); got != try+1 {
			t.Fatalf("before the backoff of try %d ran out Expo got %d pushes to the phone, want %d", try+1, got, try+1)
		}
		clk.Advance(wait)
		s.drain()
		if got := toPhone(); got != try+2 {
			t.Fatalf("after a backoff of %s Expo got %d pushes to the phone, want %d", wait, got, try+2)
		}
	}
	if err := s.receipts.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	rows, err := s.pool.Query(context.Background(), `SELECT token, state FROM push_dispatches ORDER BY created_at, id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Token, State string
	}])
	if err != nil {
		t.Fatal(err)
	}
	states := map[string][]string{}
	for _, r := range got {
		states[r.Token] = append(states[r.Token], r.State)
	}
	if want := []string{"deferred", "deferred", "delivered"}; !slices.Equal(states[phone], want) {
		t.Errorf("the phone's dispatches: %v, want %v", states[phone], want)
	}
	if want := []string{"delivered"}; !slices.Equal(states[quiet], want) {
		t.Errorf("the other device's dispatches: %v, want %v: it got the push once", states[quiet], want)
	}
}

func TestAReceiptSayingMessageRateExceededPastThePushMaxAgeEndsThePush(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	s := newStackOn(t, clk)
	phone := "ExponentPushToken[busy]"
	s.register("u1", phone)
	s.fake.ExceedRateAtReceipt(phone, 1)
	s.ingest("e1", "general", "u1")
	s.drain()
	clk.Advance(59*time.Minute + 30*time.Second) // the next try would be due past the hour
	if err := s.receipts.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	var state, why string
	if err := s.pool.QueryRow(context.Background(), `SELECT state, error FROM push_dispatches`).Scan(&state, &why); err != nil {
		t.Fatal(err)
	}
	if state != push.StateReceiptError || !strings.Contains(why, "MessageRateExceeded") || !strings.Contains(why, "--push-max-age") {
		t.Errorf("the dispatch: %s %q; want receipt_error saying it is not sent again past --push-max-age", state, why)
	}
	if n := pgtest.Count(t, s.pool, `SELECT count(*) FROM push_queue`); n != 0 {
		t.Errorf("%d rows queued again, want none", n)
	}
}

// Expo refuses a request mixing tokens of two projects whole (400
// PUSH_TOO_MANY_EXPERIENCE_IDS, its details naming each project's tokens):
// one stray token must not fail the nine others' pushes.
func TestAForeignExpoTokenIsDisabledAndTheOthersInItsBatchAreSent(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	foreign := "ExponentPushToken[stray]"
	s.fake.SetExperience(foreign, "@someone-else/their-app")
	var users []string
	for i := range 9 {
		u := fmt.Sprintf("u%d", i)
		s.register(u, fmt.Sprintf("ExponentPushToken[ours-%d]", i))
		users = append(users, u)
	}
	s.register("u-stray", foreign)
	s.ingest("e1", "general", append(users, "u-stray")...)
	s.drain()

	if got := s.states(); got[push.StateSent] != 9 || got[push.StateFailed] != 1 || len(got) != 2 {
		t.Errorf("dispatches by state %v; want the 9 of this project sent and the stray one failed", got)
	}
	var why string
	if err := s.pool.QueryRow(context.Background(), `SELECT error FROM push_dispatches WHERE token = $1`, foreign).Scan(&why); err != nil || !strings.Contains(why, "@someone-else/their-app") {
		t.Errorf("the stray token's dispatch says %q (%v); want the project it belongs to", why, err)
	}
	if s.enabled(foreign) {
		t.Error("the stray token is still enabled")
	}
	if got := s.counter("spoolcast_tokens_disabled_total", "reason", devices.DisabledForeign); got != 1 {
		t.Errorf("tokens disabled as another project's = %v, want 1", got)
	}
	if got := len(s.fake.Messages()); got != 9 {
		t.Errorf("Expo accepted %d messages, want 9", got)
	}
	// The next event reaches the nine in one request, without the stray.
	before := s.fake.Requests("send")
	s.ingest("e2", "general", append(users, "u-stray")...)
	s.drain()
	if got := s.fake.Requests("send") - before; got != 1 {
		t.Errorf("the next event took %d requests, want 1", got)
	}
}
