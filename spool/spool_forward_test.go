package spool_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/spool"
)

func TestBatchesForwardInOrderAndPruneAfterTTL(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s := openSpool(t, spool.Config{Clock: clk, PruneInterval: 1000 * time.Hour, KeyTTL: time.Hour})
	ctx := context.Background()
	for i := range 5 {
		if _, err := s.Claim(ctx, entry(fmt.Sprintf("k%d", i), "h")); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second)
	}
	select {
	case <-s.Wake():
	default:
		t.Error("no wake-up after new rows committed")
	}
	batch, err := s.NextBatch(ctx, 0, spool.BatchLimit{Rows: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(batch) != 3 || batch[0].Key != "k0" || batch[2].Key != "k2" || string(batch[1].Payload) != `{"k":"k1"}` || string(batch[1].Hash) != "h" {
		t.Fatalf("first batch = %+v; want k0..k2 with payloads and hashes", batch)
	}
	if err := s.MarkFailed(ctx, []int64{batch[0].Seq}); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkForwarded(ctx, []int64{batch[0].Seq, batch[1].Seq, batch[2].Seq}); err != nil {
		t.Fatal(err)
	}
	rest, err := s.NextBatch(ctx, 0, spool.BatchLimit{Rows: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(rest) != 2 || rest[0].Key != "k3" {
		t.Fatalf("after ack, pending = %+v; want k3, k4", rest)
	}
	if after, _ := s.NextBatch(ctx, rest[0].Seq, spool.BatchLimit{Rows: 10}); len(after) != 1 || after[0].Key != "k4" {
		t.Fatalf("pending after k3's seq = %+v; want k4", after)
	}
	st, _ := s.Stats(ctx)
	if st.Pending != 2 || !st.OldestPending.Equal(rest[0].ReceivedAt) || st.OldestPendingAge != 2*time.Second {
		t.Errorf("stats = %+v; want 2 pending, oldest k3 aged 2s", st)
	}

	clk.Advance(59 * time.Minute)
	if n, err := s.Prune(ctx); err != nil || n != 0 {
		t.Fatalf("prune before TTL removed %d (%v); want 0", n, err)
	}
	clk.Advance(2 * time.Minute)
	if n, err := s.Prune(ctx); err != nil || n != 3 {
		t.Fatalf("prune after TTL removed %d (%v); want the 3 forwarded rows", n, err)
	}
	clk.Advance(48 * time.Hour)
	if n, _ := s.Prune(ctx); n != 0 {
		t.Fatalf("prune removed %d pending rows; pending rows are never pruned", n)
	}
	all, _ := s.List(ctx, spool.AllRows, 0)
	if len(all) != 2 {
		t.Errorf("after prune %d rows remain, want the 2 pending", len(all))
	}
	// A pruned key is new again: Postgres's claim makes the re-send harmless.
	if res, err := s.Claim(ctx, entry("k0", "h")); err != nil || res.Outcome != event.Accepted {
		t.Errorf("claim of pruned key = %v, %v; want accepted", res.Outcome, err)
	}
	// Seqs are never reused, even once pruning removed the highest one.
	if err := s.MarkForwarded(ctx, []int64{rest[0].Seq, rest[1].Seq}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Hour)
	if _, err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, entry("k9", "h")); err != nil {
		t.Fatal(err)
	}
	if next, _ := s.NextBatch(ctx, rest[1].Seq, spool.BatchLimit{Rows: 10}); len(next) != 2 || next[1].Key != "k9" {
		t.Errorf("rows after the last forwarded seq = %+v; want k0 and k9 with new seqs", next)
	}
}

func TestDeadRowsAreKeptAndCanBeRequeued(t *testing.T) {
	t.Parallel()
	clk := newClock()
	path := filepath.Join(t.TempDir(), "spool.db")
	s := openSpool(t, spool.Config{Path: path, Clock: clk, PruneInterval: 1000 * time.Hour, KeyTTL: time.Hour})
	ctx := context.Background()
	if _, err := s.Claim(ctx, entry("bad", "h")); err != nil {
		t.Fatal(err)
	}
	rows, _ := s.NextBatch(ctx, 0, spool.BatchLimit{Rows: 10})
	if err := s.MarkDead(ctx, rows[0].Seq, "22P05: unsupported Unicode escape sequence"); err != nil {
		t.Fatal(err)
	}
	if next, _ := s.NextBatch(ctx, 0, spool.BatchLimit{Rows: 10}); len(next) != 0 {
		t.Fatal("a dead row is still pending")
	}
	clk.Advance(48 * time.Hour)
	if n, _ := s.Prune(ctx); n != 0 {
		t.Fatal("a dead row was pruned")
	}
	st, _ := s.Stats(ctx)
	if st.Dead != 1 {
		t.Errorf("stats dead = %d", st.Dead)
	}
	dead, _ := s.List(ctx, spool.DeadRows, 0)
	if len(dead) != 1 || dead[0].DeadReason == "" {
		t.Fatalf("dead rows = %+v", dead)
	}
	n, err := spool.RequeueDead(ctx, path)
	if err != nil || n != 1 {
		t.Fatalf("RequeueDead = %d, %v", n, err)
	}
	if next, _ := s.NextBatch(ctx, 0, spool.BatchLimit{Rows: 10}); len(next) != 1 || next[0].DeadReason != "" || string(next[0].Payload) != `{"k":"bad"}` {
		t.Errorf("after requeue, pending = %+v; want the row with its payload", next)
	}
	if st, _ := s.Stats(ctx); st.Dead != 0 || st.Pending != 1 || st.PendingBytes != int64(len(`{"k":"bad"}`)) {
		t.Errorf("after requeue from another connection, stats = %+v; want 1 pending, 0 dead", st)
	}
}

func TestBatchesAreBoundedByFanoutAndBytes(t *testing.T) {
	t.Parallel()
	s := openSpool(t, spool.Config{})
	ctx := context.Background()
	claim := func(key string, fanout, size int) {
		t.Helper()
		if _, err := s.Claim(ctx, spool.Entry{Producer: "p", Key: key, Hash: []byte("h"), Payload: make([]byte, size), Fanout: fanout}); err != nil {
			t.Fatal(err)
		}
	}
	claim("a", 400, 100)
	claim("b", 400, 100)
	claim("c", 1000, 100) // alone over the fan-out cap: a batch of its own
	claim("d", 1, 3000)
	claim("e", 1, 3000) // d and e together pass the byte cap
	claim("f", 1, 10)
	lim := spool.BatchLimit{Rows: 100, Fanout: 900, Bytes: 4000}
	var got [][]string
	var after int64
	for {
		batch, err := s.NextBatch(ctx, after, lim)
		if err != nil {
			t.Fatal(err)
		}
		if len(batch) == 0 {
			break
		}
		var keys []string
		for _, rec := range batch {
			keys = append(keys, rec.Key)
		}
		got = append(got, keys)
		after = batch[len(batch)-1].Seq
	}
	want := "[[a b] [c] [d] [e f]]"
	if fmt.Sprint(got) != want {
		t.Errorf("batches = %v, want %s", got, want)
	}
}

func TestDeadRowsArePrunedAfterTheirOwnRetention(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s := openSpool(t, spool.Config{Clock: clk, PruneInterval: 1000 * time.Hour, KeyTTL: time.Hour, DeadTTL: 72 * time.Hour})
	ctx := context.Background()
	if _, err := s.Claim(ctx, entry("bad", "h")); err != nil {
		t.Fatal(err)
	}
	rows, _ := s.NextBatch(ctx, 0, spool.BatchLimit{Rows: 10})
	if err := s.MarkDead(ctx, rows[0].Seq, "conflict"); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Stats(ctx); st.Dead != 1 || st.DeadBytes != int64(len(`{"k":"bad"}`)) || st.Pending != 0 {
		t.Errorf("stats = %+v; want one dead row with its payload", st)
	}
	clk.Advance(71 * time.Hour)
	if n, _ := s.Prune(ctx); n != 0 {
		t.Fatalf("a dead row was pruned before its retention")
	}
	clk.Advance(2 * time.Hour)
	if n, err := s.Prune(ctx); err != nil || n != 1 {
		t.Fatalf("prune after the dead TTL = %d, %v; want 1", n, err)
	}
	if st, _ := s.Stats(ctx); st.Dead != 0 || st.DeadBytes != 0 {
		t.Errorf("stats after prune = %+v", st)
	}
}
