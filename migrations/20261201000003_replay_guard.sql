-- A provider whose event id (or type) is read from a header its signature does
-- not cover (Shopify's webhook id, GitHub's delivery id, Linear, Razorpay,
-- WooCommerce, Twilio; a signed timestamp only narrows the window), is also deduplicated on
-- the signed bytes, with the event's type (one body may come under several
-- topics): a captured delivery sent again under another id finds its digest
-- here and is a duplicate (counted as a suspected replay), not a new event.
-- A row is kept while the inbox row it names is (see `prune`).
CREATE TABLE webhook_replay_guard (
    provider TEXT NOT NULL,
    sha256   BYTEA NOT NULL,
    event_id TEXT NOT NULL,
    seen_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, sha256)
);

CREATE INDEX webhook_replay_guard_seen_at_idx ON webhook_replay_guard (seen_at);
