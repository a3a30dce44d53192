-- +goose Up
-- Topic fan-out: an event addressed to topics is stored once, as one
-- topic_fanouts row per (event, topic), written in the ingest's statement.
-- Any replica writes its members' notifications in batches, in member
-- order, each batch with its range's progress in the same transaction, so a
-- crash anywhere resumes where the last commit left it; each member's
-- notification key (the one a direct recipient would have) makes every
-- batch idempotent. Ranges split a fan-out so that several replicas share
-- it (FOR UPDATE SKIP LOCKED). Every lock waits at most 5 s.
SET LOCAL lock_timeout = '5s';

CREATE TABLE topic_fanouts (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic           text        NOT NULL,
    producer        text        NOT NULL,
    idempotency_key text        NOT NULL,
    -- The event's request hash, which its members' keys are claimed with.
    hash            bytea       NOT NULL,
    -- Members subscribed by accepted_at (when the relay or central first
    -- received the event, never later than its ingest) are its members.
    accepted_at     timestamptz NOT NULL,
    -- When the fan-out may begin: send_at, or accepted_at.
    due_at          timestamptz NOT NULL,
    received_at     timestamptz,
    type            text        NOT NULL,
    category        text        NOT NULL,
    title           text        NOT NULL DEFAULT '',
    body            text        NOT NULL DEFAULT '',
    data            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    run_id          text,
    priority        text        NOT NULL DEFAULT 'normal',
    digest_key      text,
    digest_window   interval,
    state           text        NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'running', 'completed', 'cancelled')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    ended_at        timestamptz,
    UNIQUE (producer, idempotency_key, topic)
);
-- The fan-outs a worker can take: due first.
CREATE INDEX topic_fanouts_open ON topic_fanouts (due_at, id) WHERE state IN ('pending', 'running');
-- Retention: the ended ones, oldest first.
CREATE INDEX topic_fanouts_ended ON topic_fanouts (ended_at) WHERE ended_at IS NOT NULL;

-- A fan-out's members split by user_id: (lo, hi], hi NULL for the last.
-- after is the last member written (lo until the first batch); members
-- are those counted in it when the fan-out started; written
-- counts members who got a new notification, skipped those who had it
-- already (a direct recipient, a member of another of the event's topics).
CREATE TABLE topic_fanout_ranges (
    fanout_id  bigint      NOT NULL REFERENCES topic_fanouts (id) ON DELETE CASCADE,
    lo         text        NOT NULL,
    hi         text,
    after      text        NOT NULL,
    done       boolean     NOT NULL DEFAULT false,
    members    bigint      NOT NULL DEFAULT 0,
    written    bigint      NOT NULL DEFAULT 0,
    skipped    bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (fanout_id, lo)
);
CREATE INDEX topic_fanout_ranges_open ON topic_fanout_ranges (fanout_id, lo) WHERE NOT done;

-- Topic pushes are paced, across every replica, at the deployment's topic
-- push rate: each batch reserves its members' push times here, so direct
-- pushes (due at once) go ahead of a fan-out's queue.
CREATE TABLE topic_push_pace (
    one     boolean     PRIMARY KEY DEFAULT true CHECK (one),
    next_at timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO topic_push_pace DEFAULT VALUES;

-- The topic a notification reached its user through (NULL: a recipient).
-- Nullable without a default: a change of the catalog alone.
ALTER TABLE notifications ADD COLUMN topic text;

-- notification.created is one webhook per recipient; a topic's members are
-- told once, by topic.fanout.completed.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION spoolcast_webhook_notifications() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE enabled AND 'notification.created' = ANY (events)) THEN
        RETURN NULL;
    END IF;
    INSERT INTO webhook_deliveries (endpoint_id, type, payload)
    SELECT e.id, 'notification.created', spoolcast_webhook_body('notification.created', n.created_at, jsonb_build_object(
        'id', spoolcast_public_id(n.created_at, n.id), 'user_id', n.user_id, 'type', n.type, 'category', n.category,
        'title', n.title, 'body', n.body, 'data', n.data, 'producer', n.producer, 'idempotency_key', n.idempotency_key,
        'created_at', spoolcast_rfc3339(n.created_at)))
    FROM new_rows n CROSS JOIN webhook_endpoints e
    WHERE e.enabled AND 'notification.created' = ANY (e.events) AND n.topic IS NULL
    ORDER BY n.created_at, n.id;
    RETURN NULL;
END $$;
-- +goose StatementEnd

-- +goose Down
SET LOCAL lock_timeout = '5s';
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION spoolcast_webhook_notifications() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE enabled AND 'notification.created' = ANY (events)) THEN
        RETURN NULL;
    END IF;
    INSERT INTO webhook_deliveries (endpoint_id, type, payload)
    SELECT e.id, 'notification.created', spoolcast_webhook_body('notification.created', n.created_at, jsonb_build_object(
        'id', spoolcast_public_id(n.created_at, n.id), 'user_id', n.user_id, 'type', n.type, 'category', n.category,
        'title', n.title, 'body', n.body, 'data', n.data, 'producer', n.producer, 'idempotency_key', n.idempotency_key,
        'created_at', spoolcast_rfc3339(n.created_at)))
    FROM new_rows n CROSS JOIN webhook_endpoints e
    WHERE e.enabled AND 'notification.created' = ANY (e.events)
    ORDER BY n.created_at, n.id;
    RETURN NULL;
END $$;
-- +goose StatementEnd
ALTER TABLE notifications DROP COLUMN topic;
DROP TABLE topic_push_pace;
DROP TABLE topic_fanout_ranges;
DROP TABLE topic_fanouts;
