-- +goose Up
-- Push work queued by ingest in the same transaction as the notification, so a
-- persisted notification is never missing its push work. The push dispatcher
-- claims rows with FOR UPDATE SKIP LOCKED.
CREATE TABLE push_queue (
    notification_id bigint      PRIMARY KEY REFERENCES notifications (id) ON DELETE CASCADE,
    user_id         text        NOT NULL,
    category        text        NOT NULL,
    enqueued_at     timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX push_queue_order ON push_queue (enqueued_at, notification_id);

-- +goose Down
DROP TABLE push_queue;
