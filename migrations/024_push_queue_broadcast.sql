-- +goose Up
-- Direct pushes first: a broadcast's pushes (written by a topic fan-out, up
-- to tens of thousands a second) wait in the queue behind direct ones due
-- at the same time or later. The dispatcher claims due direct rows first,
-- from their own index, then fills its batch with a broadcast's.
-- Every lock waits at most 5 s.
SET LOCAL lock_timeout = '5s';

-- A constant default: no rewrite of the table.
ALTER TABLE push_queue ADD COLUMN broadcast boolean NOT NULL DEFAULT false;
-- The queue holds what is due or deferred, not history: small, and built
-- within the lock_timeout's wait.
CREATE INDEX push_queue_due_direct ON push_queue (due_at, notification_id) WHERE NOT broadcast;

-- +goose Down
SET LOCAL lock_timeout = '5s';
DROP INDEX push_queue_due_direct;
ALTER TABLE push_queue DROP COLUMN broadcast;
