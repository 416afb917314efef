-- The team's own tables. Its migrations keep their history in sqlx's
-- _sqlx_migrations; the inbox keeps its own, so neither refuses the other.
CREATE TABLE invoices (
    invoice_id      VARCHAR(64)  PRIMARY KEY,
    customer_email  VARCHAR(320) NOT NULL,
    amount_due      BIGINT       NOT NULL,
    status          VARCHAR(16)  NOT NULL DEFAULT 'open',
    paid_at         TIMESTAMPTZ,
    -- The Stripe event that marked it paid: a twin event finds it paid already.
    paid_by_event   VARCHAR(255),
    CONSTRAINT invoice_status_is_known CHECK (status IN ('open', 'paid', 'void')),
    CONSTRAINT paid_invoices_say_when CHECK (status <> 'paid' OR paid_at IS NOT NULL)
);

-- Shopify orders paid, once per order: the business key behind the inbox's.
CREATE TABLE shop_orders_paid (
    order_id    BIGINT       PRIMARY KEY,
    total_price NUMERIC(12, 2) NOT NULL,
    currency    VARCHAR(3)   NOT NULL,
    paid_at     TIMESTAMPTZ  NOT NULL DEFAULT now()
);
