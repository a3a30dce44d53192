package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/lifecycle"
)

// lifecycleFlags are the storage lifetimes central keeps, shared by
// `spoolcast central` and `spoolcast maintain`.
type lifecycleFlags struct {
	keyWindow   time.Duration
	retention   time.Duration
	weeksAhead  int
	lockTimeout time.Duration
}

func (l *lifecycleFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&l.keyWindow, "key-window", 7*24*time.Hour, "how long claimed keys are kept: a re-sent event inside it is recognised (exactly once); must exceed every relay's --key-ttl")
	fs.DurationVar(&l.retention, "notification-retention", 90*24*time.Hour, "how long notifications are kept; weekly partitions wholly older are dropped (0 keeps everything)")
	fs.IntVar(&l.weeksAhead, "partitions-ahead", 4, "weekly partitions created ahead of the current one")
	fs.DurationVar(&l.lockTimeout, "ddl-lock-timeout", lifecycle.DefaultLockTimeout, "longest a maintenance DDL statement (attach, detach, drop of a partition) waits for a lock held by another transaction; past it the pass counts it and the next pass retries")
}

func (l *lifecycleFlags) config() lifecycle.Config {
	return lifecycle.Config{KeyWindow: l.keyWindow, Retention: l.retention, WeeksAhead: l.weeksAhead, LockTimeout: l.lockTimeout}
}

// maintainCommand is `spoolcast maintain`: one maintenance pass, printed.
func maintainCommand() (*flag.FlagSet, runFunc) {
	var databaseURL, nowText string
	var asJSON bool
	var lf lifecycleFlags
	fs := newFlagSet("maintain", "spoolcast maintain --database-url URL [--now RFC3339] [--json]")
	fs.StringVar(&databaseURL, "database-url", "", "Postgres URL (required)")
	fs.StringVar(&nowText, "now", "", "run the pass as if at this RFC 3339 time (tests, backfills); default now")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	lf.register(fs)
	return fs, func(ctx context.Context, args []string) error {
		if len(args) > 0 {
			return fmt.Errorf("unexpected argument %q", args[0])
		}
		if databaseURL == "" {
			return errors.New("--database-url is required")
		}
		cfg := lf.config()
		if nowText != "" {
			at, err := time.Parse(time.RFC3339, nowText)
			if err != nil {
				return fmt.Errorf("--now %q: want an RFC 3339 time such as 2026-12-31T00:00:00Z", nowText)
			}
			cfg.Clock = clock.Frozen(at)
		}
		if err := cfg.Validate(); err != nil {
			return err
		}
		// One connection holds the pass's lock while another works.
		pool, err := pgpool.New(ctx, pgpool.Config{URL: databaseURL, MaxConns: 2})
		if err != nil {
			return fmt.Errorf("--database-url: %w", err)
		}
		defer pool.Close()
		cfg.DB = pool
		rep, err := lifecycle.Run(ctx, cfg)
		if err != nil {
			return err
		}
		if asJSON {
			err = json.NewEncoder(os.Stdout).Encode(rep)
		} else {
			err = printReport(rep)
		}
		if err == nil && len(rep.LockTimeouts) > 0 {
			// The rest of the pass is done; the exit status tells a CronJob
			// (whose metrics nobody scrapes) that some DDL is left to retry.
			err = fmt.Errorf("%d DDL statements gave up waiting for a lock another session holds (%s); run again once it ends",
				len(rep.LockTimeouts), lockTimeoutList(rep.LockTimeouts))
		}
		return err
	}
}

func lockTimeoutList(ts []lifecycle.DDLLockTimeout) string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Op+" "+t.Partition)
	}
	return strings.Join(out, ", ")
}

func printReport(rep lifecycle.Report) error {
	if !rep.Ran {
		fmt.Println("another replica's maintenance pass is running; nothing done")
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "pass as of\t%s (took %s)\n", rep.At.Format(time.RFC3339), rep.Took.Round(time.Millisecond))
	fmt.Fprintf(tw, "partitions created\t%s\n", listOrNone(rep.Created))
	fmt.Fprintf(tw, "partitions dropped\t%s (about %d rows)\n", listOrNone(rep.Dropped), rep.RowsDropped)
	fmt.Fprintf(tw, "analyzed\t%s\n", listOrNone(rep.Analyzed))
	if len(rep.LockTimeouts) > 0 {
		fmt.Fprintf(tw, "lock timeouts\t%s (retried by the next pass)\n", lockTimeoutList(rep.LockTimeouts))
	}
	fmt.Fprintf(tw, "keys expired\t%d\n", rep.KeysExpired)
	var names []string
	for _, p := range rep.Partitions {
		names = append(names, p.Name)
	}
	fmt.Fprintf(tw, "partitions present\t%d: %s\n", len(rep.Partitions), listOrNone(names))
	return tw.Flush()
}

func listOrNone(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	return strings.Join(xs, ", ")
}
