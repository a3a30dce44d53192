-- +goose Up
-- A notification given back to the push queue after its delivery policies
-- let its push through (a send given back on SIGTERM or while its push
-- service is busy, a web push queued again after a 429) is pushed without
-- deciding them again: a throttle would count it twice, and quiet hours
-- could hold it a second time. Every lock waits at most 5 s; adding a
-- column with a constant default rewrites nothing.
SET LOCAL lock_timeout = '5s';
ALTER TABLE push_queue ADD COLUMN decided boolean NOT NULL DEFAULT false;

-- +goose Down
SET LOCAL lock_timeout = '5s';
ALTER TABLE push_queue DROP COLUMN decided;
