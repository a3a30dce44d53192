package push

import (
	"context"
	"time"
)

// GiveBack gives the queued dispatch id back to the queue, as a send that
// never reached its push service does.
func GiveBack(ctx context.Context, d *Dispatcher, id int64) error {
	c := created{n: &queued{priority: "normal"}}
	err := d.cfg.DB.QueryRow(ctx, `SELECT d.id, d.created_at, d.token, n.id, n.created_at, n.user_id, n.category
		FROM push_dispatches d JOIN notifications n ON n.id = d.notification_id AND n.created_at = d.notification_created_at
		WHERE d.id = $1`, id).Scan(&c.id, &c.createdAt, &c.token, &c.n.id, &c.n.createdAt, &c.n.user, &c.n.category)
	if err != nil {
		return err
	}
	c.n.enqueuedAt, c.n.dueAt = c.n.createdAt, c.n.createdAt
	return d.release(ctx, []created{c}, time.Time{})
}
