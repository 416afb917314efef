-- Stripe subscriptions as the API has them: customer.subscription.* events are
-- hints, and the handler stores the subscription fetched from
-- GET /v1/subscriptions/{id}, whatever the event's payload said. `version`
-- guards it (larger is newer; for Stripe, when the fetch was asked, in
-- microseconds): an older answer arriving last changes nothing.
CREATE TABLE IF NOT EXISTS subscriptions (
    subscription_id    VARCHAR(255) PRIMARY KEY,
    customer_id        VARCHAR(255),
    status             VARCHAR(64)  NOT NULL,
    current_period_end TIMESTAMPTZ,
    object             JSONB        NOT NULL,
    fetched_at         TIMESTAMPTZ  NOT NULL,
    version            BIGINT       NOT NULL
);
