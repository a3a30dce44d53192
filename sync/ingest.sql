-- Ingest one batch in one statement (one implicit transaction). One input row
-- per recipient: $1 is its notification key, $2 the index of its event in the
-- batch, $3 the event's request hash.
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::int4[], $3::bytea[], $4::text[], $5::timestamptz[], $6::text[],
                $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[])
         WITH ORDINALITY
         AS t(key, ev, hash, user_id, received_at, type, category, title, body, data, producer, producer_key, run_id, ord)
),
-- An event any of whose keys was claimed before with another request is a
-- conflict: none of its recipients is written.
conflicted AS (
    SELECT DISTINCT i.ev
    FROM input i
    JOIN idempotency_keys k ON k.key = i.key
    WHERE k.request_hash IS DISTINCT FROM i.hash
),
-- Claim first. Keys are inserted in key order so that concurrent batches lock
-- them in the same order and cannot deadlock. RETURNING gives only the keys
-- this statement inserted.
claimed AS (
    INSERT INTO idempotency_keys (key, request_hash)
    SELECT key, hash FROM input
    WHERE ev NOT IN (SELECT ev FROM conflicted)
    ORDER BY key
    ON CONFLICT DO NOTHING
    RETURNING key
),
inserted AS (
    INSERT INTO notifications (user_id, received_at, type, category, title, body, data, producer, idempotency_key, notification_key, run_id)
    SELECT i.user_id, i.received_at, i.type, i.category, i.title, i.body, i.data::jsonb, i.producer, i.producer_key, i.key, NULLIF(i.run_id, '')
    FROM input i
    JOIN claimed c ON c.key = i.key
    ORDER BY i.ord
    RETURNING id, user_id, category, notification_key
),
queued AS (
    INSERT INTO push_queue (notification_id, user_id, category)
    SELECT id, user_id, category FROM inserted
    RETURNING notification_id
)
SELECT
    coalesce((SELECT array_agg(i.ev) FROM inserted n JOIN input i ON i.key = n.notification_key), '{}'),
    coalesce((SELECT array_agg(ev) FROM conflicted), '{}'),
    -- One wake-up per transaction at most, only when something was inserted.
    (SELECT pg_notify($14, max(notification_id)::text) FROM queued HAVING count(*) > 0);
