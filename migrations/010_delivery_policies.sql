-- +goose Up
-- Delivery policies: scheduled sends, digests, quiet hours, throttles. All
-- of it is due work in Postgres, taken by any replica with SKIP LOCKED, and
-- each step moves its rows in one statement, so a crash repeats nothing.
-- Every lock waits at most 5 s: behind a long transaction this migration
-- fails with a lock timeout instead of queueing ingest, and runs again.
SET LOCAL lock_timeout = '5s';

-- Scheduled notifications: claimed at ingest like any other (so a retry is
-- a duplicate), kept here until send_at, then moved into notifications in
-- one statement. Their id is taken at ingest, so a cancellation and the
-- delivery log name the notification it would have been.
CREATE TABLE scheduled_notifications (
    id               bigint      PRIMARY KEY DEFAULT nextval('notification_ids'),
    send_at          timestamptz NOT NULL,
    user_id          text        NOT NULL,
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
    priority         text        NOT NULL DEFAULT 'normal',
    digest_key       text,
    digest_window    interval,
    cancelled_at     timestamptz,
    scheduled_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX scheduled_notifications_due ON scheduled_notifications (send_at, id);
CREATE INDEX scheduled_notifications_event ON scheduled_notifications (producer, idempotency_key);

-- The push queue learns when a row is due (quiet hours defer it), its
-- priority and its digest. A digest's own push is a queue row with
-- digest_count set: how many notifications it gathers.
ALTER TABLE push_queue
    ADD COLUMN due_at        timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN priority      text        NOT NULL DEFAULT 'normal',
    ADD COLUMN digest_key    text,
    ADD COLUMN digest_window interval,
    ADD COLUMN digest_count  integer;
-- The push queue is drained in seconds, so this index builds in
-- milliseconds; the lock_timeout above bounds its wait.
CREATE INDEX push_queue_due ON push_queue (due_at, notification_id);

-- Open digests, one per (recipient, key): the window opens with its first
-- push and closes at window_end, when its one push is queued. A push for
-- the same key after the row is gone opens the next window.
CREATE TABLE push_digests (
    user_id                 text        NOT NULL,
    digest_key              text        NOT NULL,
    window_end              timestamptz NOT NULL,
    count                   integer     NOT NULL,
    notification_id         bigint      NOT NULL, -- the latest notification gathered
    notification_created_at timestamptz NOT NULL,
    category                text        NOT NULL,
    priority                text        NOT NULL,
    opened_at               timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, digest_key)
);
CREATE INDEX push_digests_due ON push_digests (window_end);

-- Quiet hours per user: minutes of the day in the user's IANA zone; the
-- window may cross midnight.
CREATE TABLE push_quiet_hours (
    user_id      text        PRIMARY KEY,
    start_minute smallint    NOT NULL CHECK (start_minute BETWEEN 0 AND 1439),
    end_minute   smallint    NOT NULL CHECK (end_minute BETWEEN 0 AND 1439),
    time_zone    text        NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Throttle counters per (user, category, fixed window): how many pushes the
-- window has taken. Rows of past windows are deleted by the dispatchers (every 15 s).
CREATE TABLE push_throttles (
    user_id      text        NOT NULL,
    category     text        NOT NULL,
    window_start timestamptz NOT NULL,
    count        integer     NOT NULL,
    PRIMARY KEY (user_id, category, window_start)
);
CREATE INDEX push_throttles_window ON push_throttles (window_start);

-- The dispatch states the policies add. The old constraint is dropped (no
-- scan) and the new one added NOT VALID: it holds every row written from
-- now on without reading the delivery log under a lock; the old rows met a
-- narrower check already.
ALTER TABLE push_dispatches DROP CONSTRAINT push_dispatches_state_check;
ALTER TABLE push_dispatches ADD CONSTRAINT push_dispatches_state_check
    CHECK (state IN ('queued', 'sent', 'delivered', 'receipt_error', 'receipt_missing', 'failed', 'skipped',
                     'deferred', 'digested', 'throttled', 'suppressed', 'cancelled')) NOT VALID;

-- +goose Down
SET LOCAL lock_timeout = '5s';
ALTER TABLE push_dispatches DROP CONSTRAINT push_dispatches_state_check;
ALTER TABLE push_dispatches ADD CONSTRAINT push_dispatches_state_check
    CHECK (state IN ('queued', 'sent', 'delivered', 'receipt_error', 'receipt_missing', 'failed', 'skipped')) NOT VALID;
DROP TABLE push_throttles;
DROP TABLE push_quiet_hours;
DROP TABLE push_digests;
DROP INDEX push_queue_due;
ALTER TABLE push_queue DROP COLUMN due_at, DROP COLUMN priority, DROP COLUMN digest_key,
    DROP COLUMN digest_window, DROP COLUMN digest_count;
DROP TABLE scheduled_notifications;
