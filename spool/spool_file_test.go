package spool_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/spool"
)

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
