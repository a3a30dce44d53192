package pgcluster

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyConfig describes a streaming standby of a running cluster.
type StandbyConfig struct {
	// Dir holds the standby's data (Dir/data), socket and log. Required.
	Dir string
	// Port to listen on, on 127.0.0.1. Default: a free port, remembered in Dir.
	Port int
	// Name is the standby's application_name on its primary: what the
	// primary's SynchronousStandby names. Default "standby".
	Name string
}

// Standby makes a streaming standby of the running cluster c: a copy taken
// with pg_basebackup -R (which writes primary_conninfo and standby.signal),
// started on its own port with c's durability and settings, but not c's
// SynchronousStandby. It returns once c streams WAL to it, and, when c
// names it as its synchronous standby, once c counts it as one. The standby
// answers reads; writes get SQLSTATE 25006 until Promote.
func (c *Cluster) Standby(ctx context.Context, cfg StandbyConfig) (*Cluster, error) {
	cfg.Name = cmp.Or(cfg.Name, "standby")
	if !isName(cfg.Name) {
		return nil, fmt.Errorf("standby name %q: want letters, digits and underscores", cfg.Name)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	s := &Cluster{cfg: Config{
		Dir:     dir,
		Port:    cfg.Port,
		Durable: c.cfg.Durable,
		// cluster_name is the walreceiver's application_name when
		// primary_conninfo names none.
		Settings: append(slices.Clip(c.cfg.Settings), "cluster_name="+cfg.Name),
	}, bin: c.bin, cred: c.cred}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := s.chown(dir); err != nil {
		return nil, err
	}
	if err := s.checkReachable(dir); err != nil {
		return nil, err
	}
	if s.cfg.Port == 0 {
		if s.cfg.Port, err = rememberedPort(dir); err != nil {
			return nil, err
		}
		if err := s.chown(dir); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "PG_VERSION")); err == nil {
		return nil, fmt.Errorf("standby: %s already holds a cluster", dir)
	}
	if err := c.canStream(ctx); err != nil {
		return nil, err
	}
	args := []string{
		"-D", filepath.Join(dir, "data"),
		"-d", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", c.cfg.Port, cfg.Name),
		"-R",           // standby.signal and primary_conninfo
		"-X", "stream", // the WAL written during the copy comes with it
		"-c", "fast", // checkpoint at once rather than spread over minutes
	}
	if !c.cfg.Durable {
		args = append(args, "--no-sync")
	}
	if out, err := s.run(ctx, "pg_basebackup", args...); err != nil {
		return nil, fmt.Errorf("pg_basebackup: %w\n%s", err, out)
	}
	standby, err := Start(ctx, s.cfg)
	if err != nil {
		return nil, fmt.Errorf("start standby: %w", err)
	}
	if err := c.waitStreaming(ctx, cfg.Name); err != nil {
		_ = standby.Stop()
		return nil, err
	}
	return standby, nil
}

// canStream checks the settings a primary needs to stream WAL to a standby
// (Postgres's defaults have them; Settings can take them away).
func (c *Cluster) canStream(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return fmt.Errorf("standby: %w", err)
	}
	defer conn.Close(ctx)
	var level string
	var senders int
	if err := conn.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('max_wal_senders')::int`).Scan(&level, &senders); err != nil {
		return fmt.Errorf("standby: %w", err)
	}
	if level == "minimal" || senders < 1 {
		return fmt.Errorf("standby: the primary has wal_level=%s and max_wal_senders=%d; a standby needs wal_level=replica and max_wal_senders of at least 1", level, senders)
	}
	return nil
}

// waitStreaming waits until c streams WAL to the standby called name, and
// counts it synchronous when its SynchronousStandby names it.
func (c *Cluster) waitStreaming(ctx context.Context, name string) error {
	query := `SELECT EXISTS (SELECT 1 FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`
	if c.cfg.SynchronousStandby == name {
		query += ` AND sync_state = 'sync'`
	}
	if err := c.waitTrue(ctx, query+`)`, name); err != nil {
		return fmt.Errorf("standby %s does not stream from %s: %w\n%s", name, c.URL, err, tail(filepath.Join(c.cfg.Dir, "postgres.log")))
	}
	return nil
}

// Promote ends a standby's recovery (pg_ctl promote) and returns once it
// accepts writes: out of recovery, and not read-only.
func (c *Cluster) Promote(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.cfg.Dir, "data"), "-w", "-t", "60", "promote"); err != nil {
		return fmt.Errorf("pg_ctl promote: %w\n%s\n%s", err, out, tail(filepath.Join(c.cfg.Dir, "postgres.log")))
	}
	if err := c.waitTrue(ctx, `SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'`); err != nil {
		return fmt.Errorf("promoted %s does not accept writes: %w", c.URL, err)
	}
	return nil
}

// waitTrue runs query, which answers one boolean, on a new connection every
// 20 ms until it answers true, for at most 30 s; each try gets 5 s.
func (c *Cluster) waitTrue(ctx context.Context, query string, args ...any) error {
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var ok bool
		conn, err := pgx.Connect(tctx, c.URL)
		if err == nil {
			err = conn.QueryRow(tctx, query, args...).Scan(&ok)
			conn.Close(context.WithoutCancel(ctx))
		}
		cancel()
		if err == nil && ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up after 30s (last error: %v)", last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// allowReplication makes sure pg_hba.conf lets replication connections in
// from 127.0.0.1 (initdb's file does, with the method given to -A).
func allowReplication(hba string) error {
	f, err := os.Open(hba)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 4 && fields[0] == "host" && fields[1] == "replication" && fields[3] == "127.0.0.1/32" {
			f.Close()
			return nil
		}
	}
	f.Close()
	if err := sc.Err(); err != nil {
		return err
	}
	a, err := os.OpenFile(hba, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = a.WriteString("host    replication     all             127.0.0.1/32            trust\n")
	return errors.Join(err, a.Close())
}

// isName reports whether s can stand unquoted as a setting's value on the
// server's command line: letters, digits and underscores.
func isName(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	})
}

// CaughtUp waits until a standby streaming from c has flushed all the WAL
// c had written when the call began, and returns that moment: every commit
// made on c before it is on the standby. A standby that reconnected after
// c restarted streams again before it has caught up, so streaming alone
// says nothing of what a failover would lose.
func (c *Cluster) CaughtUp(ctx context.Context) (time.Time, error) {
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return time.Time{}, fmt.Errorf("caught up: %w", err)
	}
	began := time.Now()
	var lsn string
	err = conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return time.Time{}, fmt.Errorf("caught up: %w", err)
	}
	if err := c.waitTrue(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_replication WHERE state = 'streaming' AND flush_lsn >= $1::pg_lsn)`, lsn); err != nil {
		return time.Time{}, fmt.Errorf("no standby caught up with %s (WAL %s): %w", c.URL, lsn, err)
	}
	return began, nil
}
