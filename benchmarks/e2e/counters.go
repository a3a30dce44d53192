package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The counters read from the processes' /metrics at the two ends of a
// measured window, to tell where the time and CPU go: how often each stage
// runs, not only how long it takes.
var watched = []string{
	"spoolcast_sync_batch_rows_count", // the forwarder's ingest transactions
	"spoolcast_sync_batch_rows_sum",   // the events they carried
	"spoolcast_live_reads_total",      // the live readers' reads
	"spoolcast_ws_frames_sent_total",  // frames written
	"spoolcast_push_sent_total",       // pushes handed to Expo
	"spoolcast_prefs_lookups_total",   // preference lookups
	"spoolcast_live_notify_lag_seconds_count",
}

// scrapeAll sums each watched counter over the processes' /metrics (all
// label sets); a process that does not answer adds nothing.
func scrapeAll(ps []*proc) map[string]float64 { return scrapeNames(ps, watched) }

// scrapeNames is scrapeAll of the counters named.
func scrapeNames(ps []*proc, names []string) map[string]float64 {
	out := map[string]float64{}
	client := http.Client{Timeout: 2 * time.Second}
	for _, p := range ps {
		resp, err := client.Get(p.ops + "/metrics")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "#") {
				continue
			}
			name, rest, _ := strings.Cut(line, " ")
			base, _, _ := strings.Cut(name, "{")
			for _, w := range names {
				if base == w {
					fields := strings.Fields(rest)
					if len(fields) > 0 {
						if v, err := strconv.ParseFloat(fields[0], 64); err == nil {
							out[w] += v
						}
					}
				}
			}
		}
		resp.Body.Close()
	}
	return out
}

// perSecond is each counter's growth over the window, a second.
func perSecond(before, after map[string]float64, window time.Duration) []named64 {
	var out []named64
	for k, v := range after {
		out = append(out, named64{k, (v - before[k]) / window.Seconds()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

type named64 struct {
	name  string
	value float64
}

func (n named64) String() string {
	return fmt.Sprintf("%s %.1f/s", strings.TrimPrefix(n.name, "spoolcast_"), n.value)
}

// execOnce runs sql on a connection of its own.
func execOnce(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// costliest lists the statements that took Postgres the most time over
// the window (pg_stat_statements since its reset): calls a second, time a
// second, and the statement's head.
func costliest(ctx context.Context, url string, window time.Duration) []string {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return []string{"pg-stats: " + err.Error()}
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT calls, total_exec_time, regexp_replace(left(query, 140), '\s+', ' ', 'g')
		FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 12`)
	if err != nil {
		return []string{"pg-stats: " + err.Error()}
	}
	defer rows.Close()
	out := []string{"costliest statements (calls/s, ms of Postgres time a second, statement):"}
	for rows.Next() {
		var calls int64
		var total float64
		var q string
		if err := rows.Scan(&calls, &total, &q); err != nil {
			return append(out, err.Error())
		}
		out = append(out, fmt.Sprintf("  %8.1f/s %7.1f ms/s  %s", float64(calls)/window.Seconds(), total/window.Seconds(), q))
	}
	return out
}

// diskWork is what the run wrote, summed since start: Postgres's WAL
// (bytes, and the flushes that reached the disk) and its data pages
// (checkpoints, the background writer and backends, 8 KiB each), and the
// bytes the relay's process had the disk write (its spool).
type diskWork struct {
	walBytes, walSyncs, pageWrites, relayBytes int64
}

// readDiskWork reads the counters behind diskWork.
func readDiskWork(ctx context.Context, url string, relayPID int) (diskWork, error) {
	var d diskWork
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return d, err
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT w.wal_bytes::bigint, w.wal_sync, b.buffers_checkpoint + b.buffers_clean + b.buffers_backend
		FROM pg_stat_wal w, pg_stat_bgwriter b`).Scan(&d.walBytes, &d.walSyncs, &d.pageWrites)
	d.relayBytes = procWriteBytes(relayPID)
	return d, err
}

func (d diskWork) minus(e diskWork) diskWork {
	return diskWork{d.walBytes - e.walBytes, d.walSyncs - e.walSyncs, d.pageWrites - e.pageWrites, d.relayBytes - e.relayBytes}
}

// procWriteBytes is the bytes a process caused to be written to storage,
// from /proc/<pid>/io.
func procWriteBytes(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
