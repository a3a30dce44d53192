package spool_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/spool"
)

// forwardAll claims n events and acknowledges them as forwarded.
func forwardAll(t *testing.T, s *spool.Spool, prefix string, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		if _, err := s.Claim(ctx, entry(prefix+string(rune('a'+i)), "h")); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := s.NextBatch(ctx, 0, spool.BatchLimit{Rows: 1000})
	if err != nil {
		t.Fatal(err)
	}
	seqs := make([]int64, len(batch))
	for i, r := range batch {
		seqs[i] = r.Seq
	}
	if err := s.MarkForwarded(ctx, seqs); err != nil {
		t.Fatal(err)
	}
}

// Forwarded events keep their payloads for the refeed window: Refeed puts
// those forwarded since a time back in the queue, payload and all, and a
// retry of their keys is still a duplicate; past the window the payloads go.
func TestForwardedEventsCanBeRefedWithinTheWindow(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s := openSpool(t, spool.Config{Clock: clk, PruneInterval: 1000 * time.Hour, RefeedWindow: 10 * time.Minute})
	ctx := context.Background()
	start := clk.Now()
	forwardAll(t, s, "early-", 3)
	clk.Advance(5 * time.Minute)
	since := clk.Now()
	forwardAll(t, s, "late-", 2)
	st, _ := s.Stats(ctx)
	if st.Pending != 0 || st.RefeedBytes == 0 {
		t.Fatalf("after forwarding: %+v; want nothing pending and payloads kept", st)
	}
	n, err := s.Refeed(ctx, since)
	if err != nil || n != 2 {
		t.Fatalf("refeed since the late ones = %d, %v; want 2", n, err)
	}
	batch, err := s.NextBatch(ctx, 0, spool.BatchLimit{Rows: 10})
	if err != nil || len(batch) != 2 || string(batch[0].Payload) != `{"k":"late-a"}` {
		t.Fatalf("refed batch = %+v, %v; want the two late ones with their payloads", batch, err)
	}
	if again, _ := s.Claim(ctx, entry("late-a", "h")); again.Outcome != event.Duplicate {
		t.Errorf("a retry of a refed key = %v, want duplicate", again.Outcome)
	}
	if err := s.MarkForwarded(ctx, []int64{batch[0].Seq, batch[1].Seq}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(6 * time.Minute) // the early ones are past the window
	if _, err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Refeed(ctx, start); n != 2 {
		t.Errorf("refeed from the start after the early ones left the window = %d, want the 2 late ones", n)
	}
	clk.Advance(time.Hour)
	if _, err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Stats(ctx); st.Pending != 2 || st.KeptKeys != 3 {
		t.Errorf("stats = %+v; want the 2 refed ones pending, 3 keys kept without payloads", st)
	}
}

// The payloads kept for refeeding stay under their byte bound: the oldest go
// first.
func TestRefeedPayloadsStayUnderTheirBound(t *testing.T) {
	t.Parallel()
	s := openSpool(t, spool.Config{RefeedWindow: time.Hour, RefeedMaxBytes: 100})
	ctx := context.Background()
	forwardAll(t, s, "k", 20) // 20 payloads of 10 bytes
	st, _ := s.Stats(ctx)
	if st.RefeedBytes > 100 || st.RefeedBytes == 0 {
		t.Fatalf("refeed bytes = %d; want at most the bound of 100", st.RefeedBytes)
	}
	n, err := s.Refeed(ctx, time.Time{})
	if err != nil || n == 0 || n >= 20 {
		t.Fatalf("refeed = %d, %v; want the newest few", n, err)
	}
	batch, _ := s.NextBatch(ctx, 0, spool.BatchLimit{Rows: 100})
	if last := batch[len(batch)-1]; string(last.Payload) != `{"k":"k`+string(rune('a'+19))+`"}` {
		t.Errorf("the newest kept payload is %s; want the last forwarded", last.Payload)
	}
}

// The refeed bytes count exactly the payloads still held, through every way
// a kept payload leaves: trimmed past the byte bound, dropped past the
// window, and pruned with its key (held still, when the key TTL is the
// shorter), so the bound keeps holding what it says.
func TestRefeedBytesCountOnlyThePayloadsStillHeld(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		window, ttl time.Duration
	}{
		{"payloads dropped past the window, then keys pruned", 10 * time.Minute, time.Hour},
		{"keys pruned while their payloads are held", time.Hour, 10 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			s := openSpool(t, spool.Config{Clock: clk, PruneInterval: 1000 * time.Hour, RefeedWindow: c.window, KeyTTL: c.ttl, RefeedMaxBytes: 100})
			ctx := context.Background()
			forwardAll(t, s, "k", 20) // 20 payloads of 10 bytes, the newest 10 within the bound
			if st, _ := s.Stats(ctx); st.RefeedBytes != 100 || st.KeptKeys != 20 {
				t.Fatalf("after forwarding: refeed bytes %d, kept keys %d; want the newest 10 payloads (100 bytes) of 20 keys", st.RefeedBytes, st.KeptKeys)
			}
			clk.Advance(min(c.window, c.ttl) + time.Minute)
			if _, err := s.Prune(ctx); err != nil {
				t.Fatal(err)
			}
			st, _ := s.Stats(ctx)
			if c.ttl < c.window && (st.RefeedBytes != 0 || st.KeptKeys != 0) {
				t.Fatalf("keys pruned with their payloads: refeed bytes %d, kept keys %d; want 0 and 0", st.RefeedBytes, st.KeptKeys)
			}
			if c.ttl > c.window && (st.RefeedBytes != 0 || st.KeptKeys != 20) {
				t.Fatalf("payloads past the window: refeed bytes %d, kept keys %d; want 0 and the 20 keys", st.RefeedBytes, st.KeptKeys)
			}
			clk.Advance(max(c.window, c.ttl))
			if _, err := s.Prune(ctx); err != nil {
				t.Fatal(err)
			}
			if st, _ := s.Stats(ctx); st.RefeedBytes != 0 || st.KeptKeys != 0 {
				t.Errorf("after both retentions: refeed bytes %d, kept keys %d; want 0 and 0", st.RefeedBytes, st.KeptKeys)
			}
			// The bound holds for what comes next as it did at first.
			forwardAll(t, s, "m", 20)
			if st, _ := s.Stats(ctx); st.RefeedBytes != 100 {
				t.Errorf("forwarding again: refeed bytes %d; want 100", st.RefeedBytes)
			}
		})
	}
}

// An upgrade counts the refeed bytes again from the rows: only kept rows
// that still hold their payload count, whatever their size says.
func TestAnUpgradeCountsOnlyThePayloadsStillHeld(t *testing.T) {
	t.Parallel()
	path := olderSpool(t, "testdata/v3/schema.sql",
		`INSERT INTO totals (id, pending_rows, pending_bytes, kept_rows, dead_rows, dead_bytes, kept_bytes) VALUES (1, 0, 0, 0, 0, 0, 0)`,
		`INSERT INTO events (seq, producer, key, request_hash, size, received_at, forwarded_at) VALUES (1, 'billing', 'held', 'h', 7, 1, 2)`,
		`INSERT INTO payloads VALUES (1, '{"a":1}')`,
		`INSERT INTO events (seq, producer, key, request_hash, size, received_at, forwarded_at) VALUES (2, 'billing', 'dropped', 'h', 9, 1, 2)`,
		`PRAGMA user_version = 3`)
	s := openSpool(t, spool.Config{Path: path, RefeedWindow: time.Hour})
	if st, err := s.Stats(context.Background()); err != nil || st.RefeedBytes != 7 || st.KeptKeys != 2 {
		t.Errorf("stats after the upgrade = %+v, %v; want 7 refeed bytes (the payload held) of 2 kept keys", st, err)
	}
}

// The history of the Postgres a spool forwards to survives a restart.
func TestTheRecordedPostgresHistorySurvivesAReopen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "spool.db")
	ctx := context.Background()
	s, err := spool.Open(ctx, spool.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if h, err := s.History(ctx); err != nil || h != "" {
		t.Fatalf("history of a new spool = %q, %v", h, err)
	}
	if err := s.SetHistory(ctx, "7714262984282894364/2"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	s = openSpool(t, spool.Config{Path: path})
	if h, err := s.History(ctx); err != nil || h != "7714262984282894364/2" {
		t.Errorf("history after a reopen = %q, %v", h, err)
	}
}

// A spool file of layout 2 (before the refeed window) opens as layout 3 with
// its rows and totals intact.
func TestALayout2SpoolIsMigrated(t *testing.T) {
	t.Parallel()
	path := olderSpool(t, "testdata/v2/schema.sql",
		`INSERT INTO totals (id, pending_rows, pending_bytes, kept_rows, dead_rows, dead_bytes) VALUES (1, 0, 0, 0, 0, 0)`,
		`INSERT INTO events (seq, producer, key, request_hash, size, received_at) VALUES (1, 'billing', 'pending', x'00', 13, 1)`,
		`INSERT INTO payloads VALUES (1, '{"k":"pending"}')`,
		`INSERT INTO events (seq, producer, key, request_hash, size, received_at, forwarded_at) VALUES (2, 'billing', 'kept', x'00', 0, 1, 2)`,
		`PRAGMA user_version = 2`)
	s := openSpool(t, spool.Config{Path: path, RefeedWindow: time.Hour})
	ctx := context.Background()
	st, err := s.Stats(ctx)
	if err != nil || st.Pending != 1 || st.PendingBytes != 13 || st.KeptKeys != 1 || st.RefeedBytes != 0 {
		t.Fatalf("stats after the migration = %+v, %v", st, err)
	}
	forwardAll(t, s, "new-", 1)
	if st, _ := s.Stats(ctx); st.RefeedBytes == 0 || st.Pending != 0 {
		t.Errorf("after forwarding on the migrated file: %+v", st)
	}
}

// olderSpool writes a spool file of an earlier layout: schemaFile, then the
// statements (rows and its user_version), and returns its path.
func olderSpool(t *testing.T, schemaFile string, statements ...string) string {
	t.Helper()
	schema, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "spool.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range append([]string{string(schema)}, statements...) {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return path
}
