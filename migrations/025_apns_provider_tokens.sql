-- +goose Up
-- One APNs provider token per signing key for the whole deployment. Apple
-- refuses a key's token renewed more often than every 20 minutes
-- (TooManyProviderTokenUpdates), and one token may serve any number of
-- provider servers: one replica signs it under a lock, every replica reads
-- it. A bearer is good for an hour at most; the row holds the latest.
SET LOCAL lock_timeout = '5s';
CREATE TABLE apns_provider_tokens (
    key_id    text        NOT NULL,
    team_id   text        NOT NULL,
    bearer    text        NOT NULL,
    issued_at timestamptz NOT NULL,
    PRIMARY KEY (key_id, team_id)
);

-- +goose Down
SET LOCAL lock_timeout = '5s';
DROP TABLE apns_provider_tokens;
