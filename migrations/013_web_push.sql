-- +goose Up
-- Web Push: a browser's subscription is a device of platform 'web'. Its
-- token is WebPush[…], derived from the endpoint (which is a capability to
-- push, kept out of logs and answers); the endpoint and the keys its
-- messages are encrypted to sit beside it. Every lock waits at most 5 s.
SET LOCAL lock_timeout = '5s';

ALTER TABLE devices ADD COLUMN endpoint text, ADD COLUMN p256dh text, ADD COLUMN auth text;
-- The new check holds for new rows at once and is then validated on the old
-- ones; in goose's one transaction the ADD COLUMN's exclusive lock is held
-- through it, so writes to devices wait for that one scan of the table.
ALTER TABLE devices DROP CONSTRAINT devices_platform_check;
ALTER TABLE devices ADD CONSTRAINT devices_platform_check
    CHECK (platform IN ('ios', 'android', 'web') AND (platform = 'web') = (endpoint IS NOT NULL)) NOT VALID;
ALTER TABLE devices VALIDATE CONSTRAINT devices_platform_check;

-- +goose Down
SET LOCAL lock_timeout = '5s';
DELETE FROM devices WHERE platform = 'web';
ALTER TABLE devices DROP CONSTRAINT devices_platform_check;
ALTER TABLE devices ADD CONSTRAINT devices_platform_check CHECK (platform IN ('ios', 'android')) NOT VALID;
ALTER TABLE devices VALIDATE CONSTRAINT devices_platform_check;
ALTER TABLE devices DROP COLUMN auth, DROP COLUMN p256dh, DROP COLUMN endpoint;
