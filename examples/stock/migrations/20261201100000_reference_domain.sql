-- The reference domain: the tables of the stock handlers (webhook_inbox::reference),
-- applied only where that domain is used (the stock binaries, `inbox dev`, the
-- demo, the bench, the fault suite), never by the inbox's own migrations.
-- IF NOT EXISTS: a database migrated by release 0.1.0, whose inbox migrations
-- made these tables, keeps them and their rows.

-- Shopify order snapshots, guarded by the source's version (updated_at).
CREATE TABLE IF NOT EXISTS orders (
    order_id          VARCHAR(128)   PRIMARY KEY,
    customer_id       VARCHAR(128),
    status            VARCHAR(64)    NOT NULL,
    total_amount      NUMERIC(12, 2) NOT NULL,
    source_updated_at TIMESTAMPTZ    NOT NULL
);

-- Stripe payments, keyed by the PaymentIntent: the business-level unique key
-- that makes a twin event (another event id, same PaymentIntent) change nothing.
CREATE TABLE IF NOT EXISTS payments (
    payment_id      VARCHAR(128) PRIMARY KEY,
    amount          BIGINT       NOT NULL,
    currency        VARCHAR(3)   NOT NULL,
    customer_id     VARCHAR(128),
    stripe_event_id VARCHAR(255) NOT NULL,
    created_at      TIMESTAMPTZ  NOT NULL DEFAULT now()
);

-- Balances moved by Marqeta deposits (deltas, never snapshots).
CREATE TABLE IF NOT EXISTS accounts (
    account_id VARCHAR(128)   PRIMARY KEY,
    balance    NUMERIC(14, 2) NOT NULL DEFAULT 0.00,
    updated_at TIMESTAMPTZ    NOT NULL DEFAULT now()
);

-- One row per credited Marqeta transaction token: a deposit is applied once.
CREATE TABLE IF NOT EXISTS account_deposits (
    token       VARCHAR(128)   PRIMARY KEY,
    account_id  VARCHAR(128)   NOT NULL,
    amount      NUMERIC(14, 2) NOT NULL,
    event_id    VARCHAR(255)   NOT NULL,
    credited_at TIMESTAMPTZ    NOT NULL DEFAULT now()
);
