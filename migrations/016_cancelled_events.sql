-- +goose Up
-- A cancelled scheduled event keeps its rows in scheduled_notifications
-- (cancelled_at set) for as long as its keys, so that a repeated cancel
-- answers what the first did, and the delivery log and push.cancelled
-- webhooks can say which event was stopped. A cancelled notification never
-- existed, so its webhook names no notification id: the producer, key and
-- user name what was stopped. Every lock waits at most 5 s.
SET LOCAL lock_timeout = '5s';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION spoolcast_webhook_push(d push_dispatches) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('id', spoolcast_public_id(d.created_at, d.id),
        'notification_id', CASE WHEN d.state = 'cancelled' THEN NULL ELSE spoolcast_public_id(d.notification_created_at, d.notification_id) END,
        'user_id', d.user_id, 'token', spoolcast_mask_token(d.token), 'state', d.state, 'error', d.error, 'ticket_id', d.ticket_id,
        'producer', coalesce(n.producer, s.producer), 'idempotency_key', coalesce(n.idempotency_key, s.idempotency_key),
        'at', spoolcast_rfc3339(d.updated_at))
    FROM (SELECT) one
    LEFT JOIN notifications n ON d.state <> 'cancelled' AND n.created_at = d.notification_created_at AND n.id = d.notification_id
    LEFT JOIN scheduled_notifications s ON d.state = 'cancelled' AND s.id = d.notification_id
$$;
-- +goose StatementEnd

-- +goose Down
SET LOCAL lock_timeout = '5s';
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION spoolcast_webhook_push(d push_dispatches) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('id', spoolcast_public_id(d.created_at, d.id),
        'notification_id', spoolcast_public_id(d.notification_created_at, d.notification_id),
        'user_id', d.user_id, 'token', spoolcast_mask_token(d.token), 'state', d.state, 'error', d.error, 'ticket_id', d.ticket_id,
        'producer', n.producer, 'idempotency_key', n.idempotency_key, 'at', spoolcast_rfc3339(d.updated_at))
    FROM (SELECT) one LEFT JOIN notifications n ON n.created_at = d.notification_created_at AND n.id = d.notification_id
$$;
-- +goose StatementEnd
