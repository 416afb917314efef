-- Processing: attempts and backoff on the inbox, and the outbox.

ALTER TABLE webhook_inbox
    ADD COLUMN attempts        INTEGER     NOT NULL DEFAULT 0,
    -- NULL: due now. A transient failure pushes it out with exponential backoff.
    ADD COLUMN next_attempt_at TIMESTAMPTZ,
    ADD CONSTRAINT attempts_not_negative CHECK (attempts >= 0),
    -- Workers hold row locks instead of a 'processing' status: nothing to reap.
    DROP CONSTRAINT status_is_known,
    ADD CONSTRAINT status_is_known CHECK (status IN ('pending', 'done', 'failed'));

-- The queue in receive order; event_id breaks ties (a Marqeta batch shares one received_at).
DROP INDEX webhook_inbox_pending_idx;
CREATE INDEX webhook_inbox_pending_idx ON webhook_inbox (received_at, event_id) WHERE status = 'pending';

-- Side effects to publish, written in the same transaction as the state change.
CREATE TABLE transactional_outbox (
    id              BIGSERIAL    PRIMARY KEY,
    aggregate_type  VARCHAR(64)  NOT NULL,
    aggregate_id    VARCHAR(128) NOT NULL,
    payload         JSONB        NOT NULL,
    created_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    processed_at    TIMESTAMPTZ,
    -- Stable, derived from the event: consumers deduplicate on it (Idempotency-Key).
    message_key     VARCHAR(512) NOT NULL,
    attempts        INTEGER      NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ,
    last_error      TEXT,
    CONSTRAINT message_key_is_unique UNIQUE (message_key)
);

CREATE INDEX outbox_unprocessed_idx ON transactional_outbox (id) WHERE processed_at IS NULL;
