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

	"github.com/spoolcast/spoolcast/internal/pgcluster"
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
		{failoverName, 20 * time.Second, failover},
		{asyncFailoverName, 12 * time.Second, asyncFailover},
		{"kill -9 of a central replica", 5 * time.Second, killCentral},
		{broadcastName, 60 * time.Second, broadcast},
		{"rolling restart (SIGTERM) of each central replica", 15 * time.Second, rollingRestart},
		{"a relay's disk full 10s", 12 * time.Second, diskFull},
		{"expo answers 429", 6 * time.Second, expoStatus(http.StatusTooManyRequests, "1")},
		{"expo answers 500", 6 * time.Second, expoStatus(http.StatusInternalServerError, "")},
		{"bursts of expo 5xx", 11 * time.Second, expoBursts},
		{"expo slower than the client's timeout", 14 * time.Second, expoSlow},
		{"expo takes sends and loses the answers", 18 * time.Second, expoLosesAnswers},
		{"SIGTERM of a relay mid-traffic", 5 * time.Second, stopRelay},
		{"a relay frozen (SIGSTOP) 5s", 6 * time.Second, freezeRelay},
		{"expo receipts late", 10 * time.Second, receiptsLate},
		{"apns connections killed mid-batch", 6 * time.Second, apnsKill},
		{"fcm answers 503 with Retry-After", 6 * time.Second, fcmUnavailable},
		{"web push service answers 503", 6 * time.Second, webUnavailable},
		{"web push service takes pushes and loses the answers", 17 * time.Second, webLosesAnswers},
		{"web push service answers 429 once per subscription", 6 * time.Second, webRateLimited},
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
	// A send recorded up to its lease (2 min) before the kill may be one
	// the replica had not made yet.
	at := time.Now()
	w.centralKilled.add(at.Add(-2*time.Minute), at.Add(time.Second))
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

// The failovers' names: the synchronous one must come first (its standby
// is the only one in sync; it leaves an asynchronous one behind).
const (
	failoverName      = "failover to the synchronous standby"
	asyncFailoverName = "asynchronous failover that loses commits"
)

// orderFailovers puts the synchronous failover before the asynchronous one.
func orderFailovers(fs []fault) {
	sync, async := -1, -1
	for i, f := range fs {
		switch f.name {
		case failoverName:
			sync = i
		case asyncFailoverName:
			async = i
		}
	}
	if sync >= 0 && async >= 0 && async < sync {
		fs[sync], fs[async] = fs[async], fs[sync]
	}
}

// failover kills the primary, as a host's crash would, and promotes the
// synchronous standby, as an orchestrator does; then it makes a new
// standby of the new primary on the old primary's port (which the
// processes' URL names), streaming asynchronously, for the next failover.
func failover(ctx context.Context, w *world, _ *rand.Rand) (string, error) {
	old, next := w.primary, w.standby
	if err := old.Kill(); err != nil {
		return "", err
	}
	if err := next.Promote(context.WithoutCancel(ctx)); err != nil {
		return "", err
	}
	w.primary, w.standby = next, nil
	detail := fmt.Sprintf("primary on port %d killed, standby on port %d promoted", old.Port(), next.Port())
	standby, err := next.Standby(context.WithoutCancel(ctx), pgcluster.StandbyConfig{
		Dir: filepath.Join(w.dir, "standby-2"), Port: old.Port(), Name: "chaos_standby_2"})
	if err != nil {
		return detail, fmt.Errorf("a new standby on port %d: %w", old.Port(), err)
	}
	w.clusters = append(w.clusters, standby)
	w.standby = standby
	return detail + fmt.Sprintf("; a new asynchronous standby on port %d", old.Port()), nil
}

// asyncFailover loses commits as a failover to an asynchronous standby
// does: the primary's WAL senders freeze while traffic commits for 3 s, the
// primary dies, and the standby, 3 s behind, is promoted. The relays must
// forward again what they had forwarded in the window (--refeed-window).
func asyncFailover(ctx context.Context, w *world, _ *rand.Rand) (string, error) {
	old, next := w.primary, w.standby
	if next == nil {
		return "", errors.New("no standby: the synchronous failover comes first")
	}
	// The window of lost commits starts when the standby had everything:
	// after the broadcast's restart of the primary, it streams again well
	// before it has caught up, and a freeze then loses more than 3 s.
	caughtUp, err := old.CaughtUp(ctx)
	if err != nil {
		return "", err
	}
	thaw, err := old.FreezeWALSenders()
	if err != nil {
		return "", err
	}
	sleep(ctx, 3*time.Second)
	err = old.Kill()
	// A second more for transactions that began before it (created_at is
	// a transaction's start) and committed after.
	w.loss.set(caughtUp.Add(-time.Second), time.Now())
	thaw()
	if err != nil {
		return "", err
	}
	if err := next.Promote(context.WithoutCancel(ctx)); err != nil {
		return "", err
	}
	w.primary, w.standby = next, nil
	return fmt.Sprintf("WAL senders frozen 3s, primary on port %d killed, standby on port %d promoted", old.Port(), next.Port()), nil
}

func stopRelay(ctx context.Context, w *world, rng *rand.Rand) (string, error) {
	p := w.relays[rng.IntN(len(w.relays))]
	if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		return p.name, err
	}
	return p.name, p.start(ctx)
}

func freezeRelay(ctx context.Context, w *world, rng *rand.Rand) (string, error) {
	p := w.relays[rng.IntN(len(w.relays))]
	pid := p.pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return p.name, err
	}
	sleep(ctx, 5*time.Second)
	return p.name, syscall.Kill(pid, syscall.SIGCONT)
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

// expoBursts makes Expo answer a few requests 500, 502 or 503 each second
// for 10 s: Expo's documentation says to retry them.
func expoBursts(ctx context.Context, w *world, rng *rand.Rand) (string, error) {
	failed := 0
	for range 10 {
		n := 1 + rng.IntN(4)
		w.expo.Fail(n, []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable}[rng.IntN(3)], "")
		failed += n
		sleep(ctx, time.Second)
	}
	return fmt.Sprintf("%d requests answered 5xx in bursts", failed), nil
}

// expoLosesAnswers makes Expo take every send for 5 s and answer after
// the client gave up: pushes that may have happened, at most once.
func expoLosesAnswers(ctx context.Context, w *world, _ *rand.Rand) (string, error) {
	w.expo.SetAnswerDelay(expoClientTimeout + 2*time.Second)
	sleep(ctx, 5*time.Second)
	w.expo.SetAnswerDelay(0)
	sleep(ctx, expoClientTimeout+3*time.Second) // the answers held meanwhile
	return "every send for 5s taken, answered after the client gave up", nil
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
