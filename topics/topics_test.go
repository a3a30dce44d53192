package topics_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/topics"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func users(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%05d", prefix, i)
	}
	return out
}

func TestMembershipChangesAreIdempotentAndCounted(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := topics.NewStore(pool)
	ctx := context.Background()
	c, err := s.ChangeMembers(ctx, "launch", users("u", topics.MaxChange), nil)
	if err != nil || c != (topics.Change{Added: topics.MaxChange}) {
		t.Fatalf("add 10,000: %+v, %v", c, err)
	}
	// The same request again changes nothing; a mixed one counts only what
	// it changed.
	if c, err := s.ChangeMembers(ctx, "launch", users("u", topics.MaxChange), nil); err != nil || c != (topics.Change{}) {
		t.Errorf("the same add again: %+v, %v; want nothing changed", c, err)
	}
	c, err = s.ChangeMembers(ctx, "launch", []string{"u00000", "new-1"}, []string{"u00001", "u00002", "never-a-member"})
	if err != nil || c != (topics.Change{Added: 1, Removed: 2}) {
		t.Errorf("mixed change: %+v, %v; want 1 added, 2 removed", c, err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM topic_members WHERE topic = 'launch'`); n != topics.MaxChange-1 {
		t.Errorf("%d members; want %d", n, topics.MaxChange-1)
	}
	tp, err := s.Get(ctx, "launch")
	if err != nil || tp.Open {
		t.Errorf("a topic created by adding members: %+v, %v; want it closed", tp, err)
	}
	// Removing from a topic that does not exist does not create it.
	if c, err := s.ChangeMembers(ctx, "nothing-here", nil, []string{"u1"}); err != nil || c != (topics.Change{}) {
		t.Errorf("remove from a missing topic: %+v, %v", c, err)
	}
	if _, err := s.Get(ctx, "nothing-here"); !errors.Is(err, topics.ErrNotFound) {
		t.Errorf("a removal created the topic: %v", err)
	}
}

func TestBadChangesAreRefusedWithTheirReason(t *testing.T) {
	t.Parallel()
	s := topics.NewStore(pgtest.Pool(t))
	for _, tc := range []struct {
		topic       string
		add, remove []string
		want        string
	}{
		{"Launch", []string{"u1"}, nil, "a topic's name"},
		{strings.Repeat("a", 129), []string{"u1"}, nil, "a topic's name"},
		{"", []string{"u1"}, nil, "a topic's name"},
		{"launch", users("u", topics.MaxChange), []string{"x"}, "at most 10000"},
		{"launch", []string{"u1"}, []string{"u1"}, "both added and removed"},
		{"launch", []string{" "}, nil, "empty"},
		{"launch", []string{strings.Repeat("u", 257)}, nil, "longer than 256"},
		{"launch", nil, []string{"a\x00b"}, "NUL"},
		{"launch", []string{"\xff"}, nil, "UTF-8"},
		{"..", []string{"u1"}, nil, "the first a letter or digit"},
		{".hidden", []string{"u1"}, nil, "the first a letter or digit"},
	} {
		_, err := s.ChangeMembers(context.Background(), tc.topic, tc.add, tc.remove)
		if !errors.Is(err, topics.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.20q add %d remove %d: %v; want invalid, %q", tc.topic, len(tc.add), len(tc.remove), err, tc.want)
		}
	}
}

func TestUsersSubscribeOnlyToOpenTopics(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := topics.NewStore(pool)
	ctx := context.Background()
	if _, err := s.ChangeMembers(ctx, "staff", []string{"alice"}, nil); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"staff", "missing"} {
		if _, _, err := s.Subscribe(ctx, "bob", topic); !errors.Is(err, topics.ErrNotFound) {
			t.Errorf("subscribe to %s: %v; want not found (closed or missing alike)", topic, err)
		}
		if err := s.Unsubscribe(ctx, "alice", topic); !errors.Is(err, topics.ErrNotFound) {
			t.Errorf("unsubscribe from %s: %v; want not found", topic, err)
		}
	}
	if _, created, err := s.Set(ctx, "releases", true); err != nil || !created {
		t.Fatalf("open releases: created %v, %v", created, err)
	}
	sub, created, err := s.Subscribe(ctx, "bob", "releases")
	if err != nil || !created || sub.Topic != "releases" || !sub.Open || sub.SubscribedAt.IsZero() {
		t.Fatalf("subscribe: %+v created %v, %v", sub, created, err)
	}
	again, created, err := s.Subscribe(ctx, "bob", "releases")
	if err != nil || created || !again.SubscribedAt.Equal(sub.SubscribedAt) {
		t.Errorf("subscribe again: %+v created %v, %v; want the first subscription, unchanged", again, created, err)
	}
	// Closing a topic keeps its members; they can no longer leave by themselves.
	if _, created, err := s.Set(ctx, "releases", false); err != nil || created {
		t.Fatalf("close releases: created %v, %v", created, err)
	}
	if err := s.Unsubscribe(ctx, "bob", "releases"); !errors.Is(err, topics.ErrNotFound) {
		t.Errorf("unsubscribe from a closed topic: %v; want not found", err)
	}
	if _, _, err := s.Set(ctx, "releases", true); err != nil {
		t.Fatal(err)
	}
	for range 2 { // leaving twice is no error
		if err := s.Unsubscribe(ctx, "bob", "releases"); err != nil {
			t.Errorf("unsubscribe: %v", err)
		}
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM topic_members WHERE user_id = 'bob'`); n != 0 {
		t.Errorf("bob is in %d topics after leaving", n)
	}
}

func TestAUsersTopicsPageByName(t *testing.T) {
	t.Parallel()
	s := topics.NewStore(pgtest.Pool(t))
	ctx := context.Background()
	names := []string{"a.news", "b.sales", "c-ops", "d_oncall", "e9"}
	for i, n := range names {
		if _, _, err := s.Set(ctx, n, i%2 == 0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ChangeMembers(ctx, n, []string{"carol"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		subs, more, err := s.List(ctx, "carol", after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, sub := range subs {
			got = append(got, sub.Topic)
			if want := slices.Index(names, sub.Topic)%2 == 0; sub.Open != want {
				t.Errorf("%s open %v; want %v", sub.Topic, sub.Open, want)
			}
			after = sub.Topic
		}
		if !more {
			break
		}
		if pages > 5 {
			t.Fatal("pages do not end")
		}
	}
	if !slices.Equal(got, names) {
		t.Errorf("pages gave %v; want %v", got, names)
	}
	if _, _, err := s.List(ctx, "carol", "", topics.MaxListPage+1); !errors.Is(err, topics.ErrInvalid) {
		t.Errorf("limit past the page's longest: %v", err)
	}
	for _, after := range []string{"\xff", "a\x00", "Upper"} {
		if _, _, err := s.List(ctx, "carol", after, 10); !errors.Is(err, topics.ErrInvalid) {
			t.Errorf("after %q: %v; want invalid (not a Postgres error)", after, err)
		}
	}
}

// Two services adding the same new members at once, listed in opposite
// orders, both succeed: neither waits on the other's rows in a cycle.
func TestConcurrentAddsOfTheSameMembersDoNotDeadlock(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := topics.NewStore(pool)
	ctx := context.Background()
	for round := range 5 {
		// The topic exists: otherwise the second change waits for the
		// first's topic row, and they never overlap.
		topic := fmt.Sprintf("crowd-%d", round)
		if _, _, err := s.Set(ctx, topic, false); err != nil {
			t.Fatal(err)
		}
		forward := users("m", 2000)
		backward := slices.Clone(forward)
		slices.Reverse(backward)
		errs := make(chan error, 2)
		start := make(chan struct{})
		for _, list := range [][]string{forward, backward} {
			go func() {
				<-start
				_, err := s.ChangeMembers(ctx, topic, list, nil)
				errs <- err
			}()
		}
		close(start)
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if n := pgtest.Count(t, pool, `SELECT count(*) FROM topic_members WHERE topic = $1`, topic); n != 2000 {
			t.Errorf("round %d: %d members; want 2000", round, n)
		}
	}
}

// A user named twice in one change is one member, counted once.
func TestAUserNamedTwiceCountsOnce(t *testing.T) {
	t.Parallel()
	s := topics.NewStore(pgtest.Pool(t))
	c, err := s.ChangeMembers(context.Background(), "twice", []string{"u1", "u1", "u2"}, nil)
	if err != nil || c != (topics.Change{Added: 2}) {
		t.Errorf("%+v, %v; want 2 added", c, err)
	}
}
