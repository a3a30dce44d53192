-- +goose Up
-- One-use tickets that stand in for a user's token on the stream's URL, for
-- a browser's EventSource, which cannot send headers (POST
-- /v1/stream/tickets). Only the SHA-256 of each ticket is kept, never the
-- ticket; any replica redeems one by deleting its row. Every lock waits at
-- most 5 s.
SET LOCAL lock_timeout = '5s';

CREATE TABLE stream_tickets (
    hash       bytea       PRIMARY KEY,
    user_id    text        NOT NULL,
    expires_at timestamptz NOT NULL
);
-- Maintenance deletes the tickets that expired unused.
CREATE INDEX stream_tickets_expires_at ON stream_tickets (expires_at);

-- +goose Down
SET LOCAL lock_timeout = '5s';
DROP TABLE stream_tickets;
