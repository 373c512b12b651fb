-- The trace context of the span that enqueued an entry (a W3C carrier as JSON:
-- traceparent, tracestate), when OpenTelemetry is on (shared/sluice/core/trace.py):
-- every send attempt of the entry joins that trace and links to that span. NULL when off.
ALTER TABLE delivery_queue ADD COLUMN trace_context text NULL;
