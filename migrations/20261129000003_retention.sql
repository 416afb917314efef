-- Retention deletes sent outbox messages by age.
CREATE INDEX outbox_sent_idx ON transactional_outbox (processed_at) WHERE processed_at IS NOT NULL;
