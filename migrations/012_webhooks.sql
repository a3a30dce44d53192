-- +goose Up
-- Outbound webhooks (Standard Webhooks): endpoints, and an outbox of
-- deliveries that triggers write in the transaction of each state change,
-- so a delivery exists exactly when its change committed. Every lock waits
-- at most 5 s.
SET LOCAL lock_timeout = '5s';

CREATE TABLE webhook_endpoints (
    id                    text        PRIMARY KEY,
    url                   text        NOT NULL,
    description           text        NOT NULL DEFAULT '',
    events                text[]      NOT NULL,
    -- The signing secret, whsec_<base64>; a rotated-out one signs beside it
    -- until previous_secret_until.
    secret                text        NOT NULL,
    previous_secret       text,
    previous_secret_until timestamptz,
    enabled               boolean     NOT NULL DEFAULT true,
    disabled_reason       text,
    disabled_at           timestamptz,
    -- The first failed attempt since the last success: failing for days
    -- disables the endpoint.
    failing_since         timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);

-- One row per (endpoint, event): the body as sent, and where its delivery
-- stands. id is the webhook-id, the same on every attempt. No foreign key to
-- webhook_endpoints: its row locks would be taken by every ingest.
CREATE TABLE webhook_deliveries (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    endpoint_id     text        NOT NULL,
    type            text        NOT NULL,
    payload         jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    state           text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    -- A replica sending it pushes next_attempt_at past the attempt (its
    -- lease): if that replica dies mid-send, any replica sends it again then.
    -- A replay restarts the retry period from replayed_at.
    replayed_at     timestamptz,
    last_attempt_at timestamptz,
    last_status     integer,
    last_error      text,
    ended_at        timestamptz
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, created_at DESC);
CREATE INDEX webhook_deliveries_created ON webhook_deliveries (created_at);

-- Every attempt, for the delivery log. Kept as long as the deliveries.
CREATE TABLE webhook_attempts (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id  uuid        NOT NULL,
    endpoint_id  text        NOT NULL,
    attempted_at timestamptz NOT NULL DEFAULT now(),
    status       integer,
    error        text,
    duration_ms  integer     NOT NULL
);
CREATE INDEX webhook_attempts_endpoint ON webhook_attempts (endpoint_id, id DESC);
CREATE INDEX webhook_attempts_delivery ON webhook_attempts (delivery_id, id);
CREATE INDEX webhook_attempts_attempted ON webhook_attempts (attempted_at);

-- RFC 3339 in UTC with microseconds, whatever the session's TimeZone.
-- +goose StatementBegin
CREATE FUNCTION spoolcast_rfc3339(t timestamptz) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS
$$ SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') $$;
-- +goose StatementEnd

-- A notification's API id (feed.ID): base64url of its created_at in
-- microseconds and its sequence number, 8 bytes each, big-endian.
-- +goose StatementBegin
CREATE FUNCTION spoolcast_public_id(created_at timestamptz, id bigint) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT rtrim(translate(encode(int8send((extract(epoch FROM created_at) * 1000000)::bigint) || int8send(id), 'base64'), '+/', '-_'), '=') $$;
-- +goose StatementEnd

-- The webhook event type of a dispatch state; queued is none.
-- +goose StatementBegin
CREATE FUNCTION spoolcast_push_event_type(state text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE state
    WHEN 'sent' THEN 'push.sent'
    WHEN 'delivered' THEN 'push.delivered'
    WHEN 'failed' THEN 'push.failed'
    WHEN 'receipt_error' THEN 'push.failed'
    WHEN 'receipt_missing' THEN 'push.failed'
    WHEN 'queued' THEN NULL
    ELSE 'push.' || state END $$;
-- +goose StatementEnd

-- The envelope every delivery's body is.
-- +goose StatementBegin
CREATE FUNCTION spoolcast_webhook_body(type text, at timestamptz, data jsonb) RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS
$$ SELECT jsonb_build_object('type', type, 'timestamp', spoolcast_rfc3339(at), 'data', data) $$;
-- +goose StatementEnd

-- Each trigger costs one index-free look at webhook_endpoints (a handful of
-- rows) when no endpoint takes its events.
-- +goose StatementBegin
CREATE FUNCTION spoolcast_webhook_notifications() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE TRIGGER webhook_notifications AFTER INSERT ON notifications
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION spoolcast_webhook_notifications();

-- +goose StatementBegin
CREATE FUNCTION spoolcast_webhook_reads() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE enabled AND 'notification.read' = ANY (events)) THEN
        RETURN NULL;
    END IF;
    INSERT INTO webhook_deliveries (endpoint_id, type, payload)
    SELECT e.id, 'notification.read', spoolcast_webhook_body('notification.read', r.created_at,
        CASE WHEN r.read_id IS NOT NULL
            THEN jsonb_build_object('user_id', r.user_id, 'notification_id', r.read_id, 'read_at', spoolcast_rfc3339(r.created_at))
            ELSE jsonb_build_object('user_id', r.user_id, 'all_through_id', spoolcast_public_id(r.through_at, r.through_seq), 'read_at', spoolcast_rfc3339(r.created_at))
        END)
    FROM new_rows r CROSS JOIN webhook_endpoints e
    WHERE e.enabled AND 'notification.read' = ANY (e.events)
    ORDER BY r.id;
    RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER webhook_reads AFTER INSERT ON read_events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION spoolcast_webhook_reads();

-- A device token as the delivery log shows it (push.MaskToken):
-- ExponentPushToken[abcd…wxyz].
-- +goose StatementBegin
CREATE FUNCTION spoolcast_mask_token(token text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE
    WHEN token ~ '^[^\[]*\[.{9,}\]$' THEN regexp_replace(token, '^([^\[]*\[.{4}).*(.{4}\])$', '\1…\2')
    WHEN token LIKE '%[%' THEN split_part(token, '[', 1) || '[…]'
    ELSE token END $$;
-- +goose StatementEnd

-- A dispatch's event: its state, and the event it came from. Its id is the
-- delivery log's.
-- +goose StatementBegin
CREATE FUNCTION spoolcast_webhook_push(d push_dispatches) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('id', spoolcast_public_id(d.created_at, d.id),
        'notification_id', spoolcast_public_id(d.notification_created_at, d.notification_id),
        'user_id', d.user_id, 'token', spoolcast_mask_token(d.token), 'state', d.state, 'error', d.error, 'ticket_id', d.ticket_id,
        'producer', n.producer, 'idempotency_key', n.idempotency_key, 'at', spoolcast_rfc3339(d.updated_at))
    FROM (SELECT) one LEFT JOIN notifications n ON n.created_at = d.notification_created_at AND n.id = d.notification_id
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION spoolcast_webhook_dispatches_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_endpoints e, unnest(e.events) t WHERE e.enabled AND t LIKE 'push.%') THEN
        RETURN NULL;
    END IF;
    INSERT INTO webhook_deliveries (endpoint_id, type, payload)
    SELECT e.id, t.type, spoolcast_webhook_body(t.type, d.updated_at, spoolcast_webhook_push(d))
    FROM new_rows d CROSS JOIN LATERAL (SELECT spoolcast_push_event_type(d.state) AS type) t
    JOIN webhook_endpoints e ON e.enabled AND t.type = ANY (e.events)
    ORDER BY d.id;
    RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER webhook_dispatches_inserted AFTER INSERT ON push_dispatches
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION spoolcast_webhook_dispatches_inserted();

-- An update is an event only where it changed the state.
-- +goose StatementBegin
CREATE FUNCTION spoolcast_webhook_dispatches_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_endpoints e, unnest(e.events) t WHERE e.enabled AND t LIKE 'push.%') THEN
        RETURN NULL;
    END IF;
    INSERT INTO webhook_deliveries (endpoint_id, type, payload)
    SELECT e.id, t.type, spoolcast_webhook_body(t.type, d.updated_at, spoolcast_webhook_push(d))
    FROM new_rows d CROSS JOIN LATERAL (SELECT spoolcast_push_event_type(d.state) AS type) t
    JOIN webhook_endpoints e ON e.enabled AND t.type = ANY (e.events)
    WHERE NOT EXISTS (SELECT 1 FROM old_rows o WHERE o.id = d.id AND o.created_at = d.created_at AND o.state = d.state)
    ORDER BY d.id;
    RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER webhook_dispatches_updated AFTER UPDATE ON push_dispatches
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION spoolcast_webhook_dispatches_updated();

-- +goose Down
SET LOCAL lock_timeout = '5s';
DROP TRIGGER webhook_dispatches_updated ON push_dispatches;
DROP TRIGGER webhook_dispatches_inserted ON push_dispatches;
DROP TRIGGER webhook_reads ON read_events;
DROP TRIGGER webhook_notifications ON notifications;
DROP FUNCTION spoolcast_webhook_dispatches_updated();
DROP FUNCTION spoolcast_webhook_dispatches_inserted();
DROP FUNCTION spoolcast_webhook_push(push_dispatches);
DROP FUNCTION spoolcast_mask_token(text);
DROP FUNCTION spoolcast_webhook_reads();
DROP FUNCTION spoolcast_webhook_notifications();
DROP FUNCTION spoolcast_webhook_body(text, timestamptz, jsonb);
DROP FUNCTION spoolcast_push_event_type(text);
DROP FUNCTION spoolcast_public_id(timestamptz, bigint);
DROP FUNCTION spoolcast_rfc3339(timestamptz);
DROP TABLE webhook_attempts;
DROP TABLE webhook_deliveries;
DROP TABLE webhook_endpoints;
