// Command topicbench measures topic membership at scale: how fast a topic
// is filled in requests of 10,000 members, and what a change costs once it
// holds millions (a bulk add, the same add again, a bulk removal, one user
// joining and leaving, a user's list), with the table's size per member.
//
//	go run ./benchmarks/topicbench                   # 10,000,000 members
//	go run ./benchmarks/topicbench -members 1000000
//
// It starts a durable Postgres cluster of its own, migrates it, and calls
// the topics store (what the API's handlers call) on a pool of 4
// connections, one request at a time: the figures are Postgres's and the
// store's, without HTTP.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/migrations"
	"github.com/spoolcast/spoolcast/topics"
)

func main() {
	members := flag.Int("members", 10_000_000, "members of the topic")
	samples := flag.Int("samples", 50, "requests timed of each kind once the topic is full")
	keep := flag.Bool("keep", false, "keep the cluster's directory")
	flag.Parse()
	if *members < topics.MaxChange || *samples < 1 {
		fmt.Fprintf(os.Stderr, "topicbench: want -members ≥ %d and -samples ≥ 1\n", topics.MaxChange)
		os.Exit(2)
	}
	if err := run(*members, *samples, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "topicbench:", err)
		os.Exit(1)
	}
}

func member(i int) string { return fmt.Sprintf("user-%08d", i) }

func batch(from, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = member(from + i)
	}
	return out
}

func run(members, samples int, keep bool) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "spoolcast-topicbench-")
	if err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	if keep {
		fmt.Println("topicbench: cluster kept in", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	cluster, err := pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(dir, "pg"), Durable: true})
	if err != nil {
		return err
	}
	defer cluster.Stop()
	if _, err := migrations.Up(ctx, cluster.URL, nil); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(cluster.URL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	s := topics.NewStore(pool)
	const topic = "everyone"

	// Fill the topic, 10,000 a request, reporting every tenth of the way.
	wal0, cpu0 := walBytes(ctx, pool), cluster.CPU()
	start := time.Now()
	var fill []time.Duration
	for i := 0; i < members; i += topics.MaxChange {
		n := min(topics.MaxChange, members-i)
		t := time.Now()
		if _, err := s.ChangeMembers(ctx, topic, batch(i, n), nil); err != nil {
			return err
		}
		fill = append(fill, time.Since(t))
		if done := i + n; len(fill)%max(1, members/topics.MaxChange/10) == 0 || done == members {
			fmt.Printf("  %d members in %s (the last request %s)\n", done, time.Since(start).Round(time.Second), fill[len(fill)-1].Round(time.Millisecond))
		}
	}
	took := time.Since(start)
	wal, cpu := walBytes(ctx, pool)-wal0, cluster.CPU()-cpu0
	var size int64
	if err := pool.QueryRow(ctx, `SELECT pg_total_relation_size('topic_members')`).Scan(&size); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE topic_members`); err != nil {
		return err
	}
	fmt.Printf("\nfilled %d members in %s: %.0f members/s; each request of %d p50 %s, p99 %s, max %s\n", members, took.Round(time.Second),
		float64(members)/took.Seconds(), topics.MaxChange, q(fill, .5), q(fill, .99), q(fill, 1))
	fmt.Printf("Postgres: %.1f µs of CPU and %.0f bytes of WAL a member; topic_members (with its two indexes) %.0f bytes a member, %d MiB in all\n\n",
		float64(cpu.Microseconds())/float64(members), float64(wal)/float64(members), float64(size)/float64(members), size>>20)

	// At full size: each kind of change, timed.
	next := members
	kinds := []struct {
		name string
		do   func(i int) error
	}{
		{"add 10,000 new members", func(int) error {
			_, err := s.ChangeMembers(ctx, topic, batch(next, topics.MaxChange), nil)
			next += topics.MaxChange
			return err
		}},
		{"the same 10,000 again (nothing changes)", func(i int) error {
			_, err := s.ChangeMembers(ctx, topic, batch(members+i*topics.MaxChange, topics.MaxChange), nil)
			return err
		}},
		{"remove 10,000 members", func(i int) error {
			_, err := s.ChangeMembers(ctx, topic, nil, batch(members+i*topics.MaxChange, topics.MaxChange))
			return err
		}},
		{"one member added and removed", func(i int) error {
			u := []string{fmt.Sprintf("single-%d", i)}
			if _, err := s.ChangeMembers(ctx, topic, u, nil); err != nil {
				return err
			}
			_, err := s.ChangeMembers(ctx, topic, nil, u)
			return err
		}},
		{"a member's topics listed", func(i int) error {
			_, _, err := s.List(ctx, member(i*members/samples), "", 100)
			return err
		}},
	}
	fmt.Printf("| at %d members | p50 | p99 | max |\n|---|---:|---:|---:|\n", members)
	for _, k := range kinds {
		var ds []time.Duration
		for i := range samples {
			t := time.Now()
			if err := k.do(i); err != nil {
				return fmt.Errorf("%s: %w", k.name, err)
			}
			ds = append(ds, time.Since(t))
		}
		fmt.Printf("| %s | %s | %s | %s |\n", k.name, q(ds, .5), q(ds, .99), q(ds, 1))
	}
	return nil
}

func walBytes(ctx context.Context, pool *pgxpool.Pool) int64 {
	var b int64
	_ = pool.QueryRow(ctx, `SELECT wal_bytes::bigint FROM pg_stat_wal`).Scan(&b)
	return b
}

// q is the p quantile of ds, rounded for reading.
func q(ds []time.Duration, p float64) time.Duration {
	s := slices.Sorted(slices.Values(ds))
	d := s[min(len(s)-1, int(p*float64(len(s))))]
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	default:
		return d.Round(10 * time.Microsecond)
	}
}
