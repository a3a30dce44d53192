package devices_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/devices/devicestest"
	"github.com/spoolcast/spoolcast/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// stack is a device store over a database of its own.
type stack struct {
	t       *testing.T
	dbURL   string
	pool    *pgxpool.Pool
	metrics *devices.Metrics
	devices *devices.Store
}

func newStack(t *testing.T) *stack {
	t.Helper()
	s := &stack{t: t, dbURL: pgtest.DB(t), metrics: devices.NewMetrics(prometheus.NewRegistry())}
	s.pool = s.connect()
	s.devices = devices.New(s.pool, s.metrics)
	return s
}

func (s *stack) connect() *pgxpool.Pool {
	s.t.Helper()
	pool, err := pgxpool.New(context.Background(), s.dbURL)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(pool.Close)
	return pool
}

// register registers Expo tokens for user, as from iPhones.
func (s *stack) register(user string, tokens ...string) {
	s.t.Helper()
	for _, tok := range tokens {
		if _, err := s.devices.Register(context.Background(), user, tok, devices.IOS); err != nil {
			s.t.Fatal(err)
		}
	}
}

// disabled is spoolcast_tokens_disabled_total for reason.
func (s *stack) disabled(reason string) float64 {
	return testutil.ToFloat64(s.metrics.TokensDisabled(reason))
}

// seenAgo moves token's last_seen_at back by ago, as if the app had last
// registered it then.
func (s *stack) seenAgo(token string, ago time.Duration) {
	s.t.Helper()
	if _, err := s.pool.Exec(context.Background(), `UPDATE devices SET last_seen_at = now() - $2::interval WHERE token = $1`, token, ago); err != nil {
		s.t.Fatal(err)
	}
}

// deviceStates is every device of user: its token's reason when disabled,
// "" when enabled.
func (s *stack) deviceStates(user string) map[string]string {
	s.t.Helper()
	return devicestest.States(s.t, s.devices, user)
}

// enabledCount is how many of user's devices are enabled.
func enabledCount(states map[string]string) int {
	n := 0
	for _, reason := range states {
		if reason == "" {
			n++
		}
	}
	return n
}

func TestARegistrationPastTheCapReplacesTheLeastRecentlySeenDevice(t *testing.T) {
	t.Parallel()
	s := newStack(t) // the default cap
	const n = devices.DefaultMaxEnabledPerUser
	tok := func(i int) string { return fmt.Sprintf("ExponentPushToken[t%02d]", i) }
	for i := range n {
		s.register("u1", tok(i))
	}
	// Seen most recently in the order they were registered, but for t07 and
	// t13: the least recently seen are not the first created.
	for i := range n {
		s.seenAgo(tok(i), time.Duration(n-i)*time.Minute)
	}
	s.seenAgo(tok(7), 10*time.Hour)
	s.seenAgo(tok(13), 9*time.Hour)
	s.register("u2", "ExponentPushToken[other]") // another user's cap is apart

	dev, err := s.devices.Register(context.Background(), "u1", tok(n), devices.Android)
	if err != nil {
		t.Fatal(err)
	}
	if !dev.Enabled || dev.Token != tok(n) {
		t.Errorf("the new device = %+v; want it enabled", dev)
	}
	states := s.deviceStates("u1")
	if len(states) != n+1 || enabledCount(states) != n || states[tok(7)] != devices.DisabledReplaced {
		t.Fatalf("after the %dth registration: %v; want %d enabled and the least recently seen, t07, %s", n+1, states, n, devices.DisabledReplaced)
	}
	if got := s.disabled(devices.DisabledReplaced); got != 1 {
		t.Errorf("tokens disabled as replaced = %v, want 1", got)
	}

	// The replaced phone comes back: it is on again, and the next least
	// recently seen makes room.
	s.register("u1", tok(7))
	states = s.deviceStates("u1")
	if len(states) != n+1 || enabledCount(states) != n || states[tok(7)] != "" || states[tok(13)] != devices.DisabledReplaced {
		t.Fatalf("after t07 registered again: %v; want %d enabled, t07 among them, and t13 %s", states, n, devices.DisabledReplaced)
	}
	if got := s.disabled(devices.DisabledReplaced); got != 2 {
		t.Errorf("tokens disabled as replaced = %v, want 2", got)
	}
	if states := s.deviceStates("u2"); len(states) != 1 || states["ExponentPushToken[other]"] != "" {
		t.Errorf("u2's devices = %v; want its one device untouched by u1's cap", states)
	}
}

func TestAtTheCapAStillHereReplacesNothingAndATakeoverReplacesOne(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.devices.MaxEnabledPerUser = 2
	a, b, c := "ExponentPushToken[a]", "ExponentPushToken[b]", "ExponentPushToken[c]"
	s.register("u1", a, b)
	s.seenAgo(a, time.Hour)
	s.register("u2", c)

	s.register("u1", b) // "still here" from a device already on
	if states := s.deviceStates("u1"); len(states) != 2 || enabledCount(states) != 2 {
		t.Fatalf("after an enabled device registered again: %v; want both still enabled", states)
	}
	s.register("u1", c) // u2's phone changed hands
	if states := s.deviceStates("u1"); len(states) != 3 || enabledCount(states) != 2 || states[a] != devices.DisabledReplaced {
		t.Fatalf("after taking over u2's token: %v; want b and c enabled, a %s", states, devices.DisabledReplaced)
	}
	if states := s.deviceStates("u2"); len(states) != 0 {
		t.Errorf("u2 still lists the phone now u1's: %v", states)
	}
	if got := s.disabled(devices.DisabledReplaced); got != 1 {
		t.Errorf("tokens disabled as replaced = %v, want 1", got)
	}
}

func TestConcurrentRegistrationsFromTwoReplicasNeverPassTheCap(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	const limit, registrations = 3, 50
	// Two replicas: two stores, each over its own pool.
	replicas := []*devices.Store{devices.New(s.pool, s.metrics), devices.New(s.connect(), s.metrics)}
	for _, d := range replicas {
		d.MaxEnabledPerUser = limit
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range registrations {
		wg.Go(func() {
			<-start
			tok := fmt.Sprintf("ExponentPushToken[c%02d]", i)
			if _, err := replicas[i%2].Register(context.Background(), "u1", tok, devices.IOS); err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	states := s.deviceStates("u1")
	replaced := 0
	for _, reason := range states {
		if reason == devices.DisabledReplaced {
			replaced++
		}
	}
	// The user's list keeps the enabled ones and as many disabled, the
	// latest: made-up tokens grow no table.
	if len(states) != 2*limit || enabledCount(states) != limit || replaced != limit {
		t.Fatalf("after %d concurrent registrations: %d devices, %d enabled, %d replaced kept; want %d, %d, %d",
			registrations, len(states), enabledCount(states), replaced, 2*limit, limit, limit)
	}
	if got := s.disabled(devices.DisabledReplaced); got != registrations-limit {
		t.Errorf("tokens disabled as replaced = %v, want %d", got, registrations-limit)
	}
}
