-- The W3C trace context of the transaction that wrote an outbox row (docs/observability.md):
-- the relay publishes a row minutes later, from another process, and the consumer must still
-- continue the producer's trace. NULL outside a trace (export off, or no active span).
ALTER TABLE outbox_messages
    ADD COLUMN traceparent VARCHAR(55)  NULL,
    ADD COLUMN tracestate  VARCHAR(512) NULL;
