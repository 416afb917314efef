-- Pausing processing by provider, or by provider and event type (`inbox pause`):
-- receive keeps claiming and answering 200; the worker leaves the scope's
-- events pending, spending no attempt, and marks each one `held_by` the pause
-- the first time it meets it, so that it leaves the worker's queue index and
-- is not walked again on every poll. A resume releases them oldest first, in
-- chunks, behind a frontier (`released_to_*`): the scope's events newer than
-- the frontier stay held, so the scope is taken in receive order.
CREATE TABLE inbox_pauses (
    id             BIGSERIAL    PRIMARY KEY,
    provider       VARCHAR(64)  NOT NULL,
    -- NULL: every type of the provider.
    event_type     VARCHAR(128),
    paused_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    paused_by      TEXT         NOT NULL,
    reason         TEXT         NOT NULL,
    -- The pause is overdue (the PauseOverdue alarm) after this long.
    alarm_after    INTERVAL     NOT NULL DEFAULT interval '4 hours',
    -- Set by `inbox resume`: the held events are being released.
    resuming_at    TIMESTAMPTZ,
    -- The frontier: held events up to here (in receive order) are released.
    released_to_at TIMESTAMPTZ,
    released_to_id VARCHAR(255),
    -- Events released so far by the resume under way.
    released       BIGINT       NOT NULL DEFAULT 0,
    CONSTRAINT one_pause_per_scope UNIQUE NULLS NOT DISTINCT (provider, event_type),
    CONSTRAINT frontier_whole CHECK ((released_to_at IS NULL) = (released_to_id IS NULL))
);

-- Bumped by every release: a worker whose position in the queue predates it
-- starts again from the head, where the released events are.
CREATE TABLE inbox_pause_epoch (
    one   BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
    epoch BIGINT  NOT NULL DEFAULT 0
);
INSERT INTO inbox_pause_epoch DEFAULT VALUES;

-- A catalog-only change: the column is NULL on every row, and the constraint is not checked against them.
ALTER TABLE webhook_inbox
    ADD COLUMN held_by BIGINT,
    ADD CONSTRAINT held_only_while_pending CHECK (held_by IS NULL OR status = 'pending') NOT VALID;

-- The worker's queue: the pending events no pause holds. It replaces
-- webhook_inbox_pending_idx (receive writes one entry per event, as before);
-- on a large inbox, build both beforehand without blocking, and this migration
-- leaves them as they are:
--     CREATE INDEX CONCURRENTLY webhook_inbox_queue_idx ON webhook_inbox (received_at, event_id)
--         WHERE status = 'pending' AND held_by IS NULL;
--     CREATE INDEX CONCURRENTLY webhook_inbox_held_idx ON webhook_inbox (held_by, received_at, event_id)
--         INCLUDE (event_type) WHERE status = 'pending' AND held_by IS NOT NULL;
CREATE INDEX IF NOT EXISTS webhook_inbox_queue_idx ON webhook_inbox (received_at, event_id)
    WHERE status = 'pending' AND held_by IS NULL;
-- The held events, per pause in receive order: what a resume releases and the counts read.
CREATE INDEX IF NOT EXISTS webhook_inbox_held_idx ON webhook_inbox (held_by, received_at, event_id)
    INCLUDE (event_type) WHERE status = 'pending' AND held_by IS NOT NULL;
DROP INDEX IF EXISTS webhook_inbox_pending_idx;

-- Pausing and resuming are audited like a destination's.
ALTER TABLE inbox_audit
    ADD COLUMN pause_id BIGINT,
    ADD COLUMN event_type VARCHAR(128),
    DROP CONSTRAINT audit_names_what_it_is_about,
    ADD CONSTRAINT audit_names_what_it_is_about
        CHECK ((provider IS NOT NULL AND event_id IS NOT NULL) OR message_id IS NOT NULL OR console_user IS NOT NULL
               OR destination IS NOT NULL OR pause_id IS NOT NULL);
CREATE INDEX inbox_audit_pause_idx ON inbox_audit (provider, id) WHERE pause_id IS NOT NULL;
