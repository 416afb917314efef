-- A team's own table, in a team's own sqlx migrations (its history in _sqlx_migrations).
CREATE TABLE invoices (
    invoice_id VARCHAR(64) PRIMARY KEY,
    status     VARCHAR(16) NOT NULL DEFAULT 'open'
);
