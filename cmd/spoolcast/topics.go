package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/topics"
)

// topicFlags configure central's topic fan-out.
type topicFlags struct {
	workers   int
	batchSize int
	pushRate  int
}

func (t *topicFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&t.workers, "topic-fanout-workers", 1, "topic fan-out batches this replica writes at once (each holds up to two of --db-max-conns while it writes, so at most half of them); 0: this replica writes none, and the others share every fan-out")
	fs.IntVar(&t.batchSize, "topic-batch-size", topics.DefaultBatchSize, "most members one fan-out transaction writes; a batch shrinks (to 50) while one takes over 25 ms, since every transaction in flight holds back the live stream's commit order")
	fs.IntVar(&t.pushRate, "topic-push-rate", topics.DefaultPushRate, "topic pushes per second the whole deployment queues for Expo devices, paced across every replica behind direct pushes, which are never held (Expo allows 600/s per project); 0: no pacing")
}

func (t topicFlags) validate() error {
	switch {
	case t.workers < 0:
		return fmt.Errorf("--topic-fanout-workers %d: must not be negative", t.workers)
	case t.batchSize < 1 || t.batchSize > 10_000:
		return fmt.Errorf("--topic-batch-size %d: want 1 to 10000", t.batchSize)
	case t.pushRate < 0:
		return fmt.Errorf("--topic-push-rate %d: must not be negative (0 is no pacing)", t.pushRate)
	}
	return nil
}

func (t topicFlags) config() topics.FanoutConfig {
	rate := t.pushRate
	if rate == 0 {
		rate = -1 // no pacing
	}
	return topics.FanoutConfig{Workers: t.workers, BatchSize: t.batchSize, PushRate: rate}
}

// topicsCommand is `spoolcast topics status`: the topic fan-outs and their
// progress, read from Postgres.
func topicsCommand() (*flag.FlagSet, runFunc) {
	var databaseURL string
	var filter topics.FanoutFilter
	var asJSON bool
	fs := newFlagSet("topics", "spoolcast topics status --database-url URL [--state S] [--topic T] [--producer P] [--key K] [--limit N] [--json]")
	fs.StringVar(&databaseURL, "database-url", "", "Postgres URL (required)")
	fs.StringVar(&filter.State, "state", "", "only fan-outs in this state: pending, running, completed or cancelled")
	fs.StringVar(&filter.Topic, "topic", "", "only fan-outs to this topic")
	fs.StringVar(&filter.Producer, "producer", "", "only events of this producer")
	fs.StringVar(&filter.IdempotencyKey, "key", "", "only the event with this idempotency key")
	fs.IntVar(&filter.Limit, "limit", 20, fmt.Sprintf("newest fan-outs shown, up to %d", topics.MaxFanoutPage))
	fs.BoolVar(&asJSON, "json", false, "print one JSON object per fan-out")
	return fs, func(ctx context.Context, args []string) error {
		if len(args) != 1 || args[0] != "status" {
			return errors.New("usage: spoolcast topics status --database-url URL [flags]")
		}
		if databaseURL == "" {
			return errors.New("--database-url is required")
		}
		if err := topics.CheckFanoutFilter(filter); err != nil {
			return err
		}
		pool, err := pgpool.New(ctx, pgpool.Config{URL: databaseURL, MaxConns: 1})
		if err != nil {
			return fmt.Errorf("--database-url: %w", err)
		}
		defer pool.Close()
		list, more, err := topics.NewStore(pool).Fanouts(ctx, filter)
		if err != nil {
			return err
		}
		if asJSON {
			enc := json.NewEncoder(os.Stdout)
			for _, st := range list {
				if err := enc.Encode(st); err != nil {
					return err
				}
			}
			return nil
		}
		return printFanouts(list, more)
	}
}

func printFanouts(list []topics.FanoutStatus, more bool) error {
	if len(list) == 0 {
		fmt.Println("no topic fan-outs")
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTOPIC\tPRODUCER\tKEY\tSTATE\tWRITTEN\tSKIPPED\tMEMBERS\tRANGES\tDUE\tLAST PROGRESS")
	for _, st := range list {
		last := "-"
		if st.LastProgress != nil {
			last = st.LastProgress.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d/%d\t%s\t%s\n", st.ID, st.Topic, st.Producer, st.IdempotencyKey, st.State,
			st.Written, st.Skipped, st.Members, st.RangesDone, st.Ranges, st.DueAt.UTC().Format(time.RFC3339), last)
	}
	if more {
		fmt.Fprintln(tw, "… more: --limit, or narrow with --state, --topic, --producer, --key")
	}
	return tw.Flush()
}
