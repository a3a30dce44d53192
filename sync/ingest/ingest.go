package ingest

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/weekly"
)

//go:embed ingest.sql
var ingestSQL string

// Item is one producer event to persist.
type Item struct {
	// Producer scopes the event's key: the relay's --producer, or the service
	// token's subject at central.
	Producer string
	Event    event.Event
	// Hash is the SHA-256 of the event's canonical form; computed when nil.
	Hash []byte
	// ReceivedAt is when the first ingress point received the event.
	ReceivedAt time.Time
}

// Result is the outcome of one event and the notifications it created.
// Accepted means at least one recipient got a new notification, or the
// event's topic fan-outs were added; Duplicate, that neither happened.
type Result struct {
	Outcome event.Outcome
	Created int
	// Fanouts: the event's topics' fan-outs were added (topics.Fanout
	// writes their members).
	Fanouts bool
}

// DB is what ingest needs of Postgres: a pgxpool.Pool, a pgx.Conn or a pgx.Tx.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Ingest persists a batch of events in one statement, and so one transaction:
// it claims each event's key with its request hash, then every recipient's
// notification key (ON CONFLICT DO NOTHING RETURNING), inserts notifications
// for the keys that came back and queues their push work. It sends no wake-up:
// a caller that ingests continuously tells its Waker (see WakeUp). An
// event whose key was claimed by another request writes nothing and is
// reported Conflict, even when the two race. Sending the same batch twice is
// harmless: the second time every event is Duplicate.
//
// A row for a week without its partition makes Ingest create the partition
// and send again. That waits at most weekly.OnDemandLockTimeout for its lock:
// past it Ingest fails with an error weekly.LockTimeout reports, which a
// caller retries as it retries a lost connection (the forwarder backs off;
// central's ingress answers 503).
//
// The statement keeps no session state (an unnamed statement, its description
// cached by pgx), so it works through PgBouncer in transaction mode.
func Ingest(ctx context.Context, db DB, items []Item) ([]Result, error) {
	if len(items) == 0 {
		return nil, nil
	}
	// One key may come twice in a batch; only its first request is sent, and
	// the others are answered against it below.
	hashes := make([][]byte, len(items))
	first := make(map[string]int, len(items))
	repeatOf := make([]int, len(items))
	sent := make([]int, 0, len(items)) // sent[n-1] is the item of event number n in the statement
	var a ingestArgs
	for i, it := range items {
		hash := it.Hash
		if hash == nil {
			hash = it.Event.Hash()
		}
		hashes[i] = hash
		key := eventKey(it.Producer, it.Event.IdempotencyKey)
		if j, seen := first[key]; seen {
			repeatOf[i] = j
			continue
		}
		first[key], repeatOf[i] = i, -1
		sent = append(sent, i)
		a.addEvent(it, key, hash)
		for _, r := range it.Event.Recipients {
			a.rcptEvent = append(a.rcptEvent, int64(len(sent)))
			a.rcptUser = append(a.rcptUser, r)
		}
		for _, t := range it.Event.Topics {
			a.topicEvent = append(a.topicEvent, int64(len(sent)))
			a.topic = append(a.topic, t)
		}
	}
	var created, conflicted, fanned []int64
	run := func() error {
		return db.QueryRow(ctx, ingestSQL, pgx.QueryExecModeCacheDescribe,
			a.eventKey, a.hash, a.producer, a.producerKey, a.received, a.typ, a.category, a.title, a.body, a.data, a.runID,
			a.rcptEvent, a.rcptUser, a.sendAt, a.priority, a.digestKey, a.digestWindow, a.topicEvent, a.topic,
		).Scan(&created, &conflicted, &fanned)
	}
	err := run()
	if weekly.NoPartition(err) {
		// Maintenance has not created this week's partition (it has not run
		// for weeks, or a week just began): create it and send again. Its
		// lock waits at most weekly.OnDemandLockTimeout; behind DDL, an
		// ANALYZE or a VACUUM of notifications the batch fails with that
		// lock timeout (SQLSTATE 55P03, never refused for good) rather than
		// holding the caller, and is retried like any transient failure.
		if _, err = weekly.Ensure(ctx, db, "notifications", time.Time{}); err == nil {
			err = run()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("ingest %d events: %w", len(items), err)
	}
	results := make([]Result, len(items))
	for i := range results {
		results[i].Outcome = event.Duplicate
	}
	for _, n := range conflicted {
		results[sent[n-1]].Outcome = event.Conflict
	}
	for _, n := range created {
		results[sent[n-1]].Outcome = event.Accepted
		results[sent[n-1]].Created++
	}
	for _, n := range fanned {
		results[sent[n-1]].Outcome = event.Accepted
		results[sent[n-1]].Fanouts = true
	}
	for i, j := range repeatOf {
		switch {
		case j < 0:
		case !bytes.Equal(hashes[i], hashes[j]):
			results[i].Outcome = event.Conflict
		case results[j].Outcome == event.Conflict:
			results[i].Outcome = event.Conflict
		default:
			results[i].Outcome = event.Duplicate
		}
	}
	return results, nil
}

// ingestArgs are the statement's arrays: one element per event for the
// event's columns, one per recipient for the recipients.
type ingestArgs struct {
	eventKey, producer, producerKey, typ, category, title, body, data, runID []string
	hash                                                                     [][]byte
	received                                                                 []*time.Time
	rcptEvent                                                                []int64
	rcptUser                                                                 []string
	topicEvent                                                               []int64
	topic                                                                    []string
	sendAt                                                                   []*time.Time
	priority                                                                 []string
	digestKey, digestWindow                                                  []*string
}

func (a *ingestArgs) addEvent(it Item, eventKey string, hash []byte) {
	var received *time.Time
	if !it.ReceivedAt.IsZero() {
		t := it.ReceivedAt
		received = &t
	}
	data := "{}"
	if len(it.Event.Data) > 0 {
		data = string(it.Event.Data)
	}
	a.eventKey = append(a.eventKey, eventKey)
	a.hash = append(a.hash, hash)
	a.producer = append(a.producer, it.Producer)
	a.producerKey = append(a.producerKey, it.Event.IdempotencyKey)
	a.received = append(a.received, received)
	a.typ = append(a.typ, it.Event.Type)
	a.category = append(a.category, it.Event.Category)
	a.title = append(a.title, it.Event.Title)
	a.body = append(a.body, it.Event.Body)
	a.data = append(a.data, data)
	a.runID = append(a.runID, it.Event.RunID)
	var sendAt *time.Time
	if t := it.Event.SendTime(); !t.IsZero() {
		sendAt = &t
	}
	a.sendAt = append(a.sendAt, sendAt)
	a.priority = append(a.priority, cmp.Or(it.Event.Priority, event.PriorityNormal))
	var digestKey, digestWindow *string
	if d := it.Event.Digest; d != nil {
		w := fmt.Sprintf("%d seconds", int64(it.Event.DigestWindow().Seconds()))
		digestKey, digestWindow = &d.Key, &w
	}
	a.digestKey = append(a.digestKey, digestKey)
	a.digestWindow = append(a.digestWindow, digestWindow)
}
