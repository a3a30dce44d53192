-- +goose Up
-- A read and the record of a push sent take one lock per user (class
-- 0x636c7273, "clrs", then hashtext of the user: push.ClearLockClass), so
-- that a push sent as its notification is read gets its clear: the
-- trigger takes it before it reads which pushes were sent (each statement
-- of a function takes a new snapshot, after the lock), and the record of a
-- push sent takes it before it looks for reads made meanwhile. Whichever
-- comes second sees the other committed.
SET LOCAL lock_timeout = '5s';
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION spoolcast_push_clears() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_rows WHERE kind IN ('read', 'archived', 'read_all', 'archive_all') AND note_at IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(1668051571, hashtext(u.user_id))
    FROM (SELECT DISTINCT user_id FROM new_rows WHERE kind IN ('read', 'archived', 'read_all', 'archive_all') ORDER BY user_id) u;
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

-- +goose Down
SET LOCAL lock_timeout = '5s';
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION spoolcast_push_clears() RETURNS trigger LANGUAGE plpgsql AS $$
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
