package spool

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/spoolcast/spoolcast/internal/lograte"
	"github.com/spoolcast/spoolcast/internal/startstop"
)

// openKeys opens the key index and brings it up to date with the events
// table: rows it does not hold are merged in chunks, the last partial one
// kept in memory as the writer's recent keys. It sets nextSeq above every seq
// either file has seen, so that a seq is not handed out twice even after
// pruning emptied the table.
func (s *Spool) openKeys(ctx context.Context) error {
	var id string
	var maxSeq int64
	err := s.wconn.QueryRowContext(ctx, `SELECT coalesce((SELECT value FROM meta WHERE name = 'spool_id'), ''),
		coalesce((SELECT max(seq) FROM events), 0)`).Scan(&id, &maxSeq)
	if err != nil {
		return fmt.Errorf("read spool: %w", err)
	}
	keys, seen, err := openKeyIndex(ctx, s.cfg.Path, id, maxSeq, s.cfg)
	if err != nil {
		return err
	}
	s.keys = keys
	s.nextSeq = max(maxSeq, seen) + 1
	s.committed.Store(s.nextSeq - 1)
	chunk := s.cfg.KeyMergeBatch
	for after := keys.indexed.Load(); ; {
		rows, err := s.wconn.QueryContext(ctx, `SELECT seq, producer, key FROM events WHERE seq > ? ORDER BY seq LIMIT ?`, after, chunk)
		if err != nil {
			return fmt.Errorf("read spool keys: %w", err)
		}
		var got []recentKey
		for rows.Next() {
			var k recentKey
			if err := rows.Scan(&k.seq, &k.producer, &k.key); err != nil {
				rows.Close()
				return fmt.Errorf("read spool keys: %w", err)
			}
			got = append(got, k)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read spool keys: %w", err)
		}
		if len(got) < chunk {
			for _, k := range got {
				s.recent.add(k.seq, k.producer, k.key)
			}
			return keys.loadFilter(ctx, s.filter)
		}
		after = got[len(got)-1].seq
		if _, err := keys.merge(ctx, got, after); err != nil {
			return fmt.Errorf("rebuild key index: %w", err)
		}
		keys.indexed.Store(after)
	}
}

// runMerger merges the writer's recent keys into the key index when the
// writer has KeyMergeBatch of them, and every minute whatever it has, so that
// a quiet relay's next start reads few rows back.
func (s *Spool) runMerger(ctx context.Context) {
	failed := lograte.New(time.Minute)
	failures := 0
	startstop.Every(ctx, startstop.Schedule{Interval: time.Minute, Wake: s.mergeWake, Clock: s.cfg.Clock, Delay: true}, func(ctx context.Context) bool {
		err := s.mergeRecent(ctx)
		if err == nil || ctx.Err() != nil {
			failures = 0
			return false
		}
		failures++
		failed.Do(func(suppressed int64) {
			s.log.Error("merge keys into the key index", "err", err, "unmerged", s.recent.len(), "suppressed", suppressed)
		})
		// Again after a pause: the writer stops waking the merger once it
		// refuses new keys.
		return startstop.Sleep(ctx, s.cfg.Clock, startstop.Backoff(failures, 100*time.Millisecond, 10*time.Second))
	})
}

// mergeRecent adds the committed recent keys to the key index, then forgets
// them: a claim that no longer finds a key in memory finds it in the file.
func (s *Spool) mergeRecent(ctx context.Context) error {
	upTo := s.committed.Load()
	if upTo <= s.keys.indexed.Load() {
		return nil
	}
	keys := s.recent.upTo(upTo)
	hashes, err := s.keys.merge(ctx, keys, upTo)
	if err != nil {
		return err
	}
	// In this order: a claim that loads indexed and misses the recent keys
	// finds them in the filter and the file.
	s.filter.add(hashes, upTo)
	s.keys.indexed.Store(upTo)
	s.recent.forget(upTo)
	return nil
}

// wakeMerger is called by the writer after each commit.
func (s *Spool) wakeMerger() {
	if s.recent.len() < s.cfg.KeyMergeBatch {
		return
	}
	select {
	case s.mergeWake <- struct{}{}:
	default:
	}
}

// unmergedLimit is how many recent keys the writer may hold before new keys
// fail with ErrKeysBehind: only a key index file that cannot be written
// keeps the merger that far behind.
func (s *Spool) unmergedLimit() int { return max(8*s.cfg.KeyMergeBatch, 4096) }

// rowQuerier reads an events row by seq: the writer's statement (which sees
// its open transaction) or the reader's (committed rows).
type rowQuerier interface {
	QueryRowContext(ctx context.Context, args ...any) *sql.Row
}

// mergedWinner finds the committed events row that claimed the key among the
// key index's entries, each checked against its row (an entry may be a hash
// collision's, a pruned row's or a rolled-back claim's).
func (s *Spool) mergedWinner(ctx context.Context, rows rowQuerier, producer, key string) (w winner, err error) {
	hash := keyHash(producer, key)
	if !s.filter.mayHave(hash) {
		return winner{}, nil
	}
	seqs, err := s.keys.candidates(ctx, hash)
	if err != nil {
		return winner{}, err
	}
	return checkWinners(ctx, rows, seqs, producer, key)
}

// recentWinner finds the row among the writer's recent keys.
func (s *Spool) recentWinner(ctx context.Context, producer, key string) (w winner, err error) {
	seq, ok := s.recent.lookup(producer, key)
	if !ok {
		return winner{}, nil
	}
	return checkWinners(ctx, s.stmts.bySeq, []int64{seq}, producer, key)
}

// winner is the row that claimed a key, when found.
type winner struct {
	found      bool
	hash       []byte
	receivedAt int64
}

func checkWinners(ctx context.Context, rows rowQuerier, seqs []int64, producer, key string) (winner, error) {
	for _, seq := range seqs {
		var p, k string
		var w winner
		err := rows.QueryRowContext(ctx, seq).Scan(&p, &k, &w.hash, &w.receivedAt)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			continue
		case err != nil:
			return winner{}, fmt.Errorf("read winner: %w", err)
		}
		if p == producer && k == key {
			w.found = true
			return w, nil
		}
	}
	return winner{}, nil
}
