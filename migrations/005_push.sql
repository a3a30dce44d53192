-- +goose Up
-- Push: devices, per-category preferences, and one dispatch row per
-- (notification, device) that records each step's outcome.

-- Push tokens. Never deleted: disabling keeps the reason, and registering the
-- token again turns it back on.
CREATE TABLE devices (
    token           text        PRIMARY KEY,
    user_id         text        NOT NULL,
    platform        text        NOT NULL CHECK (platform IN ('ios', 'android')),
    enabled         boolean     NOT NULL DEFAULT true,
    disabled_reason text,
    disabled_at     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX devices_user ON devices (user_id);

-- Built-in preferences: a row per category a user turned push on or off for;
-- a category without a row pushes.
CREATE TABLE push_preferences (
    user_id    text        NOT NULL,
    category   text        NOT NULL,
    push       boolean     NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, category)
);

-- The push queue is claimed with a lease: a dispatcher marks rows it works on
-- for a while, so that rows of a dispatcher that stopped are taken again
-- after the lease, and rows being worked on are skipped by the others.
ALTER TABLE push_queue ADD COLUMN claimed_until timestamptz;
ALTER TABLE push_queue ADD COLUMN claimed_by text;

-- One row per notification and device: queued → sent → delivered |
-- receipt_error | receipt_missing, or queued → failed; a notification that
-- is not pushed (its category is off, or its user has no device) has one row
-- in state skipped, with why. Weekly partitions on created_at, dropped with
-- the notifications' retention.
CREATE SEQUENCE push_dispatch_ids;
CREATE TABLE push_dispatches (
    id                      bigint      NOT NULL DEFAULT nextval('push_dispatch_ids'),
    created_at              timestamptz NOT NULL DEFAULT now(),
    notification_id         bigint      NOT NULL,
    notification_created_at timestamptz NOT NULL,
    user_id                 text        NOT NULL,
    token                   text,
    state                   text        NOT NULL CHECK (state IN ('queued', 'sent', 'delivered', 'receipt_error', 'receipt_missing', 'failed', 'skipped')),
    ticket_id               text,
    error                   text,
    sent_at                 timestamptz,
    receipt_checked_at      timestamptz,
    updated_at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
ALTER SEQUENCE push_dispatch_ids OWNED BY push_dispatches.id;

-- The receipt reconciler's work: sent dispatches by send time. (now() cannot
-- sit in a partial index's predicate; the query bounds sent_at itself.)
CREATE INDEX push_dispatches_sent ON push_dispatches (sent_at) WHERE state = 'sent';
-- Dispatches left queued by a replica that stopped mid-send.
CREATE INDEX push_dispatches_queued ON push_dispatches (created_at) WHERE state = 'queued';
-- Delivery logs, newest first: all, by user, by state.
CREATE INDEX push_dispatches_log ON push_dispatches (created_at DESC, id DESC);
CREATE INDEX push_dispatches_user ON push_dispatches (user_id, created_at DESC, id DESC);
CREATE INDEX push_dispatches_state ON push_dispatches (state, created_at DESC, id DESC);

SELECT spoolcast_ensure_week_partition('push_dispatches', w)
FROM generate_series(now(), now() + interval '4 weeks', interval '1 week') AS w;

-- +goose Down
DROP TABLE push_dispatches;
ALTER TABLE push_queue DROP COLUMN claimed_by;
ALTER TABLE push_queue DROP COLUMN claimed_until;
DROP TABLE push_preferences;
DROP TABLE devices;
