-- +goose Up
-- Clears: a notification read or archived (by item, or under a read-all or
-- archive-all) takes its banner off the user's devices that got its push.
-- A trigger on state_events writes one push_clears row per notification and
-- device in the change's own transaction, so a clear exists exactly when the
-- change committed, and the primary key makes it once per notification and
-- device however often it is read again. Any replica sends due rows; each
-- row moves queued → sending in the statement that claims it, and sending
-- ends sent, failed or skipped: never sent twice. push_clear_devices holds
-- each device's last clear, so that across replicas a device gets at most
-- one a second. Every lock waits at most 5 s.
SET LOCAL lock_timeout = '5s';

CREATE TABLE push_clears (
    notification_id         bigint      NOT NULL,
    notification_created_at timestamptz NOT NULL,
    token                   text        NOT NULL,
    user_id                 text        NOT NULL,
    state                   text        NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'sending', 'sent', 'failed', 'skipped')),
    created_at              timestamptz NOT NULL DEFAULT now(),
    due_at                  timestamptz NOT NULL DEFAULT now(),
    claimed_by              text,
    sent_at                 timestamptz,
    ticket_id               text,
    error                   text,
    PRIMARY KEY (notification_id, token)
);
-- The senders' work, and the sends a replica killed mid-send left.
CREATE INDEX push_clears_due ON push_clears (due_at, token) WHERE state = 'queued';
CREATE INDEX push_clears_sending ON push_clears (sent_at) WHERE state = 'sending';
-- Maintenance deletes rows past the window in which a read can clear.
CREATE INDEX push_clears_created ON push_clears (created_at);

CREATE TABLE push_clear_devices (
    token   text        PRIMARY KEY,
    sent_at timestamptz NOT NULL
);

-- A change by item clears its notification; a watermark the notifications
-- it covers (at or below it in feed order, committed when it was asked), as
-- the feed reads them. Only pushes of the last 3 days that reached or may
-- have reached the device (sent, delivered, receipt_missing) are cleared:
-- the dispatches are read by the user's index, per state event.
-- +goose StatementBegin
CREATE FUNCTION spoolcast_push_clears() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_rows WHERE kind IN ('read', 'archived', 'read_all', 'archive_all') AND note_at IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    INSERT INTO push_clears (notification_id, notification_created_at, token, user_id)
    SELECT DISTINCT d.notification_id, d.notification_created_at, d.token, d.user_id
    FROM new_rows s
    CROSS JOIN LATERAL (
        SELECT d.notification_id, d.notification_created_at, d.token, d.user_id FROM push_dispatches d
        WHERE d.user_id = s.user_id AND d.created_at > now() - interval '3 days'
          AND s.kind IN ('read', 'archived') AND d.notification_id = s.note_seq AND d.notification_created_at = s.note_at
          AND d.token IS NOT NULL AND d.state IN ('sent', 'delivered', 'receipt_missing')
        UNION ALL
        SELECT d.notification_id, d.notification_created_at, d.token, d.user_id FROM push_dispatches d
        JOIN notifications n ON n.id = d.notification_id AND n.created_at = d.notification_created_at
        WHERE d.user_id = s.user_id AND d.created_at > now() - interval '3 days'
          AND s.kind IN ('read_all', 'archive_all')
          AND (d.notification_created_at, d.notification_id) <= (s.note_at, s.note_seq)
          AND coalesce(pg_visible_in_snapshot(n.tx, s.snapshot), true)
          AND d.token IS NOT NULL AND d.state IN ('sent', 'delivered', 'receipt_missing')
    ) d
    WHERE s.note_at IS NOT NULL
    ON CONFLICT (notification_id, token) DO NOTHING;
    RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER push_clears AFTER INSERT ON state_events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION spoolcast_push_clears();

-- +goose Down
SET LOCAL lock_timeout = '5s';
DROP TRIGGER push_clears ON state_events;
DROP FUNCTION spoolcast_push_clears();
DROP TABLE push_clear_devices;
DROP TABLE push_clears;
