package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spoolcast/spoolcast/internal/pgcluster"
	"github.com/spoolcast/spoolcast/migrations"
)

// devCommand is `spoolcast dev`: the whole pipeline in one process for local
// work. It starts a local Postgres (kept under --data-dir/pg) unless
// --database-url is given, migrates it, and runs the relay with its forwarder.
func devCommand() (*flag.FlagSet, runFunc) {
	var o relayOptions
	var dataDir string
	fs := newFlagSet("dev", "spoolcast dev [flags]")
	o.register(fs)
	fs.StringVar(&dataDir, "data-dir", "./data", "where the local Postgres cluster (pg/) and the spool live")
	if f := fs.Lookup("producer"); f != nil {
		f.DefValue = "demo"
		_ = f.Value.Set("demo")
		f.Usage = "logical producing service that scopes idempotency keys"
	}
	if f := fs.Lookup("spool"); f != nil {
		f.DefValue = ""
		_ = f.Value.Set("")
		f.Usage = "path of the SQLite spool file (default --data-dir/spool.db)"
	}
	if f := fs.Lookup("database-url"); f != nil {
		f.Usage = "Postgres URL to use instead of starting a local cluster under --data-dir/pg"
	}
	return fs, func(ctx context.Context, _ []string) error {
		logger, err := o.log.logger(os.Stderr)
		if err != nil {
			return err
		}
		if o.spoolPath == "" {
			o.spoolPath = filepath.Join(dataDir, "spool.db")
		}
		var cluster *pgcluster.Cluster
		if o.databaseURL == "" {
			logger.Info("starting local Postgres", "dir", filepath.Join(dataDir, "pg"))
			cluster, err = pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(dataDir, "pg"), Durable: true})
			if err != nil {
				return fmt.Errorf("start local Postgres: %w", err)
			}
			defer func() {
				logger.Info("stopping local Postgres")
				if err := cluster.Stop(); err != nil {
					logger.Error("stop local Postgres", "err", err)
				}
			}()
			o.databaseURL = cluster.URL
		}
		if _, err := migrations.Up(ctx, o.databaseURL, logger); err != nil {
			return err
		}
		r, err := startRelay(ctx, o, logger)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, `
spoolcast dev is running — Ctrl-C stops all of it.
  relay     http://%[1]s   (producer %[2]q, spool %[3]s)
  postgres  %[4]s
  metrics   http://%[1]s/metrics

Post an event:
  %[5]s

Then look:
  psql '%[4]s' -c 'SELECT id, user_id, title, created_at FROM notifications ORDER BY id DESC LIMIT 5'

`, r.addr, o.producer, o.spoolPath, o.databaseURL, sampleCurl(r.addr))
		return r.wait(ctx, max(o.shutdownTimeout, 5*time.Second))
	}
}
