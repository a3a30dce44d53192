package main

// The faults production brings, each injected and then healed by the fault
// itself, one at a time, at moments the seed chooses.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// fault is one kind of failure.
type fault struct {
	name string
	// takes is about how long it lasts, for spacing the schedule.
	takes  time.Duration
	inject func(ctx context.Context, w *world, rng *rand.Rand) (string, error)
}

// injected is what became of one fault.
type injected struct {
	name   string
	at     time.Duration // since the run began
	took   time.Duration
	detail string
	err    error
}

// faults lists every kind; relay kills come several times per run.
func faults(duration time.Duration) []fault {
	all := []fault{
		{"postgres stopped 30s", 35 * time.Second, stopPostgres},
		{"postgres frozen (SIGSTOP) 10s", 12 * time.Second, freezePostgres},
		{"failover to the standby", 8 * time.Second, failover},
		{"kill -9 of a central replica", 5 * time.Second, killCentral},
		{"rolling restart (SIGTERM) of each central replica", 15 * time.Second, rollingRestart},
		{"a relay's disk full 10s", 12 * time.Second, diskFull},
		{"expo answers 429", 6 * time.Second, expoStatus(http.StatusTooManyRequests, "1")},
		{"expo answers 500", 6 * time.Second, expoStatus(http.StatusInternalServerError, "")},
		{"expo slower than the client's timeout", 14 * time.Second, expoSlow},
		{"expo receipts late", 10 * time.Second, receiptsLate},
		{"preference service down 10s", 10 * time.Second, prefsDown},
		{"a foreign transaction holds the horizon 15s", 15 * time.Second, holdHorizon},
		{"maintenance pass while a reader holds a transaction", 12 * time.Second, maintainUnderReader},
	}
	kills := max(3, int(duration/time.Minute))
	for range kills {
		all = append(all, fault{"kill -9 of a relay", 3 * time.Second, killRelay})
	}
	return all
}

func killRelay(ctx context.Context, w *world, rng *rand.Rand) (string, error) {
	p := w.relays[rng.IntN(len(w.relays))]
	if err := p.signal(syscall.SIGKILL, 10*time.Second); err != nil {
		return p.name, err
	}
	sleep(ctx, time.Duration(rng.IntN(1000))*time.Millisecond)
	return p.name, p.start(ctx)
}

func killCentral(ctx context.Context, w *world, rng *rand.Rand) (string, error) {
	p := w.centrals[rng.IntN(len(w.centrals))]
	if err := p.signal(syscall.SIGKILL, 10*time.Second); err != nil {
		return p.name, err
	}
	sleep(ctx, time.Second)
	return p.name, p.start(ctx)
}

func rollingRestart(ctx context.Context, w *world, _ *rand.Rand) (string, error) {
	for _, p := range w.centrals {
		if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
			return p.name, err
		}
		if err := p.start(ctx); err != nil {
			return p.name, err
		}
	}
	return "each replica in turn", nil
}

func stopPostgres(ctx context.Context, w *world, _ *rand.Rand) (string, error) {
	c := w.current()
	if err := c.Stop(); err != nil {
		return "", err
	}
	sleep(ctx, 30*time.Second)
	return fmt.Sprintf("port %d", c.Port()), c.Restart(context.WithoutCancel(ctx))
}

func freezePostgres(ctx context.Context, w *world, _ *rand.Rand) (string, error) {
	c := w.current()
	thaw, err := c.Freeze()
	if err != nil {
		return "", err
	}
	sleep(ctx, 10*time.Second)
	thaw()
	return fmt.Sprintf("port %d", c.Port()), nil
}

// failover kills the primary, as a host's crash would, and promotes the
// synchronous standby, as an orchestrator does. It happens once: the run
// has no second standby.
func failover(ctx context.Context, w *world, _ *rand.Rand) (string, error) {
	if err := w.primary.Kill(); err != nil {
		return "", err
	}
	if err := w.standby.Promote(context.WithoutCancel(ctx)); err != nil {
		return "", err
	}
	w.failedOver.Store(true)
	return fmt.Sprintf("primary on port %d killed, standby on port %d promoted", w.primary.Port(), w.standby.Port()), nil
}

// diskFull fills a relay's spool volume, holds it full, then frees it.
func diskFull(ctx context.Context, w *world, rng *rand.Rand) (string, error) {
	i := rng.IntN(len(w.spoolMounts))
	path := filepath.Join(w.spoolMounts[i], "filler")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	chunk := make([]byte, 1<<20)
	written := 0
	for {
		n, err := f.Write(chunk)
		written += n
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				f.Close()
				os.Remove(path)
				return "", err
			}
			break
		}
	}
	f.Close()
	sleep(ctx, 10*time.Second)
	return fmt.Sprintf("%s: %d MiB of filler", w.relays[i].name, written>>20), os.Remove(path)
}

func expoStatus(status int, retryAfter string) func(context.Context, *world, *rand.Rand) (string, error) {
	return func(ctx context.Context, w *world, _ *rand.Rand) (string, error) {
		w.expo.SetFailing(status, retryAfter)
		sleep(ctx, 5*time.Second)
		w.expo.SetFailing(0, "")
		return fmt.Sprintf("every request for 5s answered %d", status), nil
	}
}

func expoSlow(ctx context.Context, w *world, _ *rand.Rand) (string, error) {
	w.expo.SetDelay(12 * time.Second) // the push client gives up after 10s
	sleep(ctx, 10*time.Second)
	w.expo.SetDelay(0)
	return "every request for 10s waited 12s", nil
}

func receiptsLate(ctx context.Context, w *world, _ *rand.Rand) (string, error) {
	w.expo.HoldReceipts(1 << 30)
	sleep(ctx, 10*time.Second)
	w.expo.HoldReceipts(0)
	return "no receipt ready for 10s", nil
}

func prefsDown(ctx context.Context, w *world, _ *rand.Rand) (string, error) {
	w.prefs.down.Store(true)
	sleep(ctx, 10*time.Second)
	w.prefs.down.Store(false)
	return "503 to every request", nil
}

// holdHorizon holds a transaction with an id open on the primary, which
// holds back every commit-safe read's horizon.
func holdHorizon(ctx context.Context, w *world, _ *rand.Rand) (string, error) {
	conn, err := pgx.Connect(ctx, w.dbURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.Begin(ctx)
	if err != nil {
		return "", err
	}
	var xid string
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
		return "", err
	}
	sleep(ctx, 15*time.Second)
	return "transaction " + xid, tx.Commit(context.WithoutCancel(ctx))
}

// maintainUnderReader runs `spoolcast maintain` (a partition ahead, the
// retention drop of the old week made at set-up) while a reader holds a
// transaction that read every partition.
func maintainUnderReader(ctx context.Context, w *world, _ *rand.Rand) (string, error) {
	conn, err := pgx.Connect(ctx, w.dbURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM notifications`).Scan(&n); err != nil {
		return "", err
	}
	start := time.Now()
	out, err := exec.CommandContext(ctx, w.binary, "maintain", "--database-url", w.dbURL, "--partitions-ahead", "6", "--ddl-lock-timeout", "1s").CombinedOutput()
	took := time.Since(start)
	sleep(ctx, 5*time.Second)
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if err != nil {
		// A lock timeout is the pass doing its job: it gave way to the
		// reader. Anything else is a failure.
		if !strings.Contains(string(out), "lock") {
			return first, fmt.Errorf("maintain: %w: %s", err, out)
		}
		return fmt.Sprintf("gave way to the reader after %s: %s", took.Round(time.Millisecond), first), nil
	}
	return fmt.Sprintf("done in %s: %s", took.Round(time.Millisecond), first), nil
}
