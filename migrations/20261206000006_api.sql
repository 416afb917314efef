-- The management API (`/api/v1`, served by the console): tokens a machine
-- authenticates with, kept as their SHA-256 only (the token is shown once,
-- when made), each with a console role; revoked, not deleted, so that the
-- audit's names stay meaningful. `last_used_at` is bumped at most once a minute.
CREATE TABLE inbox_api_tokens (
    name         VARCHAR(64)  PRIMARY KEY,
    role         VARCHAR(16)  NOT NULL CHECK (role IN ('viewer', 'operator')),
    token_sha256 BYTEA        NOT NULL UNIQUE,
    created_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    created_by   TEXT         NOT NULL,
    last_used_at TIMESTAMPTZ,
    revoked_at   TIMESTAMPTZ
);

-- A bulk operation the API runs in the background (a requeue, an erasure):
-- what it was asked, its estimate, its progress, how it ended. Whichever
-- console process runs it bumps `updated_at` with each batch; a job `running`
-- not bumped for 30 seconds (its process stopped) is seen as interrupted. DELETE /api/v1/jobs/{id} sets
-- `cancel_requested_at`, which the runner reads between two batches.
CREATE TABLE inbox_api_jobs (
    id                  BIGSERIAL    PRIMARY KEY,
    kind                VARCHAR(16)  NOT NULL,
    params              JSONB        NOT NULL,
    state               VARCHAR(16)  NOT NULL DEFAULT 'running'
                        CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled')),
    estimate            BIGINT       NOT NULL,
    processed           BIGINT       NOT NULL DEFAULT 0,
    result              JSONB,
    error               TEXT,
    created_by          VARCHAR(64)  NOT NULL,
    created_at          TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_at          TIMESTAMPTZ  NOT NULL DEFAULT now(),
    finished_at         TIMESTAMPTZ,
    cancel_requested_at TIMESTAMPTZ
);

-- Tokens made and revoked are audited under the token's name.
ALTER TABLE inbox_audit
    ADD COLUMN api_token VARCHAR(64),
    DROP CONSTRAINT audit_names_what_it_is_about,
    ADD CONSTRAINT audit_names_what_it_is_about
        CHECK ((provider IS NOT NULL AND event_id IS NOT NULL) OR message_id IS NOT NULL OR console_user IS NOT NULL
               OR destination IS NOT NULL OR pause_id IS NOT NULL OR alert_id IS NOT NULL OR api_token IS NOT NULL)
        NOT VALID;
CREATE INDEX inbox_audit_api_token_idx ON inbox_audit (api_token, id) WHERE api_token IS NOT NULL;
