-- A delivery that carries several events (a Marqeta batch) keeps its signed
-- bytes once, here, keyed by their SHA-256; each item's row points at them
-- instead of holding a copy. Re-verify an item with the body it points at.
CREATE TABLE webhook_bodies (
    sha256       BYTEA       PRIMARY KEY,
    raw_body     BYTEA       NOT NULL,
    -- Bumped by every delivery of these bytes: retention keeps recently seen bodies.
    last_seen_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

ALTER TABLE webhook_inbox
    ALTER COLUMN raw_body DROP NOT NULL,
    ADD COLUMN body_sha256 BYTEA,
    ADD CONSTRAINT raw_bytes_kept_once CHECK ((raw_body IS NULL) <> (body_sha256 IS NULL));

-- Retention asks whether any row still points at a body.
CREATE INDEX webhook_inbox_body_sha256_idx ON webhook_inbox (body_sha256) WHERE body_sha256 IS NOT NULL;
