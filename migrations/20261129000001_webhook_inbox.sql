-- The inbox: every delivery lands here first, claimed by its provider's event id.
CREATE TABLE webhook_inbox (
    provider       VARCHAR(64)  NOT NULL,
    event_id       VARCHAR(255) NOT NULL,
    event_type     VARCHAR(128) NOT NULL,
    -- NULL only when the body cannot be jsonb (not JSON, \u0000, ...); then status is 'failed'.
    payload        JSONB,
    status         VARCHAR(16)  NOT NULL DEFAULT 'pending',
    received_at    TIMESTAMPTZ  NOT NULL DEFAULT now(),
    processed_at   TIMESTAMPTZ,
    -- The exact bytes the provider signed, so a stored event can be re-verified.
    raw_body       BYTEA        NOT NULL,
    -- Identifying and signature headers (Shopify event id, topic, triggered-at, ...).
    headers        JSONB        NOT NULL DEFAULT '{}',
    -- Which configured secret verified it (its position in the list, never the secret).
    secret_index   SMALLINT     NOT NULL,
    failure_reason TEXT,
    PRIMARY KEY (provider, event_id),
    CONSTRAINT status_is_known CHECK (status IN ('pending', 'processing', 'done', 'failed')),
    CONSTRAINT payload_present_unless_failed CHECK (payload IS NOT NULL OR status = 'failed'),
    CONSTRAINT failed_rows_say_why CHECK (status <> 'failed' OR failure_reason IS NOT NULL),
    CONSTRAINT processed_at_set_when_done CHECK (status <> 'done' OR processed_at IS NOT NULL),
    CONSTRAINT secret_index_is_a_position CHECK (secret_index >= 0)
);

-- The work queue: only pending rows, in receive order.
CREATE INDEX webhook_inbox_pending_idx ON webhook_inbox (received_at) WHERE status = 'pending';
-- Retention (prune) walks this.
CREATE INDEX webhook_inbox_received_at_idx ON webhook_inbox (received_at);
