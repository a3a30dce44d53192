-- +goose Up
-- Where each timeline of the database's history began: the WAL position at
-- which the promoted standby stopped replaying its parent timeline. A live
-- cursor issued on the parent at or below that position saw nothing the new
-- primary lacks, and resumes there (see pghistory.Continues). Written once
-- per promotion by the first central replica that sees it; a few rows over
-- the database's life.
SET LOCAL lock_timeout = '5s';
CREATE TABLE timeline_switches (
    system_identifier bigint      NOT NULL,
    timeline          integer     NOT NULL,
    parent_ended_at   pg_lsn      NOT NULL,
    seen_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (system_identifier, timeline)
);

-- +goose Down
SET LOCAL lock_timeout = '5s';
DROP TABLE timeline_switches;
