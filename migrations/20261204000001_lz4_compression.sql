-- LZ4 for the large values (the payload, the raw bytes, an outbox message's
-- payload) where the server has it (PostgreSQL 14 or later built with lz4, as
-- the Debian, RDS and Aurora builds are): it compresses several times faster
-- than the default pglz, which was PostgreSQL's top symbol while receive ran.
-- A catalog-only change: values already stored keep pglz until rewritten,
-- new ones get lz4. A server without lz4 keeps pglz: nothing changes.
--
-- The change takes each table's exclusive lock for an instant, once every
-- transaction using the table has ended; receive's claims queue behind it
-- meanwhile. So it waits at most 5 s: behind a long transaction it fails,
-- the whole migration rolls back, and the next run tries again.
DO $$
DECLARE
    lock_timeout_before text := current_setting('lock_timeout');
BEGIN
    IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        PERFORM set_config('lock_timeout', '5s', true);
        ALTER TABLE webhook_inbox ALTER COLUMN payload SET COMPRESSION lz4, ALTER COLUMN raw_body SET COMPRESSION lz4;
        ALTER TABLE webhook_bodies ALTER COLUMN raw_body SET COMPRESSION lz4;
        ALTER TABLE transactional_outbox ALTER COLUMN payload SET COMPRESSION lz4;
        PERFORM set_config('lock_timeout', lock_timeout_before, true);
    END IF;
END $$;
