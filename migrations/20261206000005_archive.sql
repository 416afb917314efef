-- Restore (`inbox restore`): an event put back from prune's archive keeps
-- every column as it was and says when it came back. Prune counts a restored
-- event's retention from then as well as from when it was received, so that a
-- year-old event restored for a new handler is not deleted (and archived
-- again) by prune's next pass.
ALTER TABLE webhook_inbox ADD COLUMN restored_at TIMESTAMPTZ;
