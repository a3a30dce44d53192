package migrations_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestReplicasMigratingTogetherApplyEachMigrationOnce(t *testing.T) {
	url := pgtest.EmptyDB(t)
	ctx := context.Background()
	before, err := migrations.List(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) < 3 {
		t.Fatalf("%d migrations embedded, want at least 3", len(before))
	}
	for _, m := range before {
		if m.Applied {
			t.Fatalf("migration %d applied on an empty database", m.Version)
		}
	}
	var wg sync.WaitGroup
	applied := make([][]int64, 4)
	for i := range applied {
		wg.Go(func() {
			var err error
			if applied[i], err = migrations.Up(ctx, url, nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	total := 0
	for _, a := range applied {
		total += len(a)
	}
	if total != len(before) {
		t.Errorf("four replicas applied %d migrations in all, want each of the %d once", total, len(before))
	}
	after, err := migrations.List(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range after {
		if !m.Applied || !m.AppliedAt.Valid {
			t.Errorf("migration %d (%s) not applied", m.Version, m.Name)
		}
	}
	if again, err := migrations.Up(ctx, url, nil); err != nil || len(again) != 0 {
		t.Errorf("a second up applied %v, %v; want nothing", again, err)
	}
}

// Migration 7 builds the resume index partition by partition; every
// partition present, with rows, ends with a valid index attached to the
// parent's, and partitions made later get it too.
func TestTheCommitOrderIndexCoversEveryPartitionAndIsValid(t *testing.T) {
	url := pgtest.DB(t)
	pool := pgtest.Connect(t, url)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `SELECT spoolcast_ensure_week_partition('notifications', now() + interval '70 days')`); err != nil {
		t.Fatal(err)
	}
	var valid bool
	var parts, indexed int
	err := pool.QueryRow(ctx, `SELECT i.indisvalid,
			(SELECT count(*) FROM pg_inherits WHERE inhparent = 'notifications'::regclass),
			(SELECT count(*) FROM pg_inherits WHERE inhparent = 'notifications_user_commit_order'::regclass)
		FROM pg_index i WHERE i.indexrelid = 'notifications_user_commit_order'::regclass`).Scan(&valid, &parts, &indexed)
	if err != nil {
		t.Fatal(err)
	}
	if !valid || parts == 0 || indexed != parts {
		t.Errorf("index valid %v, on %d of %d partitions; want valid on all", valid, indexed, parts)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'read_marks' AND column_name = 'snapshot'`); n != 1 {
		t.Errorf("read_marks.snapshot columns: %d, want 1", n)
	}
}

// Migration 15's build behind a transaction held open fails at its
// lock_timeout with an error that says what to do, instead of waiting for
// the transaction; run again once it ended, it drops the invalid index the
// cut build left and builds it.
func TestTheWebhookDueIndexBuildBehindAnOpenTransactionFailsThenCompletes(t *testing.T) {
	url := pgtest.DB(t)
	pool := pgtest.Connect(t, url)
	ctx := context.Background()
	if err := migrations.DownTo(ctx, url, 14); err != nil {
		t.Fatal(err)
	}
	// A writer to the outbox, as an ingest transaction held open is.
	end := pgtest.HoldOpen(t, url, `UPDATE webhook_deliveries SET attempts = attempts WHERE false`)
	_, err := migrations.Up(ctx, url, nil)
	if err == nil || !strings.Contains(err.Error(), "lock timeout") || !strings.Contains(err.Error(), "run migrate up again") {
		t.Fatalf("up behind an open transaction: %v; want a lock timeout saying to run it again", err)
	}
	end()
	applied, err := migrations.Up(ctx, url, nil)
	if err != nil || len(applied) == 0 || applied[0] != 15 {
		t.Fatalf("up again applied %v, %v; want migration 15 first", applied, err)
	}
	var valid bool
	if err := pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'webhook_deliveries_due_per_endpoint'::regclass`).Scan(&valid); err != nil || !valid {
		t.Errorf("index valid %v, %v; want valid", valid, err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM pg_class WHERE relname LIKE 'webhook_deliveries_due%'`); n != 1 {
		t.Errorf("%d indexes named webhook_deliveries_due…, want the per-endpoint one alone", n)
	}
}

// Migration 15 indexes the webhook outbox's due deliveries per endpoint in
// place of the single due index (beside the new one, the planner takes it
// for an endpoint's probe and reads the whole backlog); taken back it
// restores the single index, and applied again replaces it.
func TestMigration15DownAndUpAgain(t *testing.T) {
	url := pgtest.DB(t)
	pool := pgtest.Connect(t, url)
	ctx := context.Background()
	indexes := func() (single, perEndpoint int) {
		t.Helper()
		count := func(name string) int {
			return pgtest.Count(t, pool, `SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = $1 AND i.indisvalid`, name)
		}
		return count("webhook_deliveries_due"), count("webhook_deliveries_due_per_endpoint")
	}
	if single, per := indexes(); single != 0 || per != 1 {
		t.Fatalf("after up: %d single, %d per-endpoint indexes; want the per-endpoint one alone", single, per)
	}
	var def string
	if err := pool.QueryRow(ctx, `SELECT pg_get_indexdef('webhook_deliveries_due_per_endpoint'::regclass)`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(def, "(endpoint_id, next_attempt_at) WHERE (state = 'pending'::text)") {
		t.Errorf("the per-endpoint index is %s; want (endpoint_id, next_attempt_at) of pending rows", def)
	}
	if err := migrations.DownTo(ctx, url, 14); err != nil {
		t.Fatal(err)
	}
	if single, per := indexes(); single != 1 || per != 0 {
		t.Errorf("after down to 14: %d single, %d per-endpoint indexes; want the single one alone", single, per)
	}
	if applied, err := migrations.Up(ctx, url, nil); err != nil || len(applied) == 0 || applied[0] != 15 {
		t.Fatalf("up again applied %v, %v; want migration 15 first", applied, err)
	}
	if single, per := indexes(); single != 0 || per != 1 {
		t.Errorf("after up again: %d single, %d per-endpoint indexes; want the per-endpoint one alone", single, per)
	}
}

// Migration 17 indexes the scheduled rows the firer can still fire (not
// cancelled), and the cancelled ones for maintenance, in place of the index
// of every row; taken back it restores that index, and applied again
// replaces it.
func TestMigration17DownAndUpAgain(t *testing.T) {
	url := pgtest.DB(t)
	pool := pgtest.Connect(t, url)
	ctx := context.Background()
	defs := func() map[string]string {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT c.relname::text, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
			WHERE i.indrelid = 'scheduled_notifications'::regclass AND i.indisvalid AND c.relname LIKE 'scheduled_notifications\_%' AND c.relname <> 'scheduled_notifications_pkey'
			  AND c.relname <> 'scheduled_notifications_event'`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		m := map[string]string{}
		for rows.Next() {
			var name, def string
			if err := rows.Scan(&name, &def); err != nil {
				t.Fatal(err)
			}
			m[name] = def[strings.Index(def, " USING "):]
		}
		return m
	}
	want := map[string]string{
		"scheduled_notifications_pending":   " USING btree (send_at, id) WHERE (cancelled_at IS NULL)",
		"scheduled_notifications_cancelled": " USING btree (send_at) WHERE (cancelled_at IS NOT NULL)",
	}
	check := func(when string, want map[string]string) {
		t.Helper()
		got := defs()
		if len(got) != len(want) {
			t.Errorf("%s: indexes %v; want %v", when, got, want)
		}
		for name, def := range want {
			if got[name] != def {
				t.Errorf("%s: %s is %q; want %q", when, name, got[name], def)
			}
		}
	}
	check("after up", want)
	if err := migrations.DownTo(ctx, url, 16); err != nil {
		t.Fatal(err)
	}
	check("after down to 16", map[string]string{"scheduled_notifications_due": " USING btree (send_at, id)"})
	if applied, err := migrations.Up(ctx, url, nil); err != nil || len(applied) == 0 || applied[0] != 17 {
		t.Fatalf("up again applied %v, %v; want migration 17 first", applied, err)
	}
	check("after up again", want)
}

// Migration 19 adds the inbox states: each partition, with rows, ends with
// its tab indexes valid and attached (and partitions made later get them),
// the unread index they replace goes, a seen watermark of before becomes
// one seen move, and a read webhook is written from a state event. Taken
// back it restores the unread index and drops what it added; applied again
// it builds them anew.
func TestMigration19DownAndUpAgain(t *testing.T) {
	url := pgtest.DB(t)
	pool := pgtest.Connect(t, url)
	ctx := context.Background()
	tabs := []string{"notifications_inbox", "notifications_archived", "notifications_inbox_unread", "notifications_marked_unread", "notifications_unarchived"}
	// valid counts, for each index, whether it is valid and attached on
	// every partition: -1 when it does not exist.
	valid := func(name string) int {
		t.Helper()
		var ok bool
		var parts, indexed int
		err := pool.QueryRow(ctx, `SELECT i.indisvalid,
				(SELECT count(*) FROM pg_inherits WHERE inhparent = 'notifications'::regclass),
				(SELECT count(*) FROM pg_inherits WHERE inhparent = i.indexrelid)
			FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = $1`, name).Scan(&ok, &parts, &indexed)
		if err == pgx.ErrNoRows {
			return -1
		}
		if err != nil {
			t.Fatal(err)
		}
		if ok && parts > 0 && indexed == parts {
			return 1
		}
		return 0
	}
	check := func(when string, want int, unread int) {
		t.Helper()
		for _, name := range tabs {
			if got := valid(name); got != want {
				t.Errorf("%s: %s is %d; want %d (1 valid on every partition, -1 absent)", when, name, got, want)
			}
		}
		if got := valid("notifications_unread"); got != unread {
			t.Errorf("%s: notifications_unread is %d; want %d", when, got, unread)
		}
	}
	if _, err := pool.Exec(ctx, `SELECT spoolcast_ensure_week_partition('notifications', now() + interval '70 days')`); err != nil {
		t.Fatal(err)
	}
	check("after up", 1, -1)
	if err := migrations.DownTo(ctx, url, 18); err != nil {
		t.Fatal(err)
	}
	check("after down to 18", -1, 1)
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM pg_class WHERE relname IN ('state_events', 'archive_marks')`); n != 0 {
		t.Errorf("after down to 18: %d of state_events and archive_marks left", n)
	}
	// A seen watermark of before, and rows in a partition made meanwhile.
	if _, err := pool.Exec(ctx, `SELECT spoolcast_ensure_week_partition('notifications', now() + interval '77 days')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO stream_seen (user_id, through_tx, through_id, seen_at) VALUES ('ada', '42', 7, '2026-12-01T10:00:00Z')`); err != nil {
		t.Fatal(err)
	}
	if applied, err := migrations.Up(ctx, url, nil); err != nil || len(applied) == 0 || applied[0] != 19 {
		t.Fatalf("up again applied %v, %v; want migration 19 first", applied, err)
	}
	check("after up again", 1, -1)
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM state_events WHERE user_id = 'ada' AND kind = 'seen' AND seen_tx = '42' AND seen_id = 7
			AND created_at = '2026-12-01T10:00:00Z'`); n != 1 {
		t.Errorf("%d seen moves for the watermark of before; want 1", n)
	}
	if _, err := pool.Exec(ctx, `SELECT spoolcast_ensure_week_partition('notifications', now() + interval '84 days')`); err != nil {
		t.Fatal(err)
	}
	check("with a partition made after", 1, -1)
	if _, err := pool.Exec(ctx, `INSERT INTO webhook_endpoints (id, url, events, secret) VALUES ('e1', 'https://hooks.example', '{notification.read}', 'whsec_x')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO state_events (user_id, kind, note_at, note_seq) VALUES ('ada', 'read', '2026-12-01T10:00:00Z', 9), ('ada', 'archived', '2026-12-01T10:00:00Z', 9)`); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM webhook_deliveries WHERE type = 'notification.read' AND payload->'data' ? 'notification_id'`); n != 1 {
		t.Errorf("%d read webhooks from a state event; want 1 (the endpoint takes no archived)", n)
	}
}

// Migration 20 adds the clears: a read (here a state event) writes one clear
// per device whose push of it was sent or delivered, once however often it
// is read, and a read-all one per pushed notification it covers. Taken back
// it drops them; applied again it writes them anew.
func TestMigration20WritesAClearPerDeviceThatGotThePush(t *testing.T) {
	url := pgtest.DB(t)
	pool := pgtest.Connect(t, url)
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	var at string
	var ids []int64
	for i := range 2 {
		var id int64
		if err := pool.QueryRow(ctx, `INSERT INTO notifications (user_id, created_at, type, category, producer, idempotency_key, notification_key, title)
			VALUES ('ada', date_trunc('second', now()) - interval '1 minute', 't', 'c', 'p', $1, $1, 't') RETURNING id, created_at::text`, "k"+string(rune('0'+i))).Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		exec(`INSERT INTO push_dispatches (notification_id, notification_created_at, user_id, token, state)
			VALUES ($1, $2, 'ada', 'ExponentPushToken[sent]', 'sent'), ($1, $2, 'ada', 'ExponentPushToken[failed]', 'failed'), ($1, $2, 'ada', NULL, 'skipped')`, id, at)
	}
	read := func() {
		t.Helper()
		exec(`INSERT INTO state_events (user_id, kind, note_at, note_seq) VALUES ('ada', 'read', $1, $2)`, at, ids[0])
	}
	read()
	read()
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM push_clears WHERE token = 'ExponentPushToken[sent]' AND notification_id = $1 AND state = 'queued'`, ids[0]); n != 1 ||
		pgtest.Count(t, pool, `SELECT count(*) FROM push_clears`) != 1 {
		t.Errorf("a read twice wrote %d clears for the device that got the push; want 1, and none other", n)
	}
	exec(`INSERT INTO state_events (user_id, kind, note_at, note_seq, snapshot) VALUES ('ada', 'read_all', $1, $2, pg_current_snapshot())`, at, ids[1])
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM push_clears`); n != 2 {
		t.Errorf("after a read-all %d clears; want 2", n)
	}
	if err := migrations.DownTo(ctx, url, 19); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM pg_class WHERE relname IN ('push_clears', 'push_clear_devices')`); n != 0 {
		t.Errorf("after down to 19: %d of push_clears and push_clear_devices left", n)
	}
	read() // no trigger left
	if applied, err := migrations.Up(ctx, url, nil); err != nil || len(applied) == 0 || applied[0] != 20 {
		t.Fatalf("up again applied %v, %v; want migration 20 first", applied, err)
	}
	read()
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM push_clears`); n != 1 {
		t.Errorf("after up again a read wrote %d clears; want 1", n)
	}
}
