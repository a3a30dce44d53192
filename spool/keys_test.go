package spool_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/spool"
)

// openSpoolNoCleanup opens a spool the test closes itself.
func openSpoolNoCleanup(t *testing.T, cfg spool.Config) *spool.Spool {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(tWriter{t}, nil))
	s, err := spool.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// claimOutcome claims e and fails the test on an error.
func claimOutcome(t *testing.T, s *spool.Spool, e spool.Entry) event.Outcome {
	t.Helper()
	res, err := s.Claim(context.Background(), e)
	if err != nil {
		t.Fatalf("claim %s: %v", e.Key, err)
	}
	return res.Outcome
}

// Every key is answered as a duplicate (or a conflict) whether the writer
// still holds it in memory, the key index file holds it, or the spool was
// reopened or lost its key index file meanwhile.
func TestKeysAreAnsweredFromMemoryFromTheKeyIndexAndAfterItIsRebuilt(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	cfg := spool.Config{Path: path, KeyMergeBatch: 10}
	s := openSpoolNoCleanup(t, cfg)
	const n = 95 // nine merges of 10, and 5 left in memory
	for i := range n {
		if got := claimOutcome(t, s, entry(fmt.Sprintf("k%d", i), "h")); got != event.Accepted {
			t.Fatalf("k%d: %v, want accepted", i, got)
		}
	}
	otherWant := event.Accepted // keys are per producer; afterwards a duplicate
	check := func(when string, s *spool.Spool) {
		t.Helper()
		for i := range n {
			key := fmt.Sprintf("k%d", i)
			if got := claimOutcome(t, s, entry(key, "h")); got != event.Duplicate {
				t.Errorf("%s: %s again = %v, want duplicate", when, key, got)
			}
			if got := claimOutcome(t, s, entry(key, "other")); got != event.Conflict {
				t.Errorf("%s: %s with another request = %v, want conflict", when, key, got)
			}
		}
		other := entry("k1", "h")
		other.Producer = "search"
		if got := claimOutcome(t, s, other); got != otherWant {
			t.Errorf("%s: k1 of another producer = %v, want %v", when, got, otherWant)
		}
		otherWant = event.Duplicate
	}
	check("while running", s)
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	s = openSpoolNoCleanup(t, cfg)
	check("after a reopen", s)
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(path + ".keys" + suffix); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	s = openSpool(t, cfg)
	check("after the key index file was deleted", s)
	if st, err := s.Stats(context.Background()); err != nil || st.Pending != n+1 {
		t.Errorf("stats = %+v, %v; want %d pending", st, err, n+1)
	}
}

// A key index file of another spool (a spool file restored beside a newer
// index, or copied) is not taken for this one's.
func TestAKeyIndexOfAnotherSpoolIsRebuilt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := openSpoolNoCleanup(t, spool.Config{Path: filepath.Join(dir, "a.db"), KeyMergeBatch: 1})
	claimOutcome(t, a, entry("only-in-a", "h"))
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	b := openSpoolNoCleanup(t, spool.Config{Path: filepath.Join(dir, "b.db"), KeyMergeBatch: 1})
	claimOutcome(t, b, entry("only-in-b", "h"))
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "a.db.keys"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "b.db.keys"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	b = openSpool(t, spool.Config{Path: filepath.Join(dir, "b.db"), KeyMergeBatch: 1})
	if got := claimOutcome(t, b, entry("only-in-b", "h")); got != event.Duplicate {
		t.Errorf("b's own key = %v, want duplicate", got)
	}
	if got := claimOutcome(t, b, entry("only-in-a", "h")); got != event.Accepted {
		t.Errorf("a's key in b = %v, want accepted", got)
	}
}

// 100 concurrent claims of each of 50 keys, while merges run after every
// commit: exactly one is accepted per key.
func TestConcurrentDuplicatesAcrossMergesSpoolOneRowPerKey(t *testing.T) {
	t.Parallel()
	s := openSpool(t, spool.Config{KeyMergeBatch: 1})
	const keys, callers = 50, 100
	var accepted [keys]atomic.Int32
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := range keys {
				k := (i + c) % keys
				res, err := s.Claim(context.Background(), entry(fmt.Sprintf("k%d", k), "h"))
				if err != nil {
					t.Error(err)
					return
				}
				switch res.Outcome {
				case event.Accepted:
					accepted[k].Add(1)
				case event.Duplicate:
				default:
					t.Errorf("k%d: %v", k, res.Outcome)
				}
			}
		})
	}
	wg.Wait()
	for k := range keys {
		if n := accepted[k].Load(); n != 1 {
			t.Errorf("k%d accepted %d times, want once", k, n)
		}
	}
	rows, err := s.List(context.Background(), spool.AllRows, 0)
	if err != nil || len(rows) != keys {
		t.Errorf("spool holds %d rows (%v), want %d", len(rows), err, keys)
	}
}

// A pruned key is forgotten by the key index too: claimed again, it is new.
func TestAPrunedKeyIsNewAgain(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	path := filepath.Join(t.TempDir(), "spool.db")
	s := openSpool(t, spool.Config{Path: path, KeyMergeBatch: 2, KeyTTL: time.Hour, Clock: clk})
	ctx := context.Background()
	for i := range 5 {
		claimOutcome(t, s, entry(fmt.Sprintf("k%d", i), "h"))
	}
	forwardAll(t, s, "", 0)
	// The merger files the last key (one short of a batch) at its minute,
	// as it always has long before a row's TTL ends. Pruning a row it has
	// not filed yet would race it: its entry could land after the prune.
	clk.Advance(time.Minute)
	testsignal.Eventually(t, "the merger to file every key", 10*time.Second, func() bool {
		st, err := s.Stats(ctx)
		return err == nil && st.UnmergedKeys == 0
	})
	clk.Advance(2 * time.Hour)
	if n, err := s.Prune(ctx); err != nil || n != 5 {
		t.Fatalf("prune = %d, %v; want 5", n, err)
	}
	for i := range 5 {
		if got := claimOutcome(t, s, entry(fmt.Sprintf("k%d", i), "h")); got != event.Accepted {
			t.Errorf("k%d after its TTL = %v, want accepted", i, got)
		}
	}
	keysDB, err := sql.Open("sqlite", "file:"+path+".keys?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer keysDB.Close()
	var entries int
	if err := keysDB.QueryRow(`SELECT count(*) FROM keys`).Scan(&entries); err != nil {
		t.Fatal(err)
	}
	if entries > 5 {
		t.Errorf("the key index holds %d entries for 5 live rows; pruned rows' entries were kept", entries)
	}
}

// A spool file of layout 3 (a unique index on its keys) opens as layout 4:
// rows, totals and every key's answer intact.
func TestALayout3SpoolIsMigrated(t *testing.T) {
	t.Parallel()
	path := olderSpool(t, "testdata/v3/schema.sql",
		`INSERT INTO totals (id, pending_rows, pending_bytes, kept_rows, dead_rows, dead_bytes, kept_bytes) VALUES (1, 0, 0, 0, 0, 0, 0)`,
		`INSERT INTO events (seq, producer, key, request_hash, size, received_at) VALUES (1, 'billing', 'pending', 'h', 17, 1)`,
		`INSERT INTO payloads VALUES (1, '{"k":"pending"}  ')`,
		`INSERT INTO events (seq, producer, key, request_hash, size, received_at, forwarded_at) VALUES (2, 'billing', 'kept', 'h', 0, 1, 2)`,
		`INSERT INTO events (seq, producer, key, request_hash, size, received_at, forwarded_at, dead_reason) VALUES (3, 'billing', 'dead', 'h', 4, 1, 2, 'refused')`,
		`INSERT INTO payloads VALUES (3, 'nope')`,
		`PRAGMA user_version = 3`)
	s := openSpool(t, spool.Config{Path: path})
	st, err := s.Stats(context.Background())
	if err != nil || st.Pending != 1 || st.PendingBytes != 17 || st.KeptKeys != 1 || st.Dead != 1 || st.DeadBytes != 4 {
		t.Fatalf("stats after the migration = %+v, %v", st, err)
	}
	for _, key := range []string{"pending", "kept", "dead"} {
		if got := claimOutcome(t, s, entry(key, "h")); got != event.Duplicate {
			t.Errorf("%s after the migration = %v, want duplicate", key, got)
		}
	}
	if got := claimOutcome(t, s, entry("new", "h")); got != event.Accepted {
		t.Errorf("a new key = %v, want accepted", got)
	}
	rows, err := s.List(context.Background(), spool.AllRows, 0)
	if err != nil || len(rows) != 4 || rows[3].Seq != 4 || string(rows[2].Payload) != "nope" {
		t.Errorf("rows after the migration = %+v, %v", rows, err)
	}
}

// Claims share batches: one whose payload cannot be stored fails with every
// repeat of its key in the same batch, never answered as a duplicate of a
// row that was not stored, and the others are stored.
func TestAFailingClaimFailsItsRepeatsAndNotItsBatch(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	s := openSpool(t, spool.Config{Path: path})
	poisonPayloads(t, path)
	const good, poisoned = 200, 40
	var failed atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range good + poisoned {
		wg.Go(func() {
			<-start
			key := fmt.Sprintf("good-%d", i)
			if i >= good {
				key = "poison"
			}
			res, err := s.Claim(context.Background(), entry(key, "h"))
			switch {
			case key == "poison" && err == nil:
				t.Errorf("a claim of the poisoned key = %v, want an error", res.Outcome)
			case key == "poison":
				failed.Add(1)
			case err != nil || res.Outcome != event.Accepted:
				t.Errorf("%s = %v, %v; want accepted", key, res.Outcome, err)
			}
		})
	}
	close(start)
	wg.Wait()
	rows, err := s.List(context.Background(), spool.AllRows, 0)
	if err != nil || len(rows) != good {
		t.Errorf("spool holds %d rows (%v), want %d", len(rows), err, good)
	}
	if st, err := s.Stats(context.Background()); err != nil || st.Pending != good {
		t.Errorf("stats = %+v, %v; want %d pending", st, err, good)
	}
	t.Logf("%d claims of the poisoned key failed", failed.Load())
}

// A batch that rolls back forgets exactly the claims it added, even when a
// merge of the keys committed before it ran meanwhile and shortened the
// writer's memory: the writer neither cuts that memory at a length taken
// before the merge (a panic when the merge forgot more keys than the batch
// claimed) nor keeps rolled-back claims whose seqs it hands out again.
func TestARolledBackBatchForgetsItsOwnClaimsWhateverAMergeDidMeanwhile(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		committed int // keys committed before the batch, which the merge forgets
	}{
		{"when the merge forgot more keys than the batch claimed", 100},
		{"when the merge forgot fewer keys than the batch claimed", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "spool.db")
			// The fake clock keeps the merger's minute from passing: only the
			// injected write merges.
			cfg := spool.Config{Path: path, Clock: newClock()}
			s := openSpoolNoCleanup(t, cfg)
			ctx := context.Background()
			for i := range tc.committed {
				if got := claimOutcome(t, s, entry(fmt.Sprintf("old-%d", i), "h")); got != event.Accepted {
					t.Fatalf("old-%d = %v, want accepted", i, got)
				}
			}

			// One batch: five new claims, then a write that merges and fails.
			release, err := s.HoldWriter(ctx)
			if err != nil {
				t.Fatal(err)
			}
			const claims = 5
			claimErrs := make(chan error, claims)
			for i := range claims {
				go func() {
					_, err := s.Claim(ctx, entry(fmt.Sprintf("new-%d", i), "h"))
					claimErrs <- err
				}()
			}
			testsignal.Eventually(t, "the claims to queue", 10*time.Second, func() bool { return s.QueuedWrites() == claims })
			failed := make(chan error, 1)
			go func() { failed <- s.MergeThenFail(ctx) }()
			testsignal.Eventually(t, "the failing write to queue", 10*time.Second, func() bool { return s.QueuedWrites() == claims+1 })
			release()
			if err := <-failed; !errors.Is(err, spool.ErrDiskFull) {
				t.Fatalf("the failing write: %v, want ErrDiskFull", err)
			}
			for range claims {
				if err := <-claimErrs; !errors.Is(err, spool.ErrDiskFull) {
					t.Errorf("a claim of the rolled-back batch: %v, want ErrDiskFull", err)
				}
			}

			// Claimed again, each key is new, and the writer remembers only these.
			for i := range claims {
				if got := claimOutcome(t, s, entry(fmt.Sprintf("new-%d", i), "h")); got != event.Accepted {
					t.Errorf("new-%d claimed again = %v, want accepted", i, got)
				}
			}
			st, err := s.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.UnmergedKeys != claims || st.Pending != int64(tc.committed+claims) {
				t.Errorf("stats = %d unmerged keys, %d pending; want %d and %d", st.UnmergedKeys, st.Pending, claims, tc.committed+claims)
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}

			// Reopened, every key is known, and each row has a seq of its own.
			s = openSpool(t, cfg)
			for i := range tc.committed {
				if got := claimOutcome(t, s, entry(fmt.Sprintf("old-%d", i), "h")); got != event.Duplicate {
					t.Errorf("old-%d after reopening = %v, want duplicate", i, got)
				}
			}
			for i := range claims {
				if got := claimOutcome(t, s, entry(fmt.Sprintf("new-%d", i), "h")); got != event.Duplicate {
					t.Errorf("new-%d after reopening = %v, want duplicate", i, got)
				}
			}
			rows, err := s.List(ctx, spool.AllRows, 0)
			if err != nil || len(rows) != tc.committed+claims {
				t.Fatalf("spool holds %d rows (%v), want %d", len(rows), err, tc.committed+claims)
			}
			for i := 1; i < len(rows); i++ {
				if rows[i].Seq <= rows[i-1].Seq {
					t.Errorf("row %d has seq %d after %d", i, rows[i].Seq, rows[i-1].Seq)
				}
			}
		})
	}
}

// A key index that cannot be written holds new keys back only once the
// writer holds its limit of them in memory: then new keys get ErrKeysBehind
// and readiness says so, known keys are still answered, and once the file
// takes writes again, so are new ones.
func TestAKeyIndexThatCannotBeWrittenRefusesNewKeysOnlyPastItsLimit(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	s := openSpool(t, spool.Config{Path: path, KeyMergeBatch: 1})
	ctx := context.Background()
	keys, err := sql.Open("sqlite", "file:"+path+".keys")
	if err != nil {
		t.Fatal(err)
	}
	defer keys.Close()
	if _, err := keys.Exec(`CREATE TRIGGER broken BEFORE INSERT ON keys BEGIN SELECT RAISE(ABORT, 'the key index cannot be written'); END`); err != nil {
		t.Fatal(err)
	}
	const limit = 4096
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < limit; i += 16 {
				if got := claimOutcome(t, s, entry(fmt.Sprintf("k%d", i), "h")); got != event.Accepted {
					t.Errorf("k%d = %v, want accepted", i, got)
				}
			}
		})
	}
	wg.Wait()
	if _, err := s.Claim(ctx, entry("one-too-many", "h")); !errors.Is(err, spool.ErrKeysBehind) {
		t.Fatalf("a new key past the limit: %v, want ErrKeysBehind", err)
	}
	if err := s.Ready(ctx, 100); !errors.Is(err, spool.ErrKeysBehind) {
		t.Errorf("ready = %v, want ErrKeysBehind", err)
	}
	if got := claimOutcome(t, s, entry("k7", "h")); got != event.Duplicate {
		t.Errorf("a known key = %v, want duplicate", got)
	}
	if _, err := keys.Exec(`DROP TRIGGER broken`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := s.Claim(ctx, entry("one-too-many", "h"))
		if err == nil && res.Outcome == event.Accepted {
			break
		}
		if !errors.Is(err, spool.ErrKeysBehind) || time.Now().After(deadline) {
			t.Fatalf("a new key once the index takes writes: %v, %v", res.Outcome, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.Ready(ctx, 100); err != nil {
		t.Errorf("ready once merged = %v", err)
	}
}

// The totals the writer keeps match a count of the table after claims,
// forwarding, refeeding, dead rows, pruning and a requeue from outside.
func TestTheTotalsMatchTheTableAfterEveryKindOfWrite(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	path := filepath.Join(t.TempDir(), "spool.db")
	s := openSpoolNoCleanup(t, spool.Config{Path: path, KeyTTL: time.Hour, DeadTTL: 2 * time.Hour, RefeedWindow: 10 * time.Minute, RefeedMaxBytes: 200, Clock: clk})
	ctx := context.Background()
	for i := range 40 {
		claimOutcome(t, s, entry(fmt.Sprintf("a%d", i), "h"))
	}
	batch, err := s.NextBatch(ctx, 0, spool.BatchLimit{Rows: 30})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, r := range batch[:25] {
		seqs = append(seqs, r.Seq)
	}
	if err := s.MarkForwarded(ctx, seqs); err != nil { // past RefeedMaxBytes: the oldest payloads go
		t.Fatal(err)
	}
	for _, r := range batch[25:] {
		if err := s.MarkDead(ctx, r.Seq, "refused"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Refeed(ctx, clk.Now()); err != nil {
		t.Fatal(err)
	}
	clk.Advance(90 * time.Minute)
	if _, err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		claimOutcome(t, s, entry(fmt.Sprintf("b%d", i), "h"))
	}
	check := func(when string) {
		t.Helper()
		db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var got, want [6]int64
		if err := db.QueryRow(`SELECT pending_rows, pending_bytes, kept_rows, kept_bytes, dead_rows, dead_bytes FROM totals`).Scan(&got[0], &got[1], &got[2], &got[3], &got[4], &got[5]); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(`SELECT
			count(*) FILTER (WHERE forwarded_at IS NULL), coalesce(sum(size) FILTER (WHERE forwarded_at IS NULL), 0),
			count(*) FILTER (WHERE forwarded_at IS NOT NULL AND dead_reason IS NULL), coalesce(sum(size) FILTER (WHERE forwarded_at IS NOT NULL AND dead_reason IS NULL), 0),
			count(*) FILTER (WHERE dead_reason IS NOT NULL), coalesce(sum(size) FILTER (WHERE dead_reason IS NOT NULL), 0)
			FROM events`).Scan(&want[0], &want[1], &want[2], &want[3], &want[4], &want[5]); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s: totals (pending rows, bytes, kept rows, bytes, dead rows, bytes) = %v; the table holds %v", when, got, want)
		}
		if want[4] == 0 && when == "before the requeue" {
			t.Errorf("%s: no dead rows left to requeue", when)
		}
	}
	check("before the requeue")
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := spool.RequeueDead(ctx, path); err != nil || n != 5 {
		t.Fatalf("requeue = %d, %v; want 5", n, err)
	}
	check("after the requeue")
}
