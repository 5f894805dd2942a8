-- taskfence 0008: the submitter's trace context, for the worker's trace.
--
-- Run with `search_path` set to taskfence's schema, as 0001.
--
-- The W3C `traceparent` (and `;tracestate`) of the span that submitted the
-- task, so the worker's `process` span joins the request's trace. Nullable,
-- no default: adding it rewrites nothing.
ALTER TABLE tasks ADD COLUMN trace_context text;
