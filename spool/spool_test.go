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
