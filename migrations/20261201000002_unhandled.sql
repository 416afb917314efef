-- An event that no handler takes ends 'unhandled', not 'done': nothing ran for
-- it. Retention keeps it as long as a done row, and a handler deployed later is
-- replayed over it (`inbox requeue --status unhandled --provider ... --type ...`).
--
-- On a full inbox this runs under the table's lock, so it is kept short: each
-- new constraint only widens the one it replaces, so the rows already there
-- satisfy it, and it is added NOT VALID (no scan; every new or changed row is
-- checked). The index is built with a scan (receive waits, and may answer 503
-- meanwhile, which providers retry); on a large inbox, build it beforehand
-- without blocking, and this migration leaves it as it is:
--     CREATE INDEX CONCURRENTLY webhook_inbox_unhandled_idx ON webhook_inbox (provider, event_type, received_at)
--         WHERE status = 'unhandled';
ALTER TABLE webhook_inbox
    DROP CONSTRAINT status_is_known,
    ADD CONSTRAINT status_is_known CHECK (status IN ('pending', 'done', 'failed', 'unhandled')) NOT VALID,
    DROP CONSTRAINT processed_at_set_when_done,
    ADD CONSTRAINT processed_at_set_when_finished
        CHECK (status NOT IN ('done', 'unhandled') OR processed_at IS NOT NULL) NOT VALID;

-- A backfill's selection: one provider's unhandled events of one type, in receive order.
CREATE INDEX IF NOT EXISTS webhook_inbox_unhandled_idx ON webhook_inbox (provider, event_type, received_at)
    WHERE status = 'unhandled';
