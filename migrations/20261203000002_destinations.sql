-- Destinations: each outbox message names where it goes (`Message::to`), and
-- may carry an ordering key (`Message::ordered_by`): messages of one key to one
-- destination go one at a time, in the order written. Both columns are a change
-- of the catalog only (a constant default, no rewrite); every message written
-- before goes to `default`, which the RELAY_* variables configure as before.
ALTER TABLE transactional_outbox
    ADD COLUMN destination  VARCHAR(64) NOT NULL DEFAULT 'default',
    ADD COLUMN ordering_key TEXT;

-- A destination's due messages, in id order: what each of the relay's lanes leases.
CREATE INDEX outbox_destination_idx ON transactional_outbox (destination, id)
    WHERE processed_at IS NULL AND dead_at IS NULL;
-- Whether an earlier message of the same key is still on its way.
CREATE INDEX outbox_ordering_idx ON transactional_outbox (destination, ordering_key, id)
    WHERE processed_at IS NULL AND dead_at IS NULL AND ordering_key IS NOT NULL;

-- Each destination's state, shared by every relay process: paused by an
-- operator, or its circuit open after consecutive failures. A row is written
-- by each relay that starts with the destination configured (what it sends
-- to, never a credential), or by an operator pausing one.
CREATE TABLE relay_destinations (
    name          VARCHAR(64) PRIMARY KEY,
    -- What the relay sends to (`http https://billing.internal/hooks`), as the last relay to start said.
    target        TEXT,
    -- When a relay last started with it configured.
    seen_at       TIMESTAMPTZ,
    paused_at     TIMESTAMPTZ,
    paused_by     TEXT,
    pause_reason  TEXT,
    -- Open since (no sends, no attempts spent, until a probe after the cool-down succeeds).
    opened_at     TIMESTAMPTZ,
    -- Consecutive failures that opened it, and the last one's reason.
    failures      INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT
);

-- Pausing and resuming a destination is audited like a requeue.
ALTER TABLE inbox_audit
    ADD COLUMN destination VARCHAR(64),
    DROP CONSTRAINT audit_names_an_event_a_message_or_a_user,
    ADD CONSTRAINT audit_names_what_it_is_about
        CHECK ((provider IS NOT NULL AND event_id IS NOT NULL) OR message_id IS NOT NULL OR console_user IS NOT NULL
               OR destination IS NOT NULL);
CREATE INDEX inbox_audit_destination_idx ON inbox_audit (destination, id) WHERE destination IS NOT NULL;
