//! Trace context from the request to the worker. A task is submitted inside
//! a request's trace (the HTTP handler's span) and worked on later, in
//! another process, after a queue: without help its trace stops at the
//! submission. taskfence stores the submitter's W3C trace context with the
//! task ([`TraceContext`], `traceparent` and `tracestate`), and the worker
//! runtime runs each task in a `process` span ([`process_span`]) carrying
//! the OpenTelemetry messaging attributes, whose parent is that context on
//! the first attempt and which links to it on a retry or a takeover (a new
//! trace per later attempt, each pointing back to the request).
//!
//! With the feature `opentelemetry` (on `tracing-opentelemetry`), a
//! submission captures the current span's context by itself and the
//! `process` span is joined to it; without it, the context is stored when
//! the caller sets it ([`NewTask::trace_context`](crate::NewTask::trace_context))
//! and the span carries it as the `taskfence.traceparent` field.
//!
//! | `process` span field | value |
//! | --- | --- |
//! | `otel.name` | `process <operation>` |
//! | `otel.kind` | `consumer` |
//! | `messaging.system` | `taskfence` |
//! | `messaging.operation.type`, `messaging.operation.name` | `process` |
//! | `messaging.destination.name` | the task's operation |
//! | `messaging.message.id` | the task id |
//! | `taskfence.version`, `taskfence.attempt` | the assignment version, the attempt number |
//! | `otel.status_code` | `OK` once the response is saved, `ERROR` otherwise |
//! | `error.type` | the failure's kind (`retryable`, `permanent`, `ambiguous`), or `panic`, `lease_lost`, `refused` (the store refused the save), `store_error`, `stopped` (given back at a stop) |

use tracing::Span;
use tracing::field::Empty;

use crate::lease::Lease;

pub use crate::trace_context::{MAX_TRACESTATE_LEN, TraceContext};

/// The span a worker runs one task in (see the [module documentation](self)):
/// the OpenTelemetry messaging attributes, and the task's stored trace
/// context as parent (first attempt) or link (a later one) with the feature
/// `opentelemetry`. The runtime's [`Worker`](crate::runtime::Worker) and
/// [`Consumer`](crate::runtime::Consumer) use it; a hand-written loop can too.
///
/// ```
/// # fn f(lease: &taskfence::Lease) {
/// let span = taskfence::trace::process_span(lease);
/// let _entered = span.enter();
/// // … the work …
/// taskfence::trace::record_ok(&span);
/// # }
/// ```
pub fn process_span(lease: &Lease) -> Span {
    let task = lease.task();
    let span = tracing::info_span!(
        "process",
        otel.name = %format_args!("process {}", task.key.operation),
        otel.kind = "consumer",
        otel.status_code = Empty,
        error.type = Empty,
        messaging.system = "taskfence",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = %task.key.operation,
        messaging.message.id = %task.id,
        taskfence.version = lease.version(),
        taskfence.attempt = lease.attempt(),
        taskfence.traceparent = Empty,
    );
    if let Some(cx) = &task.trace_context {
        span.record("taskfence.traceparent", cx.traceparent());
        #[cfg(feature = "opentelemetry")]
        otel::join(&span, cx, lease.version() <= 1);
    }
    span
}

/// Marks `span` (a [`process_span`]) as a success: the response is saved.
///
/// ```
/// taskfence::trace::record_ok(&tracing::Span::none());
/// ```
pub fn record_ok(span: &Span) {
    span.record("otel.status_code", "OK");
}

/// Marks `span` (a [`process_span`]) as failed with `error_type` (one of
/// the values in the [module documentation](self)).
///
/// ```
/// taskfence::trace::record_error(&tracing::Span::none(), "retryable");
/// ```
pub fn record_error(span: &Span, error_type: &str) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", error_type);
}

/// The current span's trace context, when the `tracing-opentelemetry`
/// layer is installed and the span is in a valid trace: what a submission
/// stores when the caller set none (feature `opentelemetry`).
///
/// ```
/// // No OpenTelemetry layer installed here: no context.
/// assert!(taskfence::trace::current().is_none());
/// ```
#[cfg(feature = "opentelemetry")]
pub fn current() -> Option<TraceContext> {
    otel::current()
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::TraceContext;

    pub(super) fn current() -> Option<TraceContext> {
        let cx = tracing::Span::current().context();
        let span = cx.span();
        let sc = span.span_context();
        if !sc.is_valid() {
            return None;
        }
        let traceparent = format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        );
        TraceContext::new(&traceparent, &sc.trace_state().header()).ok()
    }

    /// Joins `span` to the stored context: as its parent, or by a link.
    pub(super) fn join(span: &tracing::Span, cx: &TraceContext, parent: bool) {
        let (Ok(trace_id), Ok(span_id)) = (TraceId::from_hex(cx.trace_id()), SpanId::from_hex(cx.span_id()))
        else {
            return;
        };
        let state = cx.tracestate().parse::<TraceState>().unwrap_or_default();
        let remote = SpanContext::new(trace_id, span_id, TraceFlags::new(cx.flags()), true, state);
        if parent {
            let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
        } else {
            span.add_link(remote);
        }
    }
}
