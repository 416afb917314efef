-- Deliveries per provider and minute, as receive answered them: new events,
-- duplicates, and refusals (a signature, credentials or timestamp that does
-- not hold, a body too large). Each receive instance counts in memory and adds
-- its counts here now and then (every 10 s in a long-running server, at most
-- once a minute on Lambda), in one statement: never a write per delivery.
-- The console's health page reads it; the counts of the last 7 days are kept.
CREATE TABLE inbox_receive_minutes (
    provider   VARCHAR(64) NOT NULL,
    minute     TIMESTAMPTZ NOT NULL,
    received   BIGINT      NOT NULL DEFAULT 0,
    duplicates BIGINT      NOT NULL DEFAULT 0,
    rejected   BIGINT      NOT NULL DEFAULT 0,
    PRIMARY KEY (provider, minute)
);
CREATE INDEX inbox_receive_minutes_minute_idx ON inbox_receive_minutes (minute);
