-- The console's sessions end after a time without use (INBOX_CONSOLE_IDLE_TIMEOUT_MS),
-- and each says where and in what it was signed in, for its user's list of
-- sessions. A default of now() is stable: no table rewrite.
ALTER TABLE inbox_console_sessions
    ADD COLUMN last_seen_at TIMESTAMPTZ  NOT NULL DEFAULT now(),
    ADD COLUMN client       VARCHAR(64),
    ADD COLUMN user_agent   VARCHAR(200);

-- A user that ends by itself: `inbox dev`'s on a database it did not create
-- (removed when it stops; expired if it was killed). NULL: for good.
ALTER TABLE inbox_console_users ADD COLUMN expires_at TIMESTAMPTZ;

-- The audit also records the console's sign-ins (failed ones too), sign-outs,
-- sessions ended, and users added, changed and removed, under the user's
-- name. Dropping NOT NULL is a change of the catalog only.
ALTER TABLE inbox_audit
    ADD COLUMN console_user VARCHAR(64),
    ALTER COLUMN from_status DROP NOT NULL,
    ALTER COLUMN attempts DROP NOT NULL,
    DROP CONSTRAINT audit_names_an_event_or_a_message,
    ADD CONSTRAINT audit_names_an_event_a_message_or_a_user
        CHECK ((provider IS NOT NULL AND event_id IS NOT NULL) OR message_id IS NOT NULL OR console_user IS NOT NULL);
CREATE INDEX inbox_audit_console_user_idx ON inbox_audit (console_user, id) WHERE console_user IS NOT NULL;
