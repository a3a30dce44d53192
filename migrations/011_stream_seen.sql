-- +goose Up
-- Suppress-if-seen (--push-suppress-if-seen): which users hold an open
-- stream, and how far each has seen it. Every lock waits at most 5 s.
SET LOCAL lock_timeout = '5s';

-- One row per (user, replica) with an open stream socket, refreshed by the
-- replica while the socket is open and deleted when the last one closes; a
-- replica killed leaves rows that expire on their own.
CREATE TABLE stream_presence (
    user_id    text        NOT NULL,
    replica    text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (user_id, replica)
);
CREATE INDEX stream_presence_replica ON stream_presence (replica);

-- The furthest stream position each user's app said it has seen
-- ({"type":"seen","cursor":…}): every notification at or before it in
-- commit order was shown.
CREATE TABLE stream_seen (
    user_id    text        PRIMARY KEY,
    through_tx xid8        NOT NULL,
    through_id bigint      NOT NULL,
    seen_at    timestamptz NOT NULL DEFAULT now()
);

-- A push that waited for its user to see it is not held again.
ALTER TABLE push_queue ADD COLUMN seen_waited boolean NOT NULL DEFAULT false;

-- +goose Down
SET LOCAL lock_timeout = '5s';
ALTER TABLE push_queue DROP COLUMN seen_waited;
DROP TABLE stream_seen;
DROP TABLE stream_presence;
