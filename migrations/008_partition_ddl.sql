-- +goose Up
-- Partition DDL that never queues the hot path. CREATE TABLE ... PARTITION OF
-- takes an ACCESS EXCLUSIVE lock on the parent: behind any open reader (a
-- report, pg_dump, a session idle in transaction) it waits, and every ingest,
-- feed read, live read and push claim queues behind it. A new week's partition
-- is now created as a table of its own and attached, which takes only SHARE
-- UPDATE EXCLUSIVE on the parent: it conflicts with no read or write, only
-- with other DDL, ANALYZE and VACUUM of the parent. Its lock waits end after
-- lock_timeout_ms (NULL: the caller's lock_timeout), set like SET LOCAL and
-- restored before it returns, so that nothing outlives the caller's
-- transaction: it works through PgBouncer in transaction mode.
-- +goose StatementBegin
CREATE FUNCTION spoolcast_ensure_week_partition(parent regclass, at timestamptz, lock_timeout_ms integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    start   timestamptz := date_trunc('week', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    name    text := (SELECT relname FROM pg_class WHERE oid = parent) || '_' || to_char(start AT TIME ZONE 'UTC', 'YYYYMMDD');
    callers text := current_setting('lock_timeout');
BEGIN
    IF to_regclass(quote_ident(name)) IS NOT NULL THEN
        RETURN false;
    END IF;
    IF lock_timeout_ms IS NOT NULL THEN
        PERFORM set_config('lock_timeout', greatest(lock_timeout_ms, 1) || 'ms', true);
    END IF;
    BEGIN
        -- Everything a partition made by PARTITION OF would inherit; the
        -- parent's indexes (and foreign keys) are made by ATTACH. Not
        -- INCLUDING IDENTITY: a partition takes its ids from the parent.
        EXECUTE format('CREATE TABLE %I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION)',
                       name, parent);
        EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       parent, name, start, start + interval '7 days');
    EXCEPTION WHEN duplicate_table OR invalid_object_definition THEN
        -- Another caller made it first (the name, or an overlapping range).
        PERFORM set_config('lock_timeout', callers, true);
        RETURN false;
    END;
    PERFORM set_config('lock_timeout', callers, true);
    RETURN true;
END
$$;
-- +goose StatementEnd

-- The two-argument form (migrations 004 and 005, binaries of before this
-- migration) creates the same way, waiting as long as the caller's
-- lock_timeout says.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION spoolcast_ensure_week_partition(parent regclass, at timestamptz) RETURNS boolean
LANGUAGE sql AS $$
    SELECT spoolcast_ensure_week_partition(parent, at, NULL)
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION spoolcast_ensure_week_partition(parent regclass, at timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    start timestamptz := date_trunc('week', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    name  text := (SELECT relname FROM pg_class WHERE oid = parent) || '_' || to_char(start AT TIME ZONE 'UTC', 'YYYYMMDD');
BEGIN
    IF to_regclass(quote_ident(name)) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                   name, parent, start, start + interval '7 days');
    RETURN true;
EXCEPTION WHEN duplicate_table OR invalid_object_definition THEN
    RETURN false;
END
$$;
-- +goose StatementEnd
DROP FUNCTION spoolcast_ensure_week_partition(regclass, timestamptz, integer);
