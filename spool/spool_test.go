package spool_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/spoolcast/spoolcast/spool"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type testClock struct{ ns atomic.Int64 }

func newClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *testClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func openSpool(t *testing.T, cfg spool.Config) *spool.Spool {
	t.Helper()
	if cfg.Path == "" {
		cfg.Path = filepath.Join(t.TempDir(), "spool.db")
	}
	cfg.Logger = slog.New(slog.NewTextHandler(tWriter{t}, nil))
	s, err := spool.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return s
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func entry(key, hash string) spool.Entry {
	return spool.Entry{Producer: "billing", Key: key, Hash: []byte(hash), Payload: []byte(`{"k":"` + key + `"}`)}
}

func TestClaimAnswersAcceptedThenDuplicateThenConflict(t *testing.T) {
	t.Parallel()
	s := openSpool(t, spool.Config{})
	ctx := context.Background()

	first, err := s.Claim(ctx, entry("k1", "h1"))
	if err != nil || first.Outcome != spool.Accepted {
		t.Fatalf("first claim = %v, %v; want accepted", first.Outcome, err)
	}
	again, err := s.Claim(ctx, entry("k1", "h1"))
	if err != nil || again.Outcome != spool.Duplicate {
		t.Fatalf("same request = %v, %v; want duplicate", again.Outcome, err)
	}
	if !again.ReceivedAt.Equal(first.ReceivedAt) {
		t.Errorf("duplicate received_at = %v, want the first claim's %v", again.ReceivedAt, first.ReceivedAt)
	}
	other, err := s.Claim(ctx, entry("k1", "h2"))
	if err != nil || other.Outcome != spool.Conflict {
		t.Fatalf("other request = %v, %v; want conflict", other.Outcome, err)
	}
	otherProducer := entry("k1", "h2")
	otherProducer.Producer = "search"
	if res, err := s.Claim(ctx, otherProducer); err != nil || res.Outcome != spool.Accepted {
		t.Fatalf("same key, other producer = %v, %v; want accepted (keys are per producer)", res.Outcome, err)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rows != 2 || st.Pending != 2 {
		t.Errorf("stats = %+v; want 2 rows, 2 pending", st)
	}
}

func TestConcurrentIdenticalClaimsSpoolOneRow(t *testing.T) {
	t.Parallel()
	s := openSpool(t, spool.Config{})
	var accepted, duplicate atomic.Int32
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			res, err := s.Claim(context.Background(), entry("same", "h"))
			if err != nil {
				t.Error(err)
				return
			}
			switch res.Outcome {
			case spool.Accepted:
				accepted.Add(1)
			case spool.Duplicate:
				duplicate.Add(1)
			default:
				t.Errorf("outcome %v", res.Outcome)
			}
		})
	}
	wg.Wait()
	if accepted.Load() != 1 || duplicate.Load() != 99 {
		t.Errorf("accepted=%d duplicate=%d; want 1 and 99", accepted.Load(), duplicate.Load())
	}
	rows, err := s.List(context.Background(), spool.AllRows, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Errorf("spool holds %d rows, want 1", len(rows))
	}
}

func TestConcurrentClaimsShareCommits(t *testing.T) {
	t.Parallel()
	var commits, writes atomic.Int64
	s := openSpool(t, spool.Config{OnCommit: func(n int, _ time.Duration) {
		commits.Add(1)
		writes.Add(int64(n))
	}})
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			for j := range 20 {
				if _, err := s.Claim(context.Background(), entry(fmt.Sprintf("k-%d-%d", i, j), "h")); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if writes.Load() != 64*20 {
		t.Fatalf("writes = %d, want %d", writes.Load(), 64*20)
	}
	if commits.Load() >= writes.Load() {
		t.Errorf("%d commits for %d concurrent claims: group commit did not group", commits.Load(), writes.Load())
	}
}

func TestBatchesForwardInOrderAndPruneAfterTTL(t *testing.T) {
	t.Parallel()
	clock := newClock()
	s := openSpool(t, spool.Config{Now: clock.Now, KeyTTL: time.Hour})
	ctx := context.Background()
	for i := range 5 {
		if _, err := s.Claim(ctx, entry(fmt.Sprintf("k%d", i), "h")); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Second)
	}
	select {
	case <-s.Wake():
	default:
		t.Error("no wake-up after new rows committed")
	}
	batch, err := s.NextBatch(ctx, 0, 3)
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
	rest, err := s.NextBatch(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rest) != 2 || rest[0].Key != "k3" {
		t.Fatalf("after ack, pending = %+v; want k3, k4", rest)
	}
	if after, _ := s.NextBatch(ctx, rest[0].Seq, 10); len(after) != 1 || after[0].Key != "k4" {
		t.Fatalf("pending after k3's seq = %+v; want k4", after)
	}
	st, _ := s.Stats(ctx)
	if st.Pending != 2 || !st.OldestPending.Equal(rest[0].ReceivedAt) || st.OldestPendingAge != 2*time.Second {
		t.Errorf("stats = %+v; want 2 pending, oldest k3 aged 2s", st)
	}

	clock.Advance(59 * time.Minute)
	if n, err := s.Prune(ctx); err != nil || n != 0 {
		t.Fatalf("prune before TTL removed %d (%v); want 0", n, err)
	}
	clock.Advance(2 * time.Minute)
	if n, err := s.Prune(ctx); err != nil || n != 3 {
		t.Fatalf("prune after TTL removed %d (%v); want the 3 forwarded rows", n, err)
	}
	clock.Advance(48 * time.Hour)
	if n, _ := s.Prune(ctx); n != 0 {
		t.Fatalf("prune removed %d pending rows; pending rows are never pruned", n)
	}
	all, _ := s.List(ctx, spool.AllRows, 0)
	if len(all) != 2 {
		t.Errorf("after prune %d rows remain, want the 2 pending", len(all))
	}
	// A pruned key is new again: Postgres's claim makes the re-send harmless.
	if res, err := s.Claim(ctx, entry("k0", "h")); err != nil || res.Outcome != spool.Accepted {
		t.Errorf("claim of pruned key = %v, %v; want accepted", res.Outcome, err)
	}
	// Seqs are never reused, even once pruning removed the highest one.
	if err := s.MarkForwarded(ctx, []int64{rest[0].Seq, rest[1].Seq}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	if _, err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, entry("k9", "h")); err != nil {
		t.Fatal(err)
	}
	if next, _ := s.NextBatch(ctx, rest[1].Seq, 10); len(next) != 2 || next[1].Key != "k9" {
		t.Errorf("rows after the last forwarded seq = %+v; want k0 and k9 with new seqs", next)
	}
}

func TestFullSpoolRefusesNewKeysAndKeepsAnsweringOldOnes(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	s := openSpool(t, spool.Config{Path: path, MaxBytes: 64 << 10})
	ctx := context.Background()
	big := make([]byte, 4<<10)
	var accepted []string
	var fullErr error
	for i := range 100 {
		e := entry(fmt.Sprintf("k%d", i), "h")
		e.Payload = big
		res, err := s.Claim(ctx, e)
		if err != nil {
			fullErr = err
			break
		}
		if res.Outcome != spool.Accepted {
			t.Fatalf("claim %d = %v", i, res.Outcome)
		}
		accepted = append(accepted, e.Key)
	}
	if !errors.Is(fullErr, spool.ErrFull) {
		t.Fatalf("after %d claims err = %v; want ErrFull", len(accepted), fullErr)
	}
	if !s.Full() {
		t.Error("Full() = false on a full spool")
	}
	for _, k := range accepted {
		res, err := s.Claim(ctx, entry(k, "h"))
		if err != nil || res.Outcome != spool.Duplicate {
			t.Fatalf("claim of spooled %s while full = %v, %v; want duplicate", k, res.Outcome, err)
		}
	}
	st, _ := s.Stats(ctx)
	if st.Pending != int64(len(accepted)) {
		t.Errorf("pending = %d, want every accepted row (%d)", st.Pending, len(accepted))
	}
}

func TestReadOnlyReaderSeesALiveSpool(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	s := openSpool(t, spool.Config{Path: path})
	ctx := context.Background()
	for i := range 3 {
		if _, err := s.Claim(ctx, entry(fmt.Sprintf("k%d", i), "h")); err != nil {
			t.Fatal(err)
		}
	}
	r, err := spool.OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	st, err := r.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 3 || st.Rows != 3 || st.FileBytes == 0 {
		t.Errorf("read-only stats = %+v; want 3 pending of 3 rows", st)
	}
	rows, err := r.List(ctx, spool.PendingRows, 0)
	if err != nil || len(rows) != 3 {
		t.Fatalf("read-only list = %d rows, %v", len(rows), err)
	}
	if _, err := spool.OpenReadOnly(filepath.Join(t.TempDir(), "missing.db")); err == nil {
		t.Error("OpenReadOnly of a missing file succeeded")
	}
}

func TestClosedSpoolRefusesClaimsAndClosesTwice(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	s, err := spool.Open(context.Background(), spool.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(context.Background(), entry("k", "h")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := s.Claim(context.Background(), entry("k2", "h")); !errors.Is(err, spool.ErrClosed) {
		t.Fatalf("claim after close: %v; want ErrClosed", err)
	}
	reopened := openSpool(t, spool.Config{Path: path})
	if res, err := reopened.Claim(context.Background(), entry("k", "h")); err != nil || res.Outcome != spool.Duplicate {
		t.Fatalf("claim after reopen = %v, %v; want duplicate", res.Outcome, err)
	}
}

func TestConfigValidateNamesTheProblem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  spool.Config
	}{
		{"a missing path", spool.Config{}},
		{"an unknown sync mode", spool.Config{Path: "x", Sync: "sometimes"}},
		{"a negative limit", spool.Config{Path: "x", MaxBytes: -1}},
	} {
		t.Run("rejects "+tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); err == nil {
				t.Error("Validate() = nil")
			}
		})
	}
}

func TestDeadRowsAreKeptAndCanBeRequeued(t *testing.T) {
	t.Parallel()
	clock := newClock()
	path := filepath.Join(t.TempDir(), "spool.db")
	s := openSpool(t, spool.Config{Path: path, Now: clock.Now, KeyTTL: time.Hour})
	ctx := context.Background()
	if _, err := s.Claim(ctx, entry("bad", "h")); err != nil {
		t.Fatal(err)
	}
	rows, _ := s.NextBatch(ctx, 0, 10)
	if err := s.MarkDead(ctx, rows[0].Seq, "22P05: unsupported Unicode escape sequence"); err != nil {
		t.Fatal(err)
	}
	if next, _ := s.NextBatch(ctx, 0, 10); len(next) != 0 {
		t.Fatal("a dead row is still pending")
	}
	clock.Advance(48 * time.Hour)
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
	if next, _ := s.NextBatch(ctx, 0, 10); len(next) != 1 || next[0].DeadReason != "" {
		t.Errorf("after requeue, pending = %+v", next)
	}
}
