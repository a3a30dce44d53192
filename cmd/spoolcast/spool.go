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

	"github.com/spoolcast/spoolcast/spool"
)

// spoolCommand is `spoolcast spool stats|ls|requeue`: stats and ls read a
// spool file read-only; requeue --dead writes it. All are safe beside a
// running relay.
func spoolCommand() (*flag.FlagSet, runFunc) {
	var path string
	var asJSON, pendingOnly, deadOnly bool
	var limit int
	fs := newFlagSet("spool", "spoolcast spool stats|ls|requeue --spool PATH [--json] [--pending|--dead] [--limit N]")
	fs.StringVar(&path, "spool", "./data/spool.db", "path of the spool file to read (opened read-only)")
	fs.BoolVar(&asJSON, "json", false, "print JSON (one object per row for ls)")
	fs.BoolVar(&pendingOnly, "pending", false, "ls: only rows not yet forwarded")
	fs.BoolVar(&deadOnly, "dead", false, "ls: only rows Postgres refused for good, with the reason; requeue: put them back in the queue")
	fs.IntVar(&limit, "limit", 0, "ls: at most this many rows, oldest first (0 lists all)")
	flagUsage := fs.Usage
	fs.Usage = func() {
		flagUsage()
		fmt.Fprint(fs.Output(), "\nSubcommands:\n  stats    pending events and bytes, oldest pending age, kept keys, dead rows, file size\n  ls       rows: key, producer, received_at, forwarded_at, attempts, dead_reason\n  requeue  with --dead: put dead rows back in the forwarding queue (safe beside a running relay)\n")
	}
	return fs, func(ctx context.Context, args []string) error {
		if len(args) != 1 {
			return errors.New("want one subcommand: spool stats, spool ls or spool requeue --dead")
		}
		sub := args[0]
		if sub == "requeue" {
			if !deadOnly {
				return errors.New("requeue what? `spoolcast spool requeue --dead` puts dead rows back in the queue")
			}
			n, err := spool.RequeueDead(ctx, path)
			if err != nil {
				return err
			}
			fmt.Printf("requeued %d dead rows\n", n)
			return nil
		}
		r, err := spool.OpenReadOnly(path)
		if err != nil {
			return err
		}
		defer r.Close()
		switch sub {
		case "stats":
			return printStats(ctx, r, asJSON)
		case "ls":
			filter := spool.AllRows
			switch {
			case pendingOnly && deadOnly:
				return errors.New("--pending and --dead exclude each other")
			case pendingOnly:
				filter = spool.PendingRows
			case deadOnly:
				filter = spool.DeadRows
			}
			return printList(ctx, r, filter, limit, asJSON)
		}
		return fmt.Errorf("unknown subcommand %q: want stats, ls or requeue", sub)
	}
}

func printStats(ctx context.Context, r *spool.Reader, asJSON bool) error {
	st, err := r.Stats(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(struct {
			spool.Stats
			OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
		}{st, st.OldestPendingAge.Seconds()})
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "pending\t%d events, %d bytes (the limit counts these)\n", st.Pending, st.PendingBytes)
	if st.Pending > 0 {
		fmt.Fprintf(tw, "oldest pending age\t%s (received %s)\n", st.OldestPendingAge.Round(time.Millisecond), st.OldestPending.UTC().Format(time.RFC3339))
	} else {
		fmt.Fprintf(tw, "oldest pending age\t0s\n")
	}
	fmt.Fprintf(tw, "kept keys\t%d (forwarded, kept to answer retries)\n", st.KeptKeys)
	fmt.Fprintf(tw, "dead\t%d rows, %d bytes (spoolcast spool ls --dead)\n", st.Dead, st.DeadBytes)
	fmt.Fprintf(tw, "file bytes\t%d\n", st.FileBytes)
	return tw.Flush()
}

type listedRow struct {
	Seq int64  `json:"seq"`
	Key string `json:"key"`
	// Kind is "event", or "cancel" for a cancellation of the producer's
	// event with the key (DELETE /v1/events/{key}).
	Kind        string     `json:"kind"`
	Producer    string     `json:"producer"`
	ReceivedAt  time.Time  `json:"received_at"`
	ForwardedAt *time.Time `json:"forwarded_at"`
	Attempts    int        `json:"attempts"`
	DeadReason  string     `json:"dead_reason,omitempty"`
}

func printList(ctx context.Context, r *spool.Reader, filter spool.Filter, limit int, asJSON bool) error {
	rows, err := r.List(ctx, filter, limit)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		for _, rec := range rows {
			kind, producer := rowKind(rec)
			row := listedRow{Seq: rec.Seq, Key: rec.Key, Kind: kind, Producer: producer, ReceivedAt: rec.ReceivedAt.UTC(), Attempts: rec.Attempts, DeadReason: rec.DeadReason}
			if !rec.Pending() {
				t := rec.ForwardedAt.UTC()
				row.ForwardedAt = &t
			}
			if err := enc.Encode(row); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tKEY\tKIND\tPRODUCER\tRECEIVED_AT\tFORWARDED_AT\tATTEMPTS\tDEAD_REASON")
	for _, rec := range rows {
		fwd := "-"
		if !rec.Pending() {
			fwd = rec.ForwardedAt.UTC().Format(time.RFC3339Nano)
		}
		kind, producer := rowKind(rec)
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", rec.Seq, rec.Key, kind, producer, rec.ReceivedAt.UTC().Format(time.RFC3339Nano), fwd, rec.Attempts, rec.DeadReason)
	}
	return tw.Flush()
}

// rowKind says what a spooled row is, and whose: an event of its producer,
// or a cancellation of that producer's event.
func rowKind(rec spool.Record) (kind, producer string) {
	if p, ok := rec.CancelOf(); ok {
		return "cancel", p
	}
	return "event", rec.Producer
}
