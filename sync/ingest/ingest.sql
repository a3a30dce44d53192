-- Ingest one batch in one statement (one implicit transaction).
--
-- Events come once each: $1..$11 and $14..$17 hold one element per event,
-- and an event's number is its position there (1-based). Recipients come as
-- pairs: $12 the number of the recipient's event, $13 its user id. Title,
-- body and data are sent and parsed once per event, however many recipients
-- it has.
WITH ev AS (
    SELECT event_key, hash, producer, producer_key, received_at, type, category,
           title, body, data::jsonb AS data, run_id, send_at, priority, digest_key,
           digest_window::interval AS digest_window, ev
    FROM unnest($1::text[], $2::bytea[], $3::text[], $4::text[], $5::timestamptz[], $6::text[],
                $7::text[], $8::text[], $9::text[], $10::text[], $11::text[],
                $14::timestamptz[], $15::text[], $16::text[], $17::text[])
         WITH ORDINALITY
         AS t(event_key, hash, producer, producer_key, received_at, type, category, title, body, data, run_id,
              send_at, priority, digest_key, digest_window, ev)
),
-- One row per recipient, with its notification key derived here, as
-- sync.NotificationKey does: length-prefixed producer and key, then the user.
rcpt AS (
    SELECT r.ev, r.user_id, r.ord,
           octet_length(e.producer) || ':' || e.producer || ':' ||
           octet_length(e.producer_key) || ':' || e.producer_key || ':' || r.user_id AS key
    FROM unnest($12::int8[], $13::text[]) WITH ORDINALITY AS r(ev, user_id, ord)
    JOIN ev e ON e.ev = r.ev
),
-- Claim each event's key with its request hash, or read the hash of the request
-- that claimed it first. The no-op update locks an existing row, so a racing
-- claim waits for the winner's commit and then sees the winner's hash. Keys are
-- taken in key order so that concurrent batches cannot deadlock.
event_claims AS (
    INSERT INTO idempotency_keys (key, request_hash, claimed_at)
    SELECT event_key, hash, greatest(now(), send_at) FROM ev ORDER BY event_key
    ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key
    RETURNING key, request_hash
),
-- An event whose key was claimed by another request is a conflict: none of its
-- recipients is written.
conflicted AS (
    SELECT e.ev
    FROM ev e
    JOIN event_claims c ON c.key = e.event_key
    WHERE c.request_hash IS DISTINCT FROM e.hash
),
-- A scheduled event's keys count as claimed at send_at (greatest ignores a
-- NULL), so they outlive the key window after it fires and a retry before
-- or after send_at stays a duplicate.
-- Claim first: one key per recipient. RETURNING gives only the keys this
-- statement inserted, so a re-sent event writes nothing.
claimed AS (
    INSERT INTO idempotency_keys (key, request_hash, claimed_at)
    SELECT r.key, e.hash, greatest(now(), e.send_at)
    FROM rcpt r JOIN ev e ON e.ev = r.ev
    WHERE r.ev NOT IN (SELECT ev FROM conflicted)
    ORDER BY r.key
    ON CONFLICT DO NOTHING
    RETURNING key
),
-- The notifications the claims made new, numbered here so that the feed row
-- and its push work are written from the same rows, without reading the
-- insert back. created_at is the default, now(): the transaction's start, in
-- both tables alike.
new AS MATERIALIZED (
    SELECT nextval('notification_ids') AS id, r.user_id, r.key, e.*
    FROM rcpt r
    JOIN claimed c ON c.key = r.key
    JOIN ev e ON e.ev = r.ev
    ORDER BY r.ord
),
-- A scheduled event's notifications wait in scheduled_notifications until
-- send_at (schedule.Firer moves them); the others exist at once.
scheduled AS (
    INSERT INTO scheduled_notifications (id, send_at, user_id, received_at, type, category, title, body, data, producer,
                                         idempotency_key, notification_key, run_id, priority, digest_key, digest_window)
    SELECT id, send_at, user_id, received_at, type, category, title, body, data, producer,
           producer_key, key, NULLIF(run_id, ''), priority, digest_key, digest_window
    FROM new WHERE send_at IS NOT NULL
),
inserted AS (
    INSERT INTO notifications (id, user_id, received_at, type, category, title, body, data, producer, idempotency_key, notification_key, run_id)
    SELECT id, user_id, received_at, type, category, title, body, data, producer, producer_key, key, NULLIF(run_id, '')
    FROM new WHERE send_at IS NULL
),
queued AS (
    INSERT INTO push_queue (notification_id, notification_created_at, user_id, category, priority, digest_key, digest_window)
    SELECT id, now(), user_id, category, priority, digest_key, digest_window
    FROM new WHERE send_at IS NULL
),
-- Each (event, topic) of an accepted event becomes one fan-out job, its
-- members found and written later (topics.Fanout). An event whose key was
-- conflicted adds none, and one sent again adds none: its jobs exist. Its
-- members are those subscribed when the event was first received, never
-- later than now.
fanouts AS (
    INSERT INTO topic_fanouts (topic, producer, idempotency_key, hash, accepted_at, due_at, received_at, type, category,
                               title, body, data, run_id, priority, digest_key, digest_window)
    SELECT t.topic, e.producer, e.producer_key, e.hash, least(coalesce(e.received_at, now()), now()),
           coalesce(e.send_at, least(coalesce(e.received_at, now()), now())), e.received_at, e.type, e.category,
           e.title, e.body, e.data, NULLIF(e.run_id, ''), e.priority, e.digest_key, e.digest_window
    FROM unnest($18::int8[], $19::text[]) AS t(ev, topic)
    JOIN ev e ON e.ev = t.ev
    WHERE t.ev NOT IN (SELECT ev FROM conflicted)
    ORDER BY e.producer, e.producer_key, t.topic
    ON CONFLICT (producer, idempotency_key, topic) DO NOTHING
    RETURNING producer, idempotency_key
),
fanned AS (
    SELECT DISTINCT e.ev FROM fanouts f JOIN ev e ON e.producer = f.producer AND e.producer_key = f.idempotency_key
)
-- No NOTIFY here: a notifying commit serializes with every other one (see
-- sync.WakeUp); the caller's Waker sends the wake-up after the commit.
SELECT
    coalesce((SELECT array_agg(ev) FROM new), '{}'),
    coalesce((SELECT array_agg(ev) FROM conflicted), '{}'),
    coalesce((SELECT array_agg(ev) FROM fanned), '{}');
