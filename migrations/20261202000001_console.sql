-- The console (`inbox console`, `/console` in `inbox dev`): who may sign in,
-- as what, and the sessions signed in. A password is kept only as its
-- Argon2id hash (a PHC string), a session only as the SHA-256 of its token.
CREATE TABLE inbox_console_users (
    name          VARCHAR(64)  PRIMARY KEY,
    password_hash TEXT         NOT NULL,
    role          VARCHAR(16)  NOT NULL,
    created_at    TIMESTAMPTZ  NOT NULL DEFAULT now(),
    CONSTRAINT role_is_known CHECK (role IN ('viewer', 'operator'))
);

CREATE TABLE inbox_console_sessions (
    token_sha256 BYTEA        PRIMARY KEY,
    user_name    VARCHAR(64)  NOT NULL REFERENCES inbox_console_users (name) ON DELETE CASCADE,
    -- The session's CSRF token, which every form that acts carries back.
    csrf         TEXT         NOT NULL,
    created_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    expires_at   TIMESTAMPTZ  NOT NULL
);
CREATE INDEX inbox_console_sessions_user_idx ON inbox_console_sessions (user_name);

-- The audit also records retries of outbox messages (`inbox outbox retry`,
-- the console): the message, and the event whose handler wrote it where
-- there is one (a message enqueued outside a handler names none). Dropping
-- NOT NULL is a change of the catalog only.
ALTER TABLE inbox_audit
    ADD COLUMN message_id BIGINT,
    ALTER COLUMN provider DROP NOT NULL,
    ALTER COLUMN event_id DROP NOT NULL,
    ADD CONSTRAINT audit_names_an_event_or_a_message
        CHECK ((provider IS NOT NULL AND event_id IS NOT NULL) OR message_id IS NOT NULL);
