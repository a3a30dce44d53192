package push_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/channel/expo"
	"github.com/spoolcast/spoolcast/channel/webpush"
	"github.com/spoolcast/spoolcast/channel/webpush/webpushtest"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/push"
)

const phone, later, failed = "ExponentPushToken[phone]", "ExponentPushToken[later]", "ExponentPushToken[failed]"

// clearStack is a web stack whose dispatcher sends clears (or not: on),
// with a browser subscribed at a web-push-testing service and a phone, both
// of user u1.
type clearStack struct {
	*webStack
	svc     *webpushtest.Service
	hash    string // the browser's id at the service
	browser string // its token
	store   *feed.Store
}

func newClearStack(t *testing.T, on bool) *clearStack {
	t.Helper()
	s := newWebStackWith(t, nil, func(c *push.DispatcherConfig) { c.ClearOnRead = on })
	svc := webpushtest.Start(t)
	raw, hash := svc.Subscribe(t, s.key.PublicKey())
	dev := s.subscribe("u1", raw)
	s.register("u1", phone)
	return &clearStack{webStack: s, svc: svc, hash: hash, browser: dev.Token, store: feed.NewStore(s.pool, nil)}
}

// pushed emits n notifications to u1, dispatches them, waits until every
// device has them, and returns their ids, oldest first.
func (s *clearStack) pushed(key string, n int) []feed.ID {
	s.t.Helper()
	for i := range n {
		s.emit(fmt.Sprintf(`{"idempotency_key":"%s%d","type":"t","category":"c","recipients":["u1"],"title":"T%d"}`, key, i, i))
	}
	s.drain()
	testsignal.Eventually(s.t, "the pushes to be sent to every device", 10*time.Second, func() bool {
		return pgtest.Count(s.t, s.pool, `SELECT count(*) FROM push_dispatches WHERE state = 'queued'`) == 0
	})
	ids := s.ids()
	return ids[len(ids)-n:]
}

// ids are u1's notifications, oldest first.
func (s *clearStack) ids() []feed.ID {
	s.t.Helper()
	rows, err := s.pool.Query(context.Background(), `SELECT created_at, id FROM notifications WHERE user_id = 'u1' ORDER BY created_at, id`)
	if err != nil {
		s.t.Fatal(err)
	}
	defer rows.Close()
	var out []feed.ID
	for rows.Next() {
		var id feed.ID
		if err := rows.Scan(&id.CreatedAt, &id.Seq); err != nil {
			s.t.Fatal(err)
		}
		out = append(out, id)
	}
	return out
}

// expoClears are the clear messages the fake Expo took, by token: each the
// ids it names. A clear must be silent: no title, body or sound.
func (s *clearStack) expoClears() map[string][][]string {
	s.t.Helper()
	out := map[string][][]string{}
	for _, m := range s.fake.Messages() {
		if m.Data["type"] != "clear" {
			continue
		}
		if m.Title != "" || m.Body != "" || m.Sound != "" || !m.ContentAvailable || m.Priority != "normal" {
			s.t.Errorf("clear to %s is not silent data: %+v", m.To, m)
		}
		var ids []string
		for _, v := range m.Data["ids"].([]any) {
			ids = append(ids, v.(string))
		}
		out[m.To] = append(out[m.To], ids)
	}
	return out
}

// webClears are the clears the browser got, each the ids it names.
func (s *clearStack) webClears() [][]string {
	s.t.Helper()
	var out [][]string
	for _, raw := range s.svc.Messages(s.t, s.hash) {
		var p struct {
			Type string
			IDs  []string
		}
		if err := json.Unmarshal([]byte(raw), &p); err != nil {
			s.t.Fatalf("the browser got %s: %v", raw, err)
		}
		if p.Type == "clear" {
			out = append(out, p.IDs)
		}
	}
	return out
}

// racePasses runs clear passes of the dispatchers together, rounds times.
func racePasses(t *testing.T, rounds int, ds ...*push.Dispatcher) {
	t.Helper()
	for range rounds {
		var wg sync.WaitGroup
		for _, d := range ds {
			wg.Go(func() {
				if _, err := d.ClearPass(context.Background()); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
}

func strs(ids ...feed.ID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

func TestAReadClearsTheBannerOnceOnEachDeviceThatGotThePushAcrossTwoReplicas(t *testing.T) {
	t.Parallel()
	s := newClearStack(t, true)
	s.register("u1", failed)
	ids := s.pushed("k", 2)
	read, other := ids[0], ids[1]
	// A device registered after the push got none, and one whose push
	// failed has none either: neither has a banner to clear.
	s.register("u1", later)
	if _, err := s.pool.Exec(context.Background(), `UPDATE push_dispatches SET state = 'failed' WHERE token = $1`, failed); err != nil {
		t.Fatal(err)
	}
	second, err := push.NewDispatcher(push.DispatcherConfig{DB: s.connect(), Sender: s.client, Preferences: s.prefs, Devices: s.devices,
		WebPush: mustWebSender(t, s), WebTimeout: 5 * time.Second, ClearOnRead: true, Metrics: s.metrics, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}

	if err := s.store.MarkRead(context.Background(), "u1", read); err != nil {
		t.Fatal(err)
	}
	racePasses(t, 5, s.dispatcher, second)
	want := [][]string{strs(read)}
	if got := s.expoClears(); !slices.EqualFunc(got[phone], want, slices.Equal) || len(got) != 1 {
		t.Errorf("Expo got clears %v; want one to the phone naming %v, none to the device registered later", got, want[0])
	}
	if got := s.webClears(); len(got) != 0 {
		t.Errorf("the browser got clears %v; want none: a push that shows nothing costs the site", got)
	}

	// Read again (after an unread), and archived: it was cleared already.
	ctx := context.Background()
	if err := s.store.MarkUnread(ctx, "u1", read); err != nil {
		t.Fatal(err)
	}
	if err := s.store.MarkRead(ctx, "u1", read); err != nil {
		t.Fatal(err)
	}
	if err := s.store.Archive(ctx, "u1", read); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // past the device's second, so that a second clear could go
	racePasses(t, 3, s.dispatcher, second)
	if got := s.expoClears(); len(got[phone]) != 1 || len(got) != 1 {
		t.Errorf("after a second read and an archive Expo got clears %v; want still the one", got)
	}
	if got := s.webClears(); len(got) != 0 {
		t.Errorf("after a second read and an archive the browser got clears %v; want still none", got)
	}

	// The delivery log shows each clear beside its push, and the metric counts them.
	page, err := push.Deliveries(ctx, s.pool, push.DeliveryQuery{UserID: "u1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range page.Data {
		browser := strings.HasPrefix(*d.Token, "WebPush[") // the log shows tokens shortened
		switch want := *d.NotificationID == read.String() && d.State != push.StateFailed; {
		case want && browser:
			if d.Clear == nil || d.Clear.State != "skipped" || d.Clear.Error == nil || !strings.Contains(*d.Clear.Error, "a browser gets no clear") {
				t.Errorf("delivery of %s to the browser: clear %+v; want skipped, saying why", *d.NotificationID, d.Clear)
			}
		case want:
			if d.Clear == nil || d.Clear.State != "sent" || d.Clear.SentAt == nil {
				t.Errorf("delivery of %s to %s: clear %+v; want sent", *d.NotificationID, *d.Token, d.Clear)
			}
		case d.Clear != nil:
			t.Errorf("delivery of %s to %s: clear %+v; want none", *d.NotificationID, *d.Token, d.Clear)
		}
	}
	for p, result := range map[string]string{push.ProviderExpo: push.ClearSent, push.ProviderWebPush: push.ClearSkipped} {
		if n := s.counter("spoolcast_push_clears_total", "provider", p, "result", result); n != 1 {
			t.Errorf("spoolcast_push_clears_total{provider=%s,result=%s} = %v; want 1", p, result, n)
		}
	}
	if slices.ContainsFunc(s.expoClears()[phone], func(ids []string) bool { return slices.Contains(ids, other.String()) }) {
		t.Errorf("the notification not read was cleared")
	}
}

func TestAReadAllClearsTheNotificationsItCoversInOneMessagePerDevice(t *testing.T) {
	t.Parallel()
	s := newClearStack(t, true)
	ids := s.pushed("k", 3)
	if _, ok, err := s.store.MarkAllRead(context.Background(), "u1"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	// One notification after the read-all: not covered, never cleared.
	s.pushed("after", 1)
	racePasses(t, 3, s.dispatcher)
	want := [][]string{strs(ids...)}
	if got := s.expoClears(); !slices.EqualFunc(got[phone], want, slices.Equal) || len(got) != 1 {
		t.Errorf("Expo got clears %v; want one to the phone naming %v", got, want[0])
	}
	if got := s.webClears(); len(got) != 0 {
		t.Errorf("the browser got clears %v; want none", got)
	}
}

func TestWithClearOnReadOffAReadSendsNothing(t *testing.T) {
	t.Parallel()
	s := newClearStack(t, false)
	ids := s.pushed("k", 1)
	if err := s.store.MarkRead(context.Background(), "u1", ids[0]); err != nil {
		t.Fatal(err)
	}
	racePasses(t, 3, s.dispatcher)
	if got := s.expoClears(); len(got) != 0 {
		t.Errorf("Expo got clears %v; want none", got)
	}
	if got := s.webClears(); len(got) != 0 {
		t.Errorf("the browser got clears %v; want none", got)
	}
	if n := pgtest.Count(t, s.pool, `SELECT count(*) FROM push_clears WHERE state = 'skipped'`); n != 2 {
		t.Errorf("%d clears recorded skipped; want 2, so that turning it on later sends none of them", n)
	}
}

// A device gets at most clearMaxIDs (100) ids a message and one message a
// second: a read-all of 150 goes in two, a second apart.
func TestAClearOfManyIsSplitAndADeviceGetsAtMostOneASecond(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	d, err := push.NewDispatcher(push.DispatcherConfig{DB: s.pool, Sender: s.client, Preferences: s.prefs, Devices: s.devices,
		ClearOnRead: true, Metrics: s.metrics, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s.register("u1", phone)
	for i := range 150 {
		s.ingest(fmt.Sprintf("k%d", i), "c", "u1")
	}
	s.drain()
	if _, ok, err := feed.NewStore(s.pool, nil).MarkAllRead(context.Background(), "u1"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	clears := func() (out []expo.Message) {
		for _, m := range s.fake.Messages() {
			if m.Data["type"] == "clear" {
				out = append(out, m)
			}
		}
		return out
	}
	start := time.Now()
	racePasses(t, 3, d)
	if got := clears(); len(got) != 1 || len(got[0].Data["ids"].([]any)) != 100 {
		t.Fatalf("after the first passes Expo got %d clears; want one of 100 ids", len(got))
	}
	testsignal.Eventually(t, "the second clear", 5*time.Second, func() bool {
		racePasses(t, 1, d)
		return len(clears()) == 2
	})
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("the second clear came %s after the first; want a second", took)
	}
	if got := clears(); len(got[1].Data["ids"].([]any)) != 50 {
		t.Errorf("the second clear names %d ids; want 50", len(got[1].Data["ids"].([]any)))
	}
}

// mustWebSender is a Web Push sender with the stack's VAPID key: a second
// replica signs as the first.
func mustWebSender(t *testing.T, s *clearStack) *webpush.Sender {
	t.Helper()
	sender, err := webpush.NewSender(s.key, "mailto:ops@example.com", nil)
	if err != nil {
		t.Fatal(err)
	}
	return sender
}
