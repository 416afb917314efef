-- Alerts with a lifecycle (the `[[alert]]` entries of INBOX_RULES_FILE):
-- each condition that holds opens one alert per scope (a provider, a
-- destination, a pause), updated while it holds and resolved once it has
-- cleared for the rule's resolve_after; if it comes back, a new one opens.
-- Notifications (opened, reminder, resolved) are outbox messages written in
-- the transaction that changes the alert, so none is lost and none is sent
-- twice under its key.
CREATE TABLE inbox_alerts (
    id              BIGSERIAL        PRIMARY KEY,
    -- The [[alert]]'s name, and its condition.
    rule            VARCHAR(128)     NOT NULL,
    condition       VARCHAR(32)      NOT NULL,
    -- What it is about: a provider, a destination, a pause's scope; '' for the whole inbox.
    scope           VARCHAR(256)     NOT NULL DEFAULT '',
    state           VARCHAR(16)      NOT NULL DEFAULT 'open',
    first_seen      TIMESTAMPTZ      NOT NULL DEFAULT now(),
    last_seen       TIMESTAMPTZ      NOT NULL DEFAULT now(),
    -- Evaluations that found it holding.
    seen            INTEGER          NOT NULL DEFAULT 1,
    -- The last measure (a count, or an age in seconds), the highest, and the last evaluation's sentence.
    value           DOUBLE PRECISION NOT NULL,
    peak            DOUBLE PRECISION NOT NULL,
    summary         TEXT             NOT NULL,
    -- Since when it no longer holds.
    cleared_at      TIMESTAMPTZ,
    -- The last notification (a reminder comes remind_every after it), and the reminders sent.
    notified_at     TIMESTAMPTZ      NOT NULL DEFAULT now(),
    reminders       INTEGER          NOT NULL DEFAULT 0,
    acknowledged_at TIMESTAMPTZ,
    acknowledged_by TEXT,
    resolved_at     TIMESTAMPTZ,
    -- Who resolved it: `inbox` when its condition cleared.
    resolved_by     TEXT,
    -- Where its notifications go: the rule's channels when it opened ([{destination, format}]).
    channels        JSONB            NOT NULL DEFAULT '[]',
    CONSTRAINT alert_state_is_known CHECK (state IN ('open', 'acknowledged', 'resolved')),
    CONSTRAINT resolved_when_resolved CHECK ((state = 'resolved') = (resolved_at IS NOT NULL))
);
-- One live alert per rule and scope: a second evaluator cannot open another.
CREATE UNIQUE INDEX inbox_alerts_live_idx ON inbox_alerts (rule, scope) WHERE state <> 'resolved';

-- When the alerts were last evaluated: every process (each serve replica, each
-- Lambda invocation) may try; one evaluation a minute goes ahead.
CREATE TABLE inbox_alert_runs (
    one          BOOLEAN     PRIMARY KEY DEFAULT true CHECK (one),
    evaluated_at TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
);
INSERT INTO inbox_alert_runs DEFAULT VALUES;

-- Acknowledging and resolving by hand are audited.
ALTER TABLE inbox_audit
    ADD COLUMN alert_id BIGINT,
    DROP CONSTRAINT audit_names_what_it_is_about,
    ADD CONSTRAINT audit_names_what_it_is_about
        CHECK ((provider IS NOT NULL AND event_id IS NOT NULL) OR message_id IS NOT NULL OR console_user IS NOT NULL
               OR destination IS NOT NULL OR pause_id IS NOT NULL OR alert_id IS NOT NULL);
CREATE INDEX inbox_audit_alert_idx ON inbox_audit (alert_id, id) WHERE alert_id IS NOT NULL;
