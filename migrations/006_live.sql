-- +goose Up
-- The live stream reads what commits, in commit-safe order: each row carries
-- the id of the transaction that wrote it (xid8, 64 bits, no wraparound),
-- and a reader takes rows only below the oldest transaction still running
-- (pg_snapshot_xmin), so a row that commits late is never skipped. See
-- docs/design.md.
ALTER TABLE notifications ADD COLUMN tx xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX notifications_commit_order ON notifications (tx, id);

-- Read state changes, for the sockets of the user's other devices: one row
-- per notification marked read, or per read-all. Kept a day.
CREATE TABLE read_events (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tx         xid8        NOT NULL DEFAULT pg_current_xact_id(),
    user_id    text        NOT NULL,
    read_id    text,       -- a notification's public id, marked read
    through_id text,       -- read-all: everything through this public id
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX read_events_commit_order ON read_events (tx, id);
CREATE INDEX read_events_created ON read_events (created_at);

-- +goose Down
DROP TABLE read_events;
DROP INDEX notifications_commit_order;
ALTER TABLE notifications DROP COLUMN tx;
