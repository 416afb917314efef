-- An event that no handler takes ends 'unhandled', not 'done': nothing ran for
-- it. Retention keeps it as long as a done row, and a handler deployed later is
-- replayed over it (`inbox requeue --status unhandled --provider ... --type ...`).
ALTER TABLE webhook_inbox
    DROP CONSTRAINT status_is_known,
    ADD CONSTRAINT status_is_known CHECK (status IN ('pending', 'done', 'failed', 'unhandled')),
    DROP CONSTRAINT processed_at_set_when_done,
    ADD CONSTRAINT processed_at_set_when_finished CHECK (status NOT IN ('done', 'unhandled') OR processed_at IS NOT NULL);

-- A backfill's selection: one provider's unhandled events of one type, in receive order.
CREATE INDEX webhook_inbox_unhandled_idx ON webhook_inbox (provider, event_type, received_at) WHERE status = 'unhandled';
