-- Hardening of erase, restore and the API's jobs (issue 54).
--
-- A batch's body holds the data of every event it carries, so erasing one of
-- them deletes it: its siblings keep their own payloads but no raw bytes, and
-- `raw_erased_at` says since when (the constraint below only widens the one it
-- replaces, for such rows, and is added NOT VALID: no scan).
ALTER TABLE webhook_inbox
    ADD COLUMN raw_erased_at TIMESTAMPTZ,
    DROP CONSTRAINT raw_bytes_kept_once,
    ADD CONSTRAINT raw_bytes_kept_once
        CHECK (CASE WHEN erased_at IS NULL
                    THEN (raw_body IS NULL) <> (body_sha256 IS NULL)
                         OR (raw_body IS NULL AND body_sha256 IS NULL AND raw_erased_at IS NOT NULL)
                    ELSE raw_body IS NULL AND body_sha256 IS NULL AND payload IS NULL END) NOT VALID;

-- A job counts what it selects itself (not the request that starts it), so its
-- estimate is unknown until then; a cancel records who asked.
ALTER TABLE inbox_api_jobs
    ALTER COLUMN estimate DROP NOT NULL,
    ADD COLUMN cancelled_by VARCHAR(64);
CREATE INDEX inbox_api_jobs_running_idx ON inbox_api_jobs (id) WHERE state = 'running';

-- A job's start, cancel and end are audited under its number.
ALTER TABLE inbox_audit
    ADD COLUMN job_id BIGINT,
    DROP CONSTRAINT audit_names_what_it_is_about,
    ADD CONSTRAINT audit_names_what_it_is_about
        CHECK ((provider IS NOT NULL AND event_id IS NOT NULL) OR message_id IS NOT NULL OR console_user IS NOT NULL
               OR destination IS NOT NULL OR pause_id IS NOT NULL OR alert_id IS NOT NULL OR api_token IS NOT NULL
               OR job_id IS NOT NULL)
        NOT VALID;
CREATE INDEX inbox_audit_job_idx ON inbox_audit (job_id, id) WHERE job_id IS NOT NULL;
