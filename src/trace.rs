//! One `tracing` span per store operation, with the task id, assignment
//! version and attempt id (never payloads or responses), so a task's whole
//! story can be followed across workers in the logs.

use tracing::Span;
use tracing::field::{Empty, display};

use crate::store::Lease;
use crate::task::{AttemptId, TaskId};

/// A span for operation `op`; fields not known yet can be recorded later.
pub(crate) fn op(
    op: &'static str,
    task_id: Option<TaskId>,
    version: Option<u64>,
    attempt_id: Option<AttemptId>,
) -> Span {
    let span = tracing::debug_span!(
        "taskfence",
        op,
        task_id = Empty,
        version = Empty,
        attempt_id = Empty
    );
    if let Some(id) = task_id {
        span.record("task_id", display(id));
    }
    if let Some(v) = version {
        span.record("version", v);
    }
    if let Some(a) = attempt_id {
        span.record("attempt_id", display(a));
    }
    span
}

/// A span for a fenced operation on `lease`.
pub(crate) fn lease_op(op: &'static str, lease: &Lease) -> Span {
    self::op(
        op,
        Some(lease.task_id()),
        Some(lease.version()),
        Some(lease.attempt_id()),
    )
}
