-- Reconcile: events fetched from a provider's API carry no signature of ours.
ALTER TABLE webhook_inbox
    ADD COLUMN source VARCHAR(16) NOT NULL DEFAULT 'webhook',
    ALTER COLUMN secret_index DROP NOT NULL,
    ADD CONSTRAINT source_is_known CHECK (source IN ('webhook', 'reconcile')),
    ADD CONSTRAINT webhooks_name_their_secret CHECK (source <> 'webhook' OR secret_index IS NOT NULL);

-- Where each reconciliation stopped; advanced only after what it found committed.
CREATE TABLE reconcile_checkpoints (
    source      VARCHAR(64) PRIMARY KEY,
    checkpoint  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
