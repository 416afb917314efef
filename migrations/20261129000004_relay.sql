-- Relay: a message that can never be delivered is dead, with its reason in last_error.
ALTER TABLE transactional_outbox
    ADD COLUMN dead_at TIMESTAMPTZ,
    ADD CONSTRAINT dead_or_sent_not_both CHECK (dead_at IS NULL OR processed_at IS NULL);

DROP INDEX outbox_unprocessed_idx;
CREATE INDEX outbox_unprocessed_idx ON transactional_outbox (id) WHERE processed_at IS NULL AND dead_at IS NULL;
