package migrations

import (
	"context"
	"database/sql"

	"github.com/pressly/goose/v3"
)

// Migration 15 indexes the webhook outbox's due deliveries per endpoint,
// (endpoint_id, next_attempt_at) over pending rows, in place of one index of
// every endpoint's (next_attempt_at). A deliverer's pass takes each enabled
// endpoint's oldest due rows up to its share, one probe per endpoint: an
// endpoint at its cap with a backlog (its receiver down) costs a pass nothing,
// where with one index a pass stepped over the whole backlog to find the
// other endpoints' rows (about 40 ms of Postgres at 250,000 rows, at every pass).
// The build and the drop are CONCURRENTLY, so ingest, whose triggers write
// the outbox, never waits for them; every lock waits at most lockTimeout.
// The older index goes in the same step: beside the new one, the planner
// took it for an endpoint's probe (its estimate of an endpoint's share of
// the rows is an average), and stepped over the whole backlog again. While
// a rolling deploy still runs the version before, that version's passes
// read every pending row (about 90 ms at 250,000 pending) until it is
// replaced.
var m015 = goose.NewGoMigration(15, &goose.GoFunc{RunDB: m015Up}, &goose.GoFunc{RunDB: m015Down})

const (
	m015Index = "webhook_deliveries_due_per_endpoint"
	m015Old   = "webhook_deliveries_due"
)

func m015Up(ctx context.Context, db *sql.DB) error {
	return replaceIndex(ctx, db, m015Index, `ON webhook_deliveries (endpoint_id, next_attempt_at) WHERE state = 'pending'`, m015Old)
}

func m015Down(ctx context.Context, db *sql.DB) error {
	return replaceIndex(ctx, db, m015Old, `ON webhook_deliveries (next_attempt_at) WHERE state = 'pending'`, m015Index)
}
