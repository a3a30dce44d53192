-- +goose Up
-- One row per notification key ever claimed: the source of truth for "is this
-- new?". INSERT ... ON CONFLICT DO NOTHING RETURNING on this table is the claim.
-- key is derived per recipient from the producer, the producer's key and the
-- recipient; request_hash is the SHA-256 of the producer's canonical request, so
-- a reused key with another request is told apart from a retry.
CREATE TABLE idempotency_keys (
    key          text PRIMARY KEY,
    claimed_at   timestamptz NOT NULL DEFAULT now(),
    request_hash bytea
);

-- +goose Down
DROP TABLE idempotency_keys;
