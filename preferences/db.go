package preferences

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/push/policy"
)

// DB is what preferences need of Postgres: a pgxpool.Pool or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// QuietHours returns the quiet hours of those of users that have them.
func QuietHours(ctx context.Context, db DB, users []string) (map[string]policy.QuietHours, error) {
	rows, err := db.Query(ctx, `SELECT user_id, start_minute, end_minute, time_zone FROM push_quiet_hours WHERE user_id = ANY($1)`, users)
	if err != nil {
		return nil, fmt.Errorf("read quiet hours: %w", err)
	}
	defer rows.Close()
	out := map[string]policy.QuietHours{}
	for rows.Next() {
		var user, zone string
		var start, end int16
		if err := rows.Scan(&user, &start, &end, &zone); err != nil {
			return nil, fmt.Errorf("read quiet hours: %w", err)
		}
		q, err := policy.QuietHoursOf(int(start), int(end), zone)
		if err == nil {
			out[user] = q
		}
	}
	return out, rows.Err()
}
