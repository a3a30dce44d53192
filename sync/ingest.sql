-- Ingest one batch in one statement (one implicit transaction). One input row
-- per recipient: $1 is its notification key, $2 the index of its event in the
-- batch, $3 the event's request hash, $14 the event's own key.
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::int4[], $3::bytea[], $4::text[], $5::timestamptz[], $6::text[],
                $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[],
                $14::text[])
         WITH ORDINALITY
         AS t(key, ev, hash, user_id, received_at, type, category, title, body, data, producer, producer_key, run_id, event_key, ord)
),
events AS (
    SELECT DISTINCT ON (event_key) event_key, hash FROM input ORDER BY event_key, ev
),
-- Claim each event's key with its request hash, or read the hash of the request
-- that claimed it first. The no-op update locks an existing row, so a racing
-- claim waits for the winner's commit and then sees the winner's hash. Keys are
-- taken in key order so that concurrent batches cannot deadlock.
event_claims AS (
    INSERT INTO idempotency_keys (key, request_hash)
    SELECT event_key, hash FROM events ORDER BY event_key
    ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key
    RETURNING key, request_hash
),
-- An event whose key was claimed by another request is a conflict: none of its
-- recipients is written.
conflicted AS (
    SELECT DISTINCT i.ev
    FROM input i
    JOIN event_claims c ON c.key = i.event_key
    WHERE c.request_hash IS DISTINCT FROM i.hash
),
-- Claim first: one key per recipient. RETURNING gives only the keys this
-- statement inserted, so a re-sent event writes nothing.
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
    -- The payload is a count, a hint to read; never the rows' ids, which are
    -- assigned before commit and so do not arrive in order.
    -- $16 turns the wake-up off for a caller that sends its own.
    (SELECT pg_notify($15, count(*)::text) FROM queued HAVING count(*) > 0 AND $16::bool);
