-- +goose Up
-- Topics: named sets of users an event can address as a whole. Services
-- manage membership in bulk; users subscribe themselves only to topics an
-- operator marked open. A member's subscribed_at is when its current
-- subscription began: an event reaches the members subscribed when it was
-- accepted, so a member is written by (topic, user_id) order from the
-- primary key, and one who left and came back after the event is not one of
-- its members. Every lock waits at most 5 s.
SET LOCAL lock_timeout = '5s';

CREATE TABLE topics (
    name       text        PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,127}$'),
    open       boolean     NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE topic_members (
    topic         text        NOT NULL REFERENCES topics (name) ON DELETE CASCADE,
    user_id       text        NOT NULL,
    subscribed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, user_id)
);
-- A user's topics, for GET /v1/topics.
CREATE INDEX topic_members_user ON topic_members (user_id, topic);

-- +goose Down
DROP TABLE topic_members;
DROP TABLE topics;
