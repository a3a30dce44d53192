package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spoolcast/spoolcast/migrations"
)

// migrateCommand is `spoolcast migrate up|status`.
func migrateCommand() (*flag.FlagSet, runFunc) {
	var databaseURL string
	var log logFlags
	fs := newFlagSet("migrate", "spoolcast migrate up|status --database-url URL")
	fs.StringVar(&databaseURL, "database-url", "", "Postgres URL to migrate (a direct connection, not through PgBouncer's transaction mode) (required)")
	log.register(fs)
	return fs, func(ctx context.Context, args []string) error {
		if len(args) != 1 || (args[0] != "up" && args[0] != "status") {
			return errors.New("want one subcommand: migrate up or migrate status")
		}
		if databaseURL == "" {
			return errors.New("--database-url is required")
		}
		logger, err := log.logger(os.Stderr)
		if err != nil {
			return err
		}
		if args[0] == "up" {
			applied, err := migrations.Up(ctx, databaseURL, logger)
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Println("schema is up to date")
			} else {
				fmt.Printf("applied %d migrations: %v\n", len(applied), applied)
			}
			return nil
		}
		list, err := migrations.List(ctx, databaseURL)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tNAME\tAPPLIED AT")
		for _, m := range list {
			at := "pending"
			if m.Applied {
				at = m.AppliedAt.Time.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\n", m.Version, m.Name, at)
		}
		return tw.Flush()
	}
}
