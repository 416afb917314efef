-- OpenTelemetry (inbox serve, with an OTLP endpoint): the W3C traceparent of a
-- delivery's receive span, so that its processing joins the delivery's trace,
-- and of the processing that wrote an outbox message, so that the relay's span
-- (and the consumer's, through the traceparent header) does too. NULL without
-- traces. Nullable, no default: a catalog-only change, on a table of any size.
ALTER TABLE webhook_inbox ADD COLUMN trace_context TEXT;
ALTER TABLE transactional_outbox ADD COLUMN trace_context TEXT;
