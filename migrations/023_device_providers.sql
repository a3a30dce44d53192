-- +goose Up
-- Channels: each device names the provider that reaches it. Expo tokens and
-- Web Push subscriptions were told apart by their shape; APNs device tokens
-- (hex) and FCM registration tokens are opaque, so the provider is stored.
-- Every lock waits at most 5 s.
SET LOCAL lock_timeout = '5s';

-- A constant default: no rewrite of the table (the UPDATE below rewrites
-- only the browsers' rows).
ALTER TABLE devices ADD COLUMN provider text NOT NULL DEFAULT 'expo';
UPDATE devices SET provider = 'webpush' WHERE endpoint IS NOT NULL;
-- As in 013: the check holds for new rows at once, then is validated on
-- the old ones in the same transaction.
ALTER TABLE devices ADD CONSTRAINT devices_provider_check CHECK (
    (provider = 'webpush') = (platform = 'web')
    AND (provider <> 'apns' OR platform = 'ios')
    AND provider ~ '^[a-z][a-z0-9_]{0,31}$') NOT VALID;
ALTER TABLE devices VALIDATE CONSTRAINT devices_provider_check;

-- Replicas of the version before keep serving while the rest roll out, and
-- their registrations name no provider: a browser's subscription (with its
-- endpoint) is Web Push's, whatever the statement said.
-- +goose StatementBegin
CREATE FUNCTION devices_webpush_provider() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.endpoint IS NOT NULL THEN
        NEW.provider := 'webpush';
    END IF;
    RETURN NEW;
END $$;
-- +goose StatementEnd
CREATE TRIGGER devices_webpush_provider BEFORE INSERT OR UPDATE OF endpoint, provider ON devices
    FOR EACH ROW EXECUTE FUNCTION devices_webpush_provider();

-- +goose Down
SET LOCAL lock_timeout = '5s';
DELETE FROM devices WHERE provider NOT IN ('expo', 'webpush');
DROP TRIGGER devices_webpush_provider ON devices;
DROP FUNCTION devices_webpush_provider();
ALTER TABLE devices DROP COLUMN provider;
