-- An event an ignore rule matches (INBOX_RULES_FILE) ends 'ignored': claimed,
-- so a redelivery stays a duplicate, and processed by nothing. Retention keeps
-- it as long as a done row; `inbox requeue --status ignored` runs it after all.
--
-- As in 20261201000002_unhandled.sql: each constraint only widens the one it
-- replaces and is added NOT VALID (no scan). On a large inbox, build the index
-- beforehand without blocking, and this migration leaves it as it is:
--     CREATE INDEX CONCURRENTLY webhook_inbox_ignored_idx ON webhook_inbox (provider, event_type, received_at)
--         WHERE status = 'ignored';
ALTER TABLE webhook_inbox
    DROP CONSTRAINT status_is_known,
    ADD CONSTRAINT status_is_known CHECK (status IN ('pending', 'done', 'failed', 'unhandled', 'ignored')) NOT VALID,
    DROP CONSTRAINT processed_at_set_when_finished,
    ADD CONSTRAINT processed_at_set_when_finished
        CHECK (status NOT IN ('done', 'unhandled', 'ignored') OR processed_at IS NOT NULL) NOT VALID;

-- The listings' and a requeue's selection of one provider's ignored events, in receive order.
CREATE INDEX IF NOT EXISTS webhook_inbox_ignored_idx ON webhook_inbox (provider, event_type, received_at)
    WHERE status = 'ignored';
