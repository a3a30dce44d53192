-- +goose Up
-- The in-app feed: one row per recipient of an event. created_at is central's
-- time of persistence (a delayed event shows at the top of the feed);
-- received_at is when the relay first received the event.
CREATE TABLE notifications (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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

-- The keyset feed: newest first, id as the tie-breaker for equal created_at.
CREATE INDEX notifications_feed ON notifications (user_id, created_at DESC, id DESC);

-- Unread rows only, for the capped unread count and the unread filter.
CREATE INDEX notifications_unread ON notifications (user_id, created_at DESC, id DESC) WHERE read_at IS NULL;

-- +goose Down
DROP TABLE notifications;
