-- The relay's spool. One row per claimed idempotency key. seq orders forwarding;
-- the writer hands seqs out itself, above the highest it has seen, so that
-- within one process a seq is never reused, even after pruning empties the
-- table, and a forwarder reading "after seq N" never misses a new row.
-- (AUTOINCREMENT would do the same at the cost of a write to sqlite_sequence
-- by every INSERT OR IGNORE, even one that inserts nothing.)
--
-- Keys are not unique here: an index over random keys written at every
-- commit costs a random page per claim. The key index (<spool>.keys, see
-- keys.go) answers which row claimed a key.
--
-- A row is in one of three states:
--   pending  forwarded_at IS NULL: waits for Postgres;
--   kept     forwarded_at set, dead_reason NULL: in Postgres; the key, its
--            request hash and receipt time are kept, to answer retries until
--            the key TTL, and the payload for the refeed window, to forward
--            again if Postgres fails over to a standby that had not received
--            it;
--   dead     forwarded_at and dead_reason set: Postgres refused it for good, or
--            found its key claimed by another request; kept for an operator.
-- Payloads live in a table of their own, held for pending and dead rows and,
-- for the refeed window, kept ones: a kept row past it stays small, and the
-- pages its payload took are freed whole. A payload is held while payloads
-- has its row; dropping it leaves the events row as it is (no second write
-- of every forwarded row).
CREATE TABLE IF NOT EXISTS events (
    seq          INTEGER PRIMARY KEY,
    producer     TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    request_hash BLOB    NOT NULL,
    size         INTEGER NOT NULL,           -- payload bytes; unchanged when the payload is dropped (spools written before 2026-12 set it to 0 then)
    fanout       INTEGER NOT NULL DEFAULT 1, -- rows the event becomes downstream (its recipients)
    received_at  INTEGER NOT NULL,           -- unix nanoseconds
    forwarded_at INTEGER,                    -- unix nanoseconds: forwarded, or set aside as dead
    attempts     INTEGER NOT NULL DEFAULT 0,
    dead_reason  TEXT
);

CREATE TABLE IF NOT EXISTS payloads (
    seq     INTEGER PRIMARY KEY, -- the event's
    payload BLOB    NOT NULL
);

-- The forwarder reads pending rows in seq order; stats find the oldest.
CREATE INDEX IF NOT EXISTS events_pending ON events (seq) WHERE forwarded_at IS NULL;

-- Pruning finds kept and dead rows past their retention.
CREATE INDEX IF NOT EXISTS events_forwarded ON events (forwarded_at) WHERE forwarded_at IS NOT NULL;

-- A pruned event takes its payload with it.
CREATE TRIGGER IF NOT EXISTS events_payload_delete AFTER DELETE ON events BEGIN
    DELETE FROM payloads WHERE seq = OLD.seq;
END;

-- Running totals per state, kept by every statement that adds, moves or
-- removes rows, in its transaction (totals.go: a trigger run per row cost more
-- than the row), so the byte limit and the stats never scan the table, and
-- stay exact when another process (spoolcast spool requeue) writes the file.
-- Bytes are payload bytes (size): the canonical event as the producer sent it.
CREATE TABLE IF NOT EXISTS totals (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    pending_rows  INTEGER NOT NULL,
    pending_bytes INTEGER NOT NULL,
    kept_rows     INTEGER NOT NULL,
    dead_rows     INTEGER NOT NULL,
    dead_bytes    INTEGER NOT NULL,
    kept_bytes    INTEGER NOT NULL DEFAULT 0 -- payloads of kept rows held for the refeed window
);

-- What the spool remembers of the world: the history (system identifier and
-- timeline) of the Postgres it last forwarded to, so that a failover is
-- recognised across restarts.
CREATE TABLE IF NOT EXISTS meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- A scratch table for the readiness probe's write.
CREATE TABLE IF NOT EXISTS probe (data BLOB);
