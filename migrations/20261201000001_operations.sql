-- Operations: what alarms and operators ask of the inbox.

-- processed_at is when processing ended, failed as well as done: "failed in
-- the last hour" counts events failed by the worker (received long before)
-- and events stored as failed by receive (never processed), without a scan.
CREATE INDEX webhook_inbox_failed_idx ON webhook_inbox ((coalesce(processed_at, received_at))) WHERE status = 'failed';

-- Who put which event back to pending, when and why (`inbox replay`, `inbox requeue`).
CREATE TABLE inbox_audit (
    id          BIGSERIAL    PRIMARY KEY,
    at          TIMESTAMPTZ  NOT NULL DEFAULT now(),
    actor       TEXT         NOT NULL,
    action      VARCHAR(32)  NOT NULL,
    reason      TEXT         NOT NULL,
    provider    VARCHAR(64)  NOT NULL,
    event_id    VARCHAR(255) NOT NULL,
    from_status VARCHAR(16)  NOT NULL,
    attempts    INTEGER      NOT NULL,
    failure_reason TEXT
);
CREATE INDEX inbox_audit_event_idx ON inbox_audit (provider, event_id);

-- Dead relay messages, for the gauge and `inbox outbox --dead`.
CREATE INDEX outbox_dead_idx ON transactional_outbox (id) WHERE dead_at IS NOT NULL;
