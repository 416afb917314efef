-- Erasure (`inbox erase`): an event's personal data gone (its payload, raw
-- bytes, kept headers, failure reason), its key, provider, type, times and
-- status kept, so that a redelivery is still a duplicate; who erased it and
-- when. Each constraint below only widens the one it replaces, for erased
-- rows, and is added NOT VALID (no scan), as in 20261201000002_unhandled.sql.
ALTER TABLE webhook_inbox
    ADD COLUMN erased_at TIMESTAMPTZ,
    ADD COLUMN erased_by TEXT,
    DROP CONSTRAINT payload_present_unless_failed,
    ADD CONSTRAINT payload_present_unless_failed
        CHECK (payload IS NOT NULL OR status = 'failed' OR erased_at IS NOT NULL) NOT VALID,
    DROP CONSTRAINT raw_bytes_kept_once,
    ADD CONSTRAINT raw_bytes_kept_once
        CHECK (CASE WHEN erased_at IS NULL THEN (raw_body IS NULL) <> (body_sha256 IS NULL)
                    ELSE raw_body IS NULL AND body_sha256 IS NULL AND payload IS NULL END) NOT VALID;
