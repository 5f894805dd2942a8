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

use std::fmt;
use std::str::FromStr;

use tracing::Span;
use tracing::field::Empty;

use crate::error::InvalidInput;
use crate::store::Lease;

/// Longest `tracestate` kept, in bytes: the W3C recommendation's 512.
pub const MAX_TRACESTATE_LEN: usize = 512;

/// A W3C trace context (`traceparent`, and `tracestate` when there is one),
/// stored with a task at submission.
///
/// ```
/// use taskfence::trace::TraceContext;
/// let cx = TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "congo=t61rcWkgMzE")?;
/// assert_eq!(cx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert!(TraceContext::new("not a traceparent", "").is_err());
/// # Ok::<(), taskfence::error::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
// In its stored form, and checked on the way in like `new`.
#[cfg_attr(feature = "serde", serde(try_from = "String", into = "String"))]
pub struct TraceContext {
    traceparent: String,
    tracestate: String,
}

impl TraceContext {
    /// A context from its two headers; `tracestate` may be empty. A
    /// malformed `traceparent` (not `00-<32 hex>-<16 hex>-<2 hex>` with
    /// non-zero ids) or an oversized or non-printable `tracestate` is
    /// [`InvalidInput`].
    ///
    /// ```
    /// let cx = taskfence::trace::TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "")?;
    /// assert_eq!(cx.tracestate(), "");
    /// # Ok::<(), taskfence::error::InvalidInput>(())
    /// ```
    pub fn new(traceparent: &str, tracestate: &str) -> Result<Self, InvalidInput> {
        let bad = || {
            InvalidInput::Inconsistent("traceparent must be 00-<32 hex>-<16 hex>-<2 hex> with non-zero ids")
        };
        let parts: Vec<&str> = traceparent.split('-').collect();
        let hex =
            |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
        let valid = parts.len() == 4
            && parts[0] == "00"
            && hex(parts[1], 32)
            && nonzero(parts[1])
            && hex(parts[2], 16)
            && nonzero(parts[2])
            && hex(parts[3], 2);
        if !valid {
            return Err(bad());
        }
        if tracestate.len() > MAX_TRACESTATE_LEN || !tracestate.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(InvalidInput::Inconsistent(
                "tracestate must be at most 512 bytes of printable ASCII",
            ));
        }
        Ok(Self {
            traceparent: traceparent.to_owned(),
            tracestate: tracestate.to_owned(),
        })
    }

    /// The `traceparent` header.
    ///
    /// ```
    /// # let cx = taskfence::trace::TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "").unwrap();
    /// assert!(cx.traceparent().starts_with("00-4bf92f"));
    /// ```
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` header (empty when there was none).
    ///
    /// ```
    /// # let cx = taskfence::trace::TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "a=1").unwrap();
    /// assert_eq!(cx.tracestate(), "a=1");
    /// ```
    pub fn tracestate(&self) -> &str {
        &self.tracestate
    }

    /// The trace id, 32 lowercase hex digits.
    ///
    /// ```
    /// # let cx = taskfence::trace::TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "").unwrap();
    /// assert_eq!(cx.trace_id().len(), 32);
    /// ```
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The submitting span's id, 16 lowercase hex digits.
    ///
    /// ```
    /// # let cx = taskfence::trace::TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "").unwrap();
    /// assert_eq!(cx.span_id(), "00f067aa0ba902b7");
    /// ```
    pub fn span_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// The trace flags (bit 0: sampled).
    ///
    /// ```
    /// # let cx = taskfence::trace::TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "").unwrap();
    /// assert_eq!(cx.flags(), 1);
    /// ```
    pub fn flags(&self) -> u8 {
        u8::from_str_radix(&self.traceparent[53..55], 16).expect("validated hex")
    }
}

/// The stored form: `traceparent`, then `;` and `tracestate` when there is
/// one (a `traceparent` never holds a `;`, so the first one splits them).
impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.traceparent)?;
        if !self.tracestate.is_empty() {
            write!(f, ";{}", self.tracestate)?;
        }
        Ok(())
    }
}

impl FromStr for TraceContext {
    type Err = InvalidInput;

    /// Reads the stored form back (see [`Display`](fmt::Display)).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (traceparent, tracestate) = s.split_once(';').unwrap_or((s, ""));
        Self::new(traceparent, tracestate)
    }
}

impl TryFrom<String> for TraceContext {
    type Error = InvalidInput;

    fn try_from(stored: String) -> Result<Self, Self::Error> {
        stored.parse()
    }
}

impl From<TraceContext> for String {
    fn from(cx: TraceContext) -> Self {
        cx.to_string()
    }
}

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
