-- +goose Up
-- Push work queued by ingest in the same transaction as the notification, so a
-- persisted notification is never missing its push work. The push dispatcher
-- claims rows in notification_id order with FOR UPDATE SKIP LOCKED. There is no
-- foreign key: checking one would lock every new notification row at ingest;
-- whoever deletes notifications deletes their queue rows too.
CREATE TABLE push_queue (
    notification_id bigint      PRIMARY KEY,
    user_id         text        NOT NULL,
    category        text        NOT NULL,
    enqueued_at     timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE push_queue;
