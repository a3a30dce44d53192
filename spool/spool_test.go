package spool_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/disktest"
	"github.com/spoolcast/spoolcast/spool"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if keptPath != "" {
		os.RemoveAll(filepath.Dir(keptPath)) // the benchmarks' prefilled spool
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left running after the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// newClock is the spool's clock in tests; the pruner's interval is set past
// every Advance a test makes, so only the test's own Prune calls prune.
func newClock() *clock.Fake { return clock.NewFake(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)) }

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
	if err != nil || first.Outcome != event.Accepted {
		t.Fatalf("first claim = %v, %v; want accepted", first.Outcome, err)
	}
	again, err := s.Claim(ctx, entry("k1", "h1"))
	if err != nil || again.Outcome != event.Duplicate {
		t.Fatalf("same request = %v, %v; want duplicate", again.Outcome, err)
	}
	if !again.ReceivedAt.Equal(first.ReceivedAt) {
		t.Errorf("duplicate received_at = %v, want the first claim's %v", again.ReceivedAt, first.ReceivedAt)
	}
	other, err := s.Claim(ctx, entry("k1", "h2"))
	if err != nil || other.Outcome != event.Conflict {
		t.Fatalf("other request = %v, %v; want conflict", other.Outcome, err)
	}
	otherProducer := entry("k1", "h2")
	otherProducer.Producer = "search"
	if res, err := s.Claim(ctx, otherProducer); err != nil || res.Outcome != event.Accepted {
		t.Fatalf("same key, other producer = %v, %v; want accepted (keys are per producer)", res.Outcome, err)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 2 || st.KeptKeys != 0 || st.PendingBytes != int64(2*len(`{"k":"k1"}`)) {
		t.Errorf("stats = %+v; want 2 pending of %d bytes, no kept keys", st, 2*len(`{"k":"k1"}`))
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
			case event.Accepted:
				accepted.Add(1)
			case event.Duplicate:
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
		if res.Outcome != event.Accepted {
			t.Fatalf("claim %d = %v", i, res.Outcome)
		}
		accepted = append(accepted, e.Key)
	}
	if !errors.Is(fullErr, spool.ErrFull) {
		t.Fatalf("after %d claims err = %v; want ErrFull", len(accepted), fullErr)
	}
	if err := s.Ready(ctx, 4<<10); !errors.Is(err, spool.ErrFull) {
		t.Errorf("Ready() = %v on a full spool; want ErrFull", err)
	}
	for _, k := range accepted {
		res, err := s.Claim(ctx, entry(k, "h"))
		if err != nil || res.Outcome != event.Duplicate {
			t.Fatalf("claim of spooled %s while full = %v, %v; want duplicate", k, res.Outcome, err)
		}
	}
	st, _ := s.Stats(ctx)
	if st.Pending != int64(len(accepted)) || st.PendingBytes > 64<<10 || st.PendingBytes != int64(len(accepted))*4<<10 {
		t.Errorf("stats = %+v; want every accepted row (%d) pending, within the limit", st, len(accepted))
	}
	if len(accepted) != 16 {
		t.Errorf("accepted %d events of 4 KiB under a 64 KiB limit, want 16", len(accepted))
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
	if st.Pending != 3 || st.FileBytes == 0 {
		t.Errorf("read-only stats = %+v; want 3 pending", st)
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
	if res, err := reopened.Claim(context.Background(), entry("k", "h")); err != nil || res.Outcome != event.Duplicate {
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
		{"a negative key TTL", spool.Config{Path: "x", KeyTTL: -time.Hour}},
		{"a negative dead TTL", spool.Config{Path: "x", DeadTTL: -time.Hour}},
		{"a negative commit batch", spool.Config{Path: "x", MaxCommitBatch: -1}},
		{"a negative busy timeout", spool.Config{Path: "x", BusyTimeout: -time.Second}},
		{"a negative prune interval", spool.Config{Path: "x", PruneInterval: -time.Second}},
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

func TestTheLimitCountsOnlyWhatAwaitsForwarding(t *testing.T) {
	t.Parallel()
	s := openSpool(t, spool.Config{MaxBytes: 16 << 10})
	ctx := context.Background()
	payload := make([]byte, 1<<10)
	// 64 KiB through a 16 KiB spool: each event is forwarded before the next.
	for i := range 64 {
		e := entry(fmt.Sprintf("k%d", i), "h")
		e.Payload = payload
		if res, err := s.Claim(ctx, e); err != nil || res.Outcome != event.Accepted {
			t.Fatalf("claim %d of a healthy, drained spool = %v, %v; want accepted", i, res.Outcome, err)
		}
		batch, err := s.NextBatch(ctx, 0, spool.BatchLimit{Rows: 10})
		if err != nil || len(batch) != 1 {
			t.Fatalf("next batch = %d rows, %v", len(batch), err)
		}
		if err := s.MarkForwarded(ctx, []int64{batch[0].Seq}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 0 || st.PendingBytes != 0 || st.KeptKeys != 64 {
		t.Errorf("stats = %+v; want 64 kept keys and nothing pending", st)
	}
	if err := s.Ready(ctx, 1<<10); err != nil {
		t.Errorf("Ready() = %v on a drained spool", err)
	}
	kept, err := s.List(ctx, spool.AllRows, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range kept {
		if len(rec.Payload) != 0 || len(rec.Hash) == 0 {
			t.Fatalf("kept row %s holds a %d-byte payload and a %d-byte hash; want only the hash", rec.Key, len(rec.Payload), len(rec.Hash))
		}
	}
	// A retry of a forwarded key is still a duplicate, and a changed request a conflict.
	if res, err := s.Claim(ctx, spool.Entry{Producer: "billing", Key: "k3", Hash: []byte("h"), Payload: payload}); err != nil || res.Outcome != event.Duplicate {
		t.Errorf("retry of a forwarded key = %v, %v; want duplicate", res.Outcome, err)
	}
	if res, err := s.Claim(ctx, spool.Entry{Producer: "billing", Key: "k3", Hash: []byte("other"), Payload: payload}); err != nil || res.Outcome != event.Conflict {
		t.Errorf("changed request under a forwarded key = %v, %v; want conflict", res.Outcome, err)
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

func TestStatsCostTheSameWhateverTheSpoolHolds(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	s := openSpool(t, spool.Config{Path: path})
	if _, err := s.Claim(context.Background(), entry("k", "h")); err != nil {
		t.Fatal(err)
	}
	plan, err := spool.StatsQueryPlan(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	// The oldest pending row is the first entry of the pending index, read
	// in index order with LIMIT 1; anything else must be a search.
	for _, step := range plan {
		if strings.HasPrefix(step, "SCAN") && step != "SCAN events USING INDEX events_pending" {
			t.Errorf("the stats query scans a table: %q (plan %q)", step, plan)
		}
	}
}

func TestASecondOwnerOfTheFileIsRefused(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	first := openSpool(t, spool.Config{Path: path})
	_, err := spool.Open(context.Background(), spool.Config{Path: path})
	if !errors.Is(err, spool.ErrLocked) || !strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
		t.Fatalf("second open = %v; want ErrLocked naming this process", err)
	}
	if err := first.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	second, err := spool.Open(context.Background(), spool.Config{Path: path})
	if err != nil {
		t.Fatalf("open after the first owner closed: %v", err)
	}
	second.Close(context.Background())
}

func TestCloseAndClaimsNeverBlockPastTheirContext(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	s, err := spool.Open(context.Background(), spool.Config{Path: path, MaxCommitBatch: 1, BusyTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// Another process's write transaction holds the file: the writer waits.
	hold := holdWriteLock(t, path)
	results := make(chan error, 3)
	for i := range 3 {
		go func() {
			_, err := s.Claim(context.Background(), entry(fmt.Sprintf("k%d", i), "h"))
			results <- err
		}()
	}
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Claim(short, entry("late", "h")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("claim behind a stuck writer = %v; want its context's deadline", err)
	}
	closeCtx, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if err := s.Close(closeCtx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("close with a stuck writer = %v; want its context's deadline", err)
	}
	hold()
	for range 3 {
		if err := <-results; err != nil && !errors.Is(err, spool.ErrClosed) {
			t.Errorf("claim = %v; want it committed or refused as closed", err)
		}
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("second close, once the writer could finish: %v", err)
	}
}

// holdWriteLock opens a write transaction on the spool file from a connection
// of its own; the returned function rolls it back.
func holdWriteLock(t *testing.T, path string) func() {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			conn.ExecContext(context.Background(), "ROLLBACK")
			conn.Close()
			db.Close()
		})
	}
	t.Cleanup(release)
	return release
}

func TestAFullDiskRefusesNewEventsUntilThereIsRoom(t *testing.T) {
	t.Parallel()
	dir := disktest.Small(t, 2<<20)
	s := openSpool(t, spool.Config{Path: filepath.Join(dir, "spool.db")})
	ctx := context.Background()
	if _, err := s.Claim(ctx, entry("before", "h")); err != nil {
		t.Fatal(err)
	}
	filler := disktest.Fill(t, dir, 0)
	payload := make([]byte, 32<<10)
	var fullErr error
	for i := range 200 {
		e := entry(fmt.Sprintf("k%d", i), "h")
		e.Payload = payload
		if _, err := s.Claim(ctx, e); err != nil {
			fullErr = err
			break
		}
	}
	if !errors.Is(fullErr, spool.ErrDiskFull) {
		t.Fatalf("claims on a full disk ended with %v; want ErrDiskFull", fullErr)
	}
	if err := s.Ready(ctx, 32<<10); !errors.Is(err, spool.ErrDiskFull) || !s.DiskFull() {
		t.Errorf("Ready() = %v, DiskFull() = %v on a full disk; want ErrDiskFull", err, s.DiskFull())
	}
	if res, err := s.Claim(ctx, entry("before", "h")); err != nil || res.Outcome != event.Duplicate {
		t.Errorf("retry of a spooled key on a full disk = %v, %v; want duplicate", res.Outcome, err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(ctx, 32<<10); err != nil || s.DiskFull() {
		t.Errorf("Ready() = %v, DiskFull() = %v once space is freed; want ready", err, s.DiskFull())
	}
	e := entry("after", "h")
	e.Payload = payload
	if res, err := s.Claim(ctx, e); err != nil || res.Outcome != event.Accepted {
		t.Errorf("claim once space is freed = %v, %v; want accepted", res.Outcome, err)
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

func TestAnOlderSpoolFileIsUpgradedInPlace(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, producer TEXT NOT NULL, key TEXT NOT NULL,
			request_hash BLOB NOT NULL, payload BLOB NOT NULL, received_at INTEGER NOT NULL, forwarded_at INTEGER,
			attempts INTEGER NOT NULL DEFAULT 0, dead_reason TEXT, UNIQUE (producer, key))`,
		`INSERT INTO events (producer, key, request_hash, payload, received_at, forwarded_at) VALUES
			('p', 'kept', x'01', '{"recipients":["a"]}', 1, 2),
			('p', 'pending', x'02', '{"recipients":["a","b","c"]}', 3, NULL)`,
		`INSERT INTO events (producer, key, request_hash, payload, received_at, forwarded_at, dead_reason) VALUES
			('p', 'dead', x'03', 'not json', 4, 5, 'refused')`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	s := openSpool(t, spool.Config{Path: path})
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 1 || st.PendingBytes != int64(len(`{"recipients":["a","b","c"]}`)) || st.KeptKeys != 1 || st.Dead != 1 || st.DeadBytes != 8 {
		t.Errorf("stats after upgrade = %+v", st)
	}
	rows, err := s.List(context.Background(), spool.AllRows, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows[0].Payload) != 0 || rows[1].Fanout != 3 || string(rows[2].Payload) != "not json" {
		t.Errorf("rows after upgrade = %+v; want the kept payload dropped, fan-out 3 for the pending row, the dead payload kept", rows)
	}
}

func TestTheWALStaysBoundedUnderSteadyClaims(t *testing.T) {
	if testing.Short() {
		t.Skip("writes some 100 MB through the spool")
	}
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	s := openSpool(t, spool.Config{Path: path, Sync: spool.SyncNormal})
	payload := make([]byte, 1000)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := next.Add(1); i <= 25_000; i = next.Add(1) {
				if _, err := s.Claim(context.Background(), spool.Entry{Producer: "p", Key: fmt.Sprintf("%x", uint64(i)*0x9E3779B97F4A7C15), Hash: []byte("h"), Payload: payload}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Without checkpoints this WAL would hold some 25,000 × 2 pages (~200 MB).
	fi, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 48<<20 {
		t.Errorf("WAL is %d MB after 25,000 claims; want checkpoints to keep it near 16 MB", fi.Size()>>20)
	}
	t.Logf("WAL after 25,000 claims of 1 KB: %d MB", fi.Size()>>20)
}

func TestAClaimWhosePayloadCannotBeStoredChangesNothing(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	s := openSpool(t, spool.Config{Path: path})
	ctx := context.Background()
	first, err := s.Claim(ctx, entry("before", "h"))
	if err != nil || first.Outcome != event.Accepted {
		t.Fatalf("first claim = %v, %v; want accepted", first.Outcome, err)
	}
	db := poisonPayloads(t, path)
	before, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	room := s.Room()
	rows, err := s.List(ctx, spool.AllRows, 0)
	if err != nil || len(rows) != 1 {
		t.Fatalf("list = %d rows, %v; want the first row", len(rows), err)
	}
	firstSeq := rows[0].Seq

	if res, err := s.Claim(ctx, entry("poison", "h")); err == nil || errors.Is(err, spool.ErrFull) || errors.Is(err, spool.ErrDiskFull) {
		t.Fatalf("claim whose payload insert fails = %v, %v; want its own error", res.Outcome, err)
	}
	after, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Pending != before.Pending || after.PendingBytes != before.PendingBytes || s.Room() != room {
		t.Errorf("after the failed claim stats = %+v, room %d; want them unchanged from %+v, room %d", after, s.Room(), before, room)
	}
	if rows, _ := s.List(ctx, spool.AllRows, 0); len(rows) != 1 || rows[0].Key != "before" {
		t.Errorf("after the failed claim the spool holds %+v; want only the first row", rows)
	}

	// Later claims take the next seq, as if the failed one never happened.
	for i, key := range []string{"after1", "after2"} {
		if res, err := s.Claim(ctx, entry(key, "h")); err != nil || res.Outcome != event.Accepted {
			t.Fatalf("claim %s after the failed one = %v, %v; want accepted", key, res.Outcome, err)
		}
		rows, _ := s.List(ctx, spool.AllRows, 0)
		if got := rows[len(rows)-1]; got.Key != key || got.Seq != firstSeq+int64(i)+1 {
			t.Errorf("last row = %s at seq %d; want %s right after the first row", got.Key, got.Seq, key)
		}
	}
	if _, err := db.Exec(`DROP TRIGGER poison`); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Claim(ctx, entry("poison", "h")); err != nil || res.Outcome != event.Accepted {
		t.Fatalf("retry of the failed claim = %v, %v; want accepted (its key was never claimed)", res.Outcome, err)
	}

	batch, err := s.NextBatch(ctx, 0, spool.BatchLimit{Rows: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var seqs []int64
	for _, rec := range batch {
		if want := `{"k":"` + rec.Key + `"}`; string(rec.Payload) != want {
			t.Errorf("row %s carries payload %q, want %q", rec.Key, rec.Payload, want)
		}
		got = append(got, rec.Key)
		seqs = append(seqs, rec.Seq)
	}
	if fmt.Sprint(got) != "[before after1 after2 poison]" {
		t.Fatalf("pending rows = %v; want before, after1, after2, poison", got)
	}
	if err := s.MarkForwarded(ctx, seqs); err != nil {
		t.Fatal(err)
	}
	st, _ := s.Stats(ctx)
	if st.Pending != 0 || st.PendingBytes != 0 || st.KeptKeys != 4 {
		t.Errorf("stats once forwarded = %+v; want 4 kept keys and nothing pending", st)
	}
	if s.Room() != room+int64(len(`{"k":"before"}`)) {
		t.Errorf("room once forwarded = %d, want %d", s.Room(), room+int64(len(`{"k":"before"}`)))
	}
}

// poisonPayloads makes, from another connection, the payload insert of the
// key "poison" fail, the way an I/O or constraint error would, short of a
// full disk. It returns that connection (DROP TRIGGER poison undoes it).
func poisonPayloads(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TRIGGER poison BEFORE INSERT ON payloads WHEN CAST(NEW.payload AS TEXT) = '{"k":"poison"}'
		BEGIN SELECT RAISE(ABORT, 'poisoned payload'); END`); err != nil {
		t.Fatal(err)
	}
	return db
}
