package spool

import (
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// The spool's key index: which seq claimed each (producer, key).
//
// Random keys are what producers send (UUIDv4), and a B-tree index over them
// written at every commit dirties one random leaf per claim: a 4 KiB page in
// the WAL for ~100 bytes of key, written again by the checkpoint. So the
// events table has no unique index. The writer remembers the keys it claimed
// since the last merge in memory (recentKeys), and a merger adds them to a
// separate SQLite file (<spool>.keys) in large batches sorted by key hash,
// where each leaf is written once per batch whatever the batch holds. A
// claim looks in both. The keys file is an index of the spool, not a second
// record: each entry is checked against the events row it names, and a keys
// file that is missing, stale or from another spool is rebuilt at Open.

// keysSchema: keys holds (hash, seq) for every merged events row: a hash
// may name several seqs (a collision, or a pruned row's stale entry), and a
// claim checks each against its events row. meta holds the spool's identity
// and the highest seq merged (indexed_seq): rows above it are in memory.
const keysSchema = `
CREATE TABLE IF NOT EXISTS keys (
    hash INTEGER NOT NULL,
    seq  INTEGER NOT NULL,
    PRIMARY KEY (hash, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);`

// keyHash is the key index's 64-bit hash of a producer's key: stable across
// processes and versions, as the keys file outlives them.
func keyHash(producer, key string) int64 {
	h := sha256.New()
	h.Write([]byte(producer))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return int64(binary.BigEndian.Uint64(h.Sum(sum[:0])))
}

// recentKey is a claim not yet merged into the keys file.
type recentKey struct {
	seq           int64
	producer, key string
}

// recentKeys is the writer's memory of the claims since the last merge, in
// seq order. The writer adds and looks up; the merger takes a copy and,
// once the keys file holds it, tells the writer to forget it.
type recentKeys struct {
	mu    sync.Mutex
	bySeq []recentKey
	byKey map[string]int64 // producer + "\x00" + key → seq
}

func newRecentKeys() *recentKeys { return &recentKeys{byKey: make(map[string]int64)} }

func recentID(producer, key string) string { return producer + "\x00" + key }

func (r *recentKeys) lookup(producer, key string) (int64, bool) {
	r.mu.Lock()
	seq, ok := r.byKey[recentID(producer, key)]
	r.mu.Unlock()
	return seq, ok
}

func (r *recentKeys) add(seq int64, producer, key string) {
	r.mu.Lock()
	r.bySeq = append(r.bySeq, recentKey{seq: seq, producer: producer, key: key})
	r.byKey[recentID(producer, key)] = seq
	r.mu.Unlock()
}

func (r *recentKeys) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.bySeq)
}

// dropFrom forgets the claims with a seq at or above seq: those of a batch
// that was rolled back. They are found by seq, not by a length taken when
// the batch began: a merge may have forgotten older claims meanwhile.
func (r *recentKeys) dropFrom(seq int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, _ := slices.BinarySearchFunc(r.bySeq, seq, func(k recentKey, s int64) int { return cmp.Compare(k.seq, s) })
	for _, k := range r.bySeq[n:] {
		id := recentID(k.producer, k.key)
		if r.byKey[id] == k.seq {
			delete(r.byKey, id)
		}
	}
	r.bySeq = r.bySeq[:n]
}

// upTo copies the claims with a seq at or below seq.
func (r *recentKeys) upTo(seq int64) []recentKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, _ := slices.BinarySearchFunc(r.bySeq, seq+1, func(k recentKey, s int64) int { return cmp.Compare(k.seq, s) })
	return slices.Clone(r.bySeq[:n])
}

// forget drops the claims with a seq at or below seq: the keys file holds
// them. The slice is copied once it is mostly dropped, so that its array
// does not hold every key since start-up.
func (r *recentKeys) forget(seq int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, _ := slices.BinarySearchFunc(r.bySeq, seq+1, func(k recentKey, s int64) int { return cmp.Compare(k.seq, s) })
	for _, k := range r.bySeq[:n] {
		id := recentID(k.producer, k.key)
		if r.byKey[id] == k.seq {
			delete(r.byKey, id)
		}
	}
	r.bySeq = slices.Clone(r.bySeq[n:])
}

// keyIndex is the keys file: a write connection for the merger and the
// pruner, and read connections for claims.
type keyIndex struct {
	path    string
	wdb     *sql.DB
	rdb     *sql.DB
	lookupQ *sql.Stmt
	indexed atomic.Int64 // the highest seq the keys file holds
}

func keysPath(spoolPath string) string { return spoolPath + ".keys" }

// openKeyIndex opens (or creates) the keys file of the spool whose identity
// is spoolID and whose highest seq is maxSeq. A keys file of another spool,
// or one claiming seqs the spool never had (the spool file was replaced by
// an older copy), is emptied: Open rebuilds it from the events table.
// seen is the highest seq the keys file had merged, even if it was emptied.
func openKeyIndex(ctx context.Context, spoolPath, spoolID string, maxSeq int64, cfg Config) (_ *keyIndex, seen int64, _ error) {
	k := &keyIndex{path: keysPath(spoolPath)}
	var err error
	if k.wdb, err = sql.Open("sqlite", dsn(k.path, cfg, modeKeysWriter)); err != nil {
		return nil, 0, fmt.Errorf("open key index %s: %w", k.path, err)
	}
	k.wdb.SetMaxOpenConns(1)
	ok := false
	defer func() {
		if !ok {
			k.close()
		}
	}()
	if _, err := k.wdb.ExecContext(ctx, keysSchema); err != nil {
		return nil, 0, fmt.Errorf("create key index %s: %w", k.path, err)
	}
	var id string
	var indexed int64
	err = k.wdb.QueryRowContext(ctx, `SELECT coalesce((SELECT value FROM meta WHERE name = 'spool_id'), ''),
		coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE name = 'indexed_seq'), 0)`).Scan(&id, &indexed)
	if err != nil {
		return nil, 0, fmt.Errorf("read key index %s: %w", k.path, err)
	}
	seen = indexed
	if id != spoolID || indexed > maxSeq {
		if err := k.reset(ctx, spoolID); err != nil {
			return nil, 0, err
		}
		indexed = 0
	}
	k.indexed.Store(indexed)
	if k.rdb, err = sql.Open("sqlite", dsn(k.path, cfg, modeKeysReader)); err != nil {
		return nil, 0, fmt.Errorf("open key index %s: %w", k.path, err)
	}
	k.rdb.SetMaxOpenConns(4)
	if k.lookupQ, err = k.rdb.PrepareContext(ctx, `SELECT seq FROM keys WHERE hash = ?`); err != nil {
		return nil, 0, fmt.Errorf("prepare key index lookup: %w", err)
	}
	ok = true
	return k, seen, nil
}

func (k *keyIndex) reset(ctx context.Context, spoolID string) error {
	_, err := k.wdb.ExecContext(ctx, `BEGIN IMMEDIATE;
		DELETE FROM keys;
		DELETE FROM meta;
		INSERT INTO meta (name, value) VALUES ('spool_id', ?), ('indexed_seq', '0');
		COMMIT`, spoolID)
	if err != nil {
		_, _ = k.wdb.ExecContext(ctx, "ROLLBACK")
		return fmt.Errorf("rebuild key index %s: %w", k.path, err)
	}
	return nil
}

func (k *keyIndex) close() error {
	var errs []error
	if k.lookupQ != nil {
		errs = append(errs, k.lookupQ.Close())
	}
	if k.rdb != nil {
		errs = append(errs, k.rdb.Close())
	}
	if k.wdb != nil {
		if _, err := k.wdb.Exec("PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, k.wdb.Close())
	}
	return errors.Join(errs...)
}

// candidates returns the seqs the keys file holds for a key's hash.
func (k *keyIndex) candidates(ctx context.Context, hash int64) ([]int64, error) {
	rows, err := k.lookupQ.QueryContext(ctx, hash)
	if err != nil {
		return nil, fmt.Errorf("look up key: %w", err)
	}
	defer rows.Close()
	var seqs []int64
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return nil, fmt.Errorf("look up key: %w", err)
		}
		seqs = append(seqs, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("look up key: %w", err)
	}
	return seqs, nil
}

type keyEntry struct{ hash, seq int64 }

func sortedEntries(keys []recentKey) []keyEntry {
	entries := make([]keyEntry, len(keys))
	for i, rk := range keys {
		entries[i] = keyEntry{keyHash(rk.producer, rk.key), rk.seq}
	}
	slices.SortFunc(entries, func(a, b keyEntry) int {
		return cmp.Or(cmp.Compare(a.hash, b.hash), cmp.Compare(a.seq, b.seq))
	})
	return entries
}

// merge adds keys, all at or below upTo, to the keys file and records upTo
// as merged, in one transaction. Sorted by hash, the inserts walk the B-tree
// once from left to right. It returns the hashes merged.
func (k *keyIndex) merge(ctx context.Context, keys []recentKey, upTo int64) ([]int64, error) {
	entries := sortedEntries(keys)
	err := k.inTx(ctx, func(tx *sql.Tx) error {
		if err := forEntries(ctx, tx, `INSERT OR IGNORE INTO keys (hash, seq) VALUES %s`, entries); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE meta SET value = ? WHERE name = 'indexed_seq'`, upTo)
		return err
	})
	if err != nil {
		return nil, err
	}
	hashes := make([]int64, len(entries))
	for i, e := range entries {
		hashes[i] = e.hash
	}
	return hashes, nil
}

// remove deletes the entries of pruned rows.
func (k *keyIndex) remove(ctx context.Context, keys []recentKey) error {
	return k.inTx(ctx, func(tx *sql.Tx) error {
		return forEntries(ctx, tx, `DELETE FROM keys WHERE (hash, seq) IN (VALUES %s)`, sortedEntries(keys))
	})
}

// forEntries runs query, whose %s is a list of (hash, seq) rows, for the
// entries in statements of up to 500 rows.
func forEntries(ctx context.Context, tx *sql.Tx, query string, entries []keyEntry) error {
	const chunk = 500
	var full *sql.Stmt
	defer func() {
		if full != nil {
			full.Close()
		}
	}()
	args := make([]any, 0, 2*chunk)
	for len(entries) > 0 {
		n := min(chunk, len(entries))
		args = args[:0]
		for _, e := range entries[:n] {
			args = append(args, e.hash, e.seq)
		}
		entries = entries[n:]
		q := fmt.Sprintf(query, strings.TrimSuffix(strings.Repeat("(?, ?), ", n), ", "))
		if n < chunk {
			if _, err := tx.ExecContext(ctx, q, args...); err != nil {
				return err
			}
			continue
		}
		if full == nil {
			var err error
			if full, err = tx.PrepareContext(ctx, q); err != nil {
				return err
			}
		}
		if _, err := full.ExecContext(ctx, args...); err != nil {
			return err
		}
	}
	return nil
}

func (k *keyIndex) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	// Not cancelled halfway: a merge is short, and the driver watches a
	// cancellable context with a goroutine per statement.
	ctx = context.WithoutCancel(ctx)
	tx, err := k.wdb.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("key index: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("key index: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("key index: %w", err)
	}
	return nil
}

// loadFilter adds every hash of the keys file to f.
func (k *keyIndex) loadFilter(ctx context.Context, f *keyFilter) error {
	rows, err := k.rdb.QueryContext(ctx, `SELECT hash FROM keys`)
	if err != nil {
		return fmt.Errorf("read key index: %w", err)
	}
	defer rows.Close()
	hashes := make([]int64, 0, 1<<16)
	for rows.Next() {
		var h int64
		if err := rows.Scan(&h); err != nil {
			return fmt.Errorf("read key index: %w", err)
		}
		if hashes = append(hashes, h); len(hashes) == cap(hashes) {
			f.add(hashes, k.indexed.Load())
			hashes = hashes[:0]
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read key index: %w", err)
	}
	f.add(hashes, k.indexed.Load())
	return nil
}
