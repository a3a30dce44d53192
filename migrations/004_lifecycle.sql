-- +goose Up
-- What is stored has a lifetime. Claimed keys expire after central's key
-- window, in small batches found through their claim time. Notifications live
-- in weekly partitions on created_at, dropped whole past retention, never
-- deleted row by row. `spoolcast maintain` (and central, periodically) runs the
-- lifecycle; see docs/operations.md.

CREATE INDEX idempotency_keys_claimed ON idempotency_keys (claimed_at);

-- spoolcast_ensure_week_partition creates the weekly partition of parent
-- (weeks start Monday 00:00 UTC) that holds at, unless it exists, and reports
-- whether it created it. Ingest calls it when a row finds no partition, so a
-- missing partition costs one retry, never an event; maintenance calls it to
-- create partitions ahead of time. Concurrent callers are safe: the loser's
-- error is taken as "it exists".
-- +goose StatementBegin
CREATE FUNCTION spoolcast_ensure_week_partition(parent regclass, at timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    start timestamptz := date_trunc('week', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    name  text := (SELECT relname FROM pg_class WHERE oid = parent) || '_' || to_char(start AT TIME ZONE 'UTC', 'YYYYMMDD');
BEGIN
    IF to_regclass(quote_ident(name)) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                   name, parent, start, start + interval '7 days');
    RETURN true;
EXCEPTION WHEN duplicate_table OR invalid_object_definition THEN
    RETURN false;
END
$$;
-- +goose StatementEnd

-- The feed, partitioned. A partitioned table's keys must hold the partition
-- key, so a notification is identified by (created_at, id), which is also
-- what its public id encodes: reading or marking one goes to its partition
-- alone. Uniqueness per recipient is the claim in idempotency_keys alone:
-- notification_key keeps no constraint of its own.
ALTER TABLE notifications RENAME TO notifications_unpartitioned;
ALTER INDEX notifications_feed RENAME TO notifications_unpartitioned_feed;
ALTER INDEX notifications_unread RENAME TO notifications_unpartitioned_unread;

CREATE SEQUENCE notification_ids;
SELECT setval('notification_ids', coalesce((SELECT max(id) FROM notifications_unpartitioned), 0) + 1, false);

CREATE TABLE notifications (
    id               bigint      NOT NULL DEFAULT nextval('notification_ids'),
    user_id          text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    received_at      timestamptz,
    type             text        NOT NULL,
    category         text        NOT NULL,
    title            text        NOT NULL DEFAULT '',
    body             text        NOT NULL DEFAULT '',
    data             jsonb       NOT NULL DEFAULT '{}'::jsonb,
    producer         text        NOT NULL,
    idempotency_key  text        NOT NULL,
    notification_key text        NOT NULL,
    run_id           text,
    read_at          timestamptz,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
ALTER SEQUENCE notification_ids OWNED BY notifications.id;

-- The keyset feed: newest first, id as the tie-breaker for equal created_at.
-- Partitions are ranges of created_at, so a page reads the newest partitions
-- first and stops as soon as it has its rows (an ordered Append).
CREATE INDEX notifications_feed ON notifications (user_id, created_at DESC, id DESC);
-- Unread rows only, for the capped unread count and the unread filter.
CREATE INDEX notifications_unread ON notifications (user_id, created_at DESC, id DESC) WHERE read_at IS NULL;

-- Partitions for the rows kept, this week and four ahead.
SELECT spoolcast_ensure_week_partition('notifications', w)
FROM generate_series(
    date_trunc('week', least(now(), coalesce((SELECT min(created_at) FROM notifications_unpartitioned), now()))),
    now() + interval '4 weeks',
    interval '1 week') AS w;

INSERT INTO notifications (id, user_id, created_at, received_at, type, category, title, body, data, producer, idempotency_key, notification_key, run_id, read_at)
SELECT id, user_id, created_at, received_at, type, category, title, body, data, producer, idempotency_key, notification_key, run_id, read_at
FROM notifications_unpartitioned;
DROP TABLE notifications_unpartitioned;

-- Read-all is a watermark per user: the rows at or before (through_at,
-- through_id) in feed order count as read, so marking everything read costs
-- one row whatever the feed holds.
CREATE TABLE read_marks (
    user_id    text        PRIMARY KEY,
    through_at timestamptz NOT NULL,
    through_id bigint      NOT NULL,
    marked_at  timestamptz NOT NULL DEFAULT now()
);

-- The push queue names its notification by (created_at, id), its partition's key.
ALTER TABLE push_queue ADD COLUMN notification_created_at timestamptz;

-- Settings the lifecycle records for the other processes: the key window a
-- relay's key TTL must stay under.
CREATE TABLE spoolcast_settings (
    name  text PRIMARY KEY,
    value text NOT NULL
);

-- +goose Down
DROP TABLE spoolcast_settings;
ALTER TABLE push_queue DROP COLUMN notification_created_at;
DROP TABLE read_marks;
CREATE TABLE notifications_unpartitioned (
    id               bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    user_id          text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    received_at      timestamptz,
    type             text        NOT NULL,
    category         text        NOT NULL,
    title            text        NOT NULL DEFAULT '',
    body             text        NOT NULL DEFAULT '',
    data             jsonb       NOT NULL DEFAULT '{}'::jsonb,
    producer         text        NOT NULL,
    idempotency_key  text        NOT NULL,
    notification_key text        NOT NULL UNIQUE REFERENCES idempotency_keys (key),
    run_id           text,
    read_at          timestamptz
);
INSERT INTO notifications_unpartitioned SELECT id, user_id, created_at, received_at, type, category, title, body, data, producer, idempotency_key, notification_key, run_id, read_at FROM notifications;
DROP TABLE notifications;
ALTER TABLE notifications_unpartitioned RENAME TO notifications;
CREATE INDEX notifications_feed ON notifications (user_id, created_at DESC, id DESC);
CREATE INDEX notifications_unread ON notifications (user_id, created_at DESC, id DESC) WHERE read_at IS NULL;
DROP FUNCTION spoolcast_ensure_week_partition(regclass, timestamptz);
DROP INDEX idempotency_keys_claimed;
