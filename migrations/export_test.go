package migrations

import (
	"context"
	"database/sql"
)

// DownTo takes the database at databaseURL back to version, for tests of
// migrations' Down.
func DownTo(ctx context.Context, databaseURL string, version int64) error {
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	p, err := provider(db, nil)
	if err != nil {
		return err
	}
	_, err = p.DownTo(ctx, version)
	return err
}
