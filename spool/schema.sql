-- The relay's spool. One row per claimed idempotency key. seq orders forwarding
-- and is never reused (AUTOINCREMENT), even after pruning empties the table, so a
-- forwarder reading "after seq N" never misses a new row; forwarded_at is NULL
-- while the row waits for Postgres.
CREATE TABLE IF NOT EXISTS events (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    producer     TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    request_hash BLOB    NOT NULL,
    payload      BLOB    NOT NULL,
    received_at  INTEGER NOT NULL, -- unix nanoseconds
    forwarded_at INTEGER,          -- unix nanoseconds, NULL while pending
    attempts     INTEGER NOT NULL DEFAULT 0,
    dead_reason  TEXT,             -- set when Postgres refused the row for good
    UNIQUE (producer, key)
);

-- The forwarder reads pending rows in seq order; stats count them.
CREATE INDEX IF NOT EXISTS events_pending ON events (seq) WHERE forwarded_at IS NULL;

-- Pruning finds forwarded rows older than the key TTL.
CREATE INDEX IF NOT EXISTS events_forwarded ON events (forwarded_at) WHERE forwarded_at IS NOT NULL;
