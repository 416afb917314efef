-- Optional variant: hash-partition webhook_inbox on its key (provider, event_id).
--
-- Apply once, after the migrations in migrations/, when partition-level
-- maintenance (VACUUM, reindex, moving partitions) matters more than a few
-- microseconds per claim:
--     psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f migrations/optional/hash_partitioned_inbox.sql
--
-- Hash partitioning on the key keeps the key unique: every copy of an event
-- hashes to the same partition, whose primary key refuses the duplicate. Expiry
-- stays the batched DELETE of `prune`. Time partitioning (by received_at) is not
-- offered: PostgreSQL requires the partition column in every unique key, so the
-- key would become (provider, event_id, received_at), and a redelivery that
-- lands in another month's partition would be claimed a second time.
BEGIN;

ALTER TABLE webhook_inbox RENAME TO webhook_inbox_unpartitioned;
-- Its key's index keeps its name otherwise, and the new table's would be webhook_inbox_pkey1.
ALTER INDEX webhook_inbox_pkey RENAME TO webhook_inbox_unpartitioned_pkey;

CREATE TABLE webhook_inbox (
    LIKE webhook_inbox_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMPRESSION,
    PRIMARY KEY (provider, event_id)
) PARTITION BY HASH (provider, event_id);

DO $$
BEGIN
    FOR i IN 0..15 LOOP
        EXECUTE format(
            'CREATE TABLE webhook_inbox_p%s PARTITION OF webhook_inbox FOR VALUES WITH (MODULUS 16, REMAINDER %s)', i, i);
    END LOOP;
END $$;

INSERT INTO webhook_inbox SELECT * FROM webhook_inbox_unpartitioned;
DROP TABLE webhook_inbox_unpartitioned;

CREATE INDEX webhook_inbox_queue_idx ON webhook_inbox (received_at, event_id) WHERE status = 'pending' AND held_by IS NULL;
CREATE INDEX webhook_inbox_held_idx ON webhook_inbox (held_by, received_at, event_id) INCLUDE (event_type)
    WHERE status = 'pending' AND held_by IS NOT NULL;
CREATE INDEX webhook_inbox_received_at_idx ON webhook_inbox (received_at);
CREATE INDEX webhook_inbox_body_sha256_idx ON webhook_inbox (body_sha256) WHERE body_sha256 IS NOT NULL;
CREATE INDEX webhook_inbox_failed_idx ON webhook_inbox ((coalesce(processed_at, received_at))) WHERE status = 'failed';
CREATE INDEX webhook_inbox_unhandled_idx ON webhook_inbox (provider, event_type, received_at) WHERE status = 'unhandled';
CREATE INDEX webhook_inbox_ignored_idx ON webhook_inbox (provider, event_type, received_at) WHERE status = 'ignored';
CREATE INDEX webhook_inbox_failed_received_idx ON webhook_inbox (received_at) WHERE status = 'failed';
CREATE INDEX webhook_inbox_event_id_idx ON webhook_inbox ((event_id COLLATE "C"));
CREATE INDEX webhook_inbox_type_received_idx ON webhook_inbox (event_type, received_at);

COMMIT;
