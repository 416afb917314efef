-- Which event's handler wrote an outbox message (`Event::enqueue`), so that
-- an event's page shows the messages it produced and their delivery state.
-- Empty for a message enqueued outside a handler, and for those written before.
-- Adding the columns is a change of the catalog only (no default, no rewrite).
ALTER TABLE transactional_outbox
    ADD COLUMN event_provider VARCHAR(64),
    ADD COLUMN event_id       VARCHAR(255);
CREATE INDEX IF NOT EXISTS outbox_event_idx ON transactional_outbox (event_provider, event_id)
    WHERE event_id IS NOT NULL;
