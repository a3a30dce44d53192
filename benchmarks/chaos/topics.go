package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/client"
	"github.com/spoolcast/spoolcast/topics"
)

// The broadcast: topic "everyone" holds topicMembers users without apps and
// every app user, and one event to it is written while a central replica,
// a relay and Postgres are each killed (SIGKILL) in the middle of its
// fan-out. checkEvents holds it to every member exactly once.
const (
	broadcastTopic = "everyone"
	topicMembers   = 100_000
)

func topicMember(i int) string { return fmt.Sprintf("member-%06d", i) }

// broadcastMembers are the topic's members: every one of them must get the
// broadcast once.
func broadcastMembers() []string {
	out := make([]string, 0, topicMembers+appUsers)
	for i := range topicMembers {
		out = append(out, topicMember(i))
	}
	for i := range appUsers {
		out = append(out, appUser(i))
	}
	return out
}

// fillTopic makes the broadcast's topic, before traffic begins.
func fillTopic(ctx context.Context, w *world) error {
	pool, err := pgxpool.New(ctx, w.dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := topics.NewStore(pool)
	members := broadcastMembers()
	for len(members) > 0 {
		n := min(len(members), topics.MaxChange)
		if _, err := store.ChangeMembers(ctx, broadcastTopic, members[:n], nil); err != nil {
			return fmt.Errorf("fill topic %s: %w", broadcastTopic, err)
		}
		members = members[n:]
	}
	return nil
}

// broadcastName is the fault's name.
const broadcastName = "a 100,000-member topic event: a central, a relay and Postgres killed (-9) mid-fan-out"

// broadcast sends the topic event through a relay, then kills a central
// replica, a relay and the Postgres primary (crash recovery on restart) as
// the fan-out passes a fifth, two fifths and three fifths of its members.
func broadcast(ctx context.Context, w *world, rng *rand.Rand) (string, error) {
	c, err := client.New(client.Config{RelayURL: w.relays[0].base,
		HTTPClient:  &http.Client{Transport: recording{http.DefaultTransport, w.ledger}},
		MaxAttempts: 100, MaxElapsed: 3 * time.Minute, MaxBackoff: 2 * time.Second})
	if err != nil {
		return "", err
	}
	ev := client.Event{IdempotencyKey: "broadcast-" + uuid4(rng), Type: "chaos.broadcast", Category: "chaos",
		Title: "broadcast", Topics: []string{broadcastTopic}}
	// Recorded with its members, so that the event checks hold each of them
	// to exactly one notification.
	w.ledger.record(ev.IdempotencyKey, broadcastMembers(), false, false)
	emit(ctx, c, ev, w.ledger)
	all := topicMembers + appUsers
	var detail string
	for i, kill := range []func() (string, error){
		func() (string, error) { return killCentral(ctx, w, rng) },
		func() (string, error) { return killRelay(ctx, w, rng) },
		func() (string, error) { return killPostgres(ctx, w) },
	} {
		at, err := waitWritten(ctx, w, ev.IdempotencyKey, all*(i+1)/5)
		if err != nil {
			return detail, err
		}
		what, err := kill()
		detail += fmt.Sprintf("%s at %d written; ", what, at)
		if err != nil {
			return detail, err
		}
	}
	return detail + fmt.Sprintf("key %s", ev.IdempotencyKey), nil
}

// killPostgres kills the primary as a crash of its host would and starts it
// again, in crash recovery.
func killPostgres(ctx context.Context, w *world) (string, error) {
	p := w.current()
	if err := p.Kill(); err != nil {
		return "postgres", err
	}
	sleep(ctx, time.Second)
	return fmt.Sprintf("postgres on port %d", p.Port()), p.Restart(context.WithoutCancel(ctx))
}

// waitWritten waits, for at most two minutes, until the broadcast's
// fan-out has written at least n members or ended, and returns how many it
// had.
func waitWritten(ctx context.Context, w *world, key string, n int) (int, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var written int
		var ended bool
		db, err := pgx.Connect(ctx, w.dbURL)
		if err == nil {
			err = db.QueryRow(ctx, `SELECT coalesce(sum(r.written), 0), bool_and(f.state IN ('completed', 'cancelled'))
				FROM topic_fanouts f LEFT JOIN topic_fanout_ranges r ON r.fanout_id = f.id WHERE f.idempotency_key = $1`, key).Scan(&written, &ended)
			db.Close(context.WithoutCancel(ctx))
		}
		if err == nil && (written >= n || ended) {
			return written, nil
		}
		if time.Now().After(deadline) {
			return written, fmt.Errorf("the fan-out of %s wrote %d members in two minutes, not %d (last error %v)", key, written, n, err)
		}
		if ctx.Err() != nil {
			return written, ctx.Err()
		}
		sleep(ctx, 100*time.Millisecond)
	}
}
