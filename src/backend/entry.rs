//! Where every operation enters a store: its input is checked against the
//! documented [`limits`] (a typed error, nothing written) and its span is
//! opened. The [`TaskStore`](crate::TaskStore) and
//! [`Inspect`](crate::inspect::Inspect) implementations of every
//! [`Backend`](super::Backend), the [`Outbox`](crate::dispatch::Outbox) of
//! every [`OutboxBackend`](super::OutboxBackend), and `PgStore`'s connection handle, enter
//! here, so no backend validates or traces on its own (and none can forget to).
//!
//! The span is `DEBUG`, named `taskfence`, with the operation in `op` and the
//! task id, assignment version and attempt id when the call knows them (never
//! payloads or responses), so a task's whole story can be followed across
//! workers in the logs.

use std::time::Duration;

use tracing::Span;
use tracing::field::{Empty, display};

use crate::effect::EffectOutcome;
use crate::error::InvalidInput;
use crate::inspect::TaskQuery;
use crate::limits;
use crate::policy::Failure;
use crate::store::{ClaimNext, ClaimRequest, Lease, ReopenRequest};
use crate::task::{NewTask, RequestKey, Response, TaskId};
use crate::throttle::{self, RateBucket};

type Checked = Result<Span, InvalidInput>;

/// The span of operation `op`; fields not known yet can be recorded later.
pub(crate) fn span(op: &'static str, task_id: Option<TaskId>) -> Span {
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
    span
}

/// The span of a fenced operation on `lease`.
pub(crate) fn lease_span(op: &'static str, lease: &Lease) -> Span {
    let span = span(op, Some(lease.task_id()));
    span.record("version", lease.version());
    span.record("attempt_id", display(lease.attempt_id()));
    span
}

/// Validates a submission and, with the feature `opentelemetry`, gives it
/// the caller's trace context when it carries none (read here, before the
/// store's own span is entered).
pub(crate) fn submit(task: &mut NewTask) -> Checked {
    task.validate()?;
    #[cfg(feature = "opentelemetry")]
    if task.trace_context.is_none() {
        task.trace_context = crate::trace::current();
    }
    Ok(span("submit", None))
}

pub(crate) fn get(id: TaskId) -> Span {
    span("get", Some(id))
}

pub(crate) fn find(key: &RequestKey) -> Checked {
    key.validate()?;
    Ok(span("find", None))
}

pub(crate) fn claim(id: TaskId, request: &ClaimRequest) -> Checked {
    request.validate()?;
    Ok(span("claim", Some(id)))
}

pub(crate) fn renew(lease: &Lease, extend_by: Duration) -> Checked {
    limits::check_extension(extend_by)?;
    Ok(lease_span("renew", lease))
}

pub(crate) fn complete(lease: &Lease, response: &Response) -> Checked {
    limits::check_response(response)?;
    Ok(lease_span("complete", lease))
}

pub(crate) fn fail(lease: &Lease, failure: &Failure) -> Checked {
    failure.validate()?;
    Ok(lease_span("fail", lease))
}

pub(crate) fn release(lease: &Lease) -> Span {
    lease_span("release", lease)
}

pub(crate) fn release_unstarted(lease: &Lease) -> Span {
    lease_span("release_unstarted", lease)
}

pub(crate) fn cancel(id: TaskId, reason: &str) -> Checked {
    limits::check_reason(reason)?;
    Ok(span("cancel", Some(id)))
}

pub(crate) fn record_operation(lease: &Lease, operation_id: &str) -> Checked {
    limits::check_operation_id(operation_id)?;
    Ok(lease_span("record_operation", lease))
}

pub(crate) fn attempts(id: TaskId) -> Span {
    span("attempts", Some(id))
}

pub(crate) fn begin_effect(lease: &Lease, name: &str) -> Checked {
    limits::check_effect_name(name)?;
    Ok(lease_span("begin_effect", lease))
}

pub(crate) fn finish_effect(lease: &Lease, name: &str, outcome: &EffectOutcome) -> Checked {
    limits::check_effect_name(name)?;
    outcome.validate()?;
    Ok(lease_span("finish_effect", lease))
}

pub(crate) fn effects(id: TaskId) -> Span {
    span("effects", Some(id))
}

pub(crate) fn reopen(id: TaskId, request: &ReopenRequest) -> Checked {
    request.validate()?;
    Ok(span("reopen", Some(id)))
}

pub(crate) fn due(limit: usize) -> Checked {
    limits::check_scan_limit(limit)?;
    Ok(span("due", None))
}

pub(crate) fn purge_expired(limit: usize) -> Checked {
    limits::check_scan_limit(limit)?;
    Ok(span("purge_expired", None))
}

pub(crate) fn dispatch(limit: usize, batch: usize) -> Checked {
    limits::check_scan_limit(limit)?;
    if batch == 0 || batch > limits::MAX_BATCH {
        return Err(InvalidInput::OutOfRange {
            field: "batch",
            value: batch.to_string(),
            min: "1".into(),
            max: limits::MAX_BATCH.to_string(),
        });
    }
    Ok(span("dispatch", None))
}

pub(crate) fn redispatch(ids: &[TaskId]) -> Checked {
    limits::check_batch(ids.iter().copied())?;
    Ok(span("redispatch", None))
}

pub(crate) fn claim_many(ids: &[TaskId], request: &ClaimRequest) -> Checked {
    limits::check_batch(ids.iter().copied())?;
    request.validate()?;
    Ok(span("claim_many", None))
}

pub(crate) fn complete_many(completions: &[(Lease, Response)]) -> Checked {
    limits::check_batch(completions.iter().map(|(lease, _)| lease.task_id()))?;
    completions
        .iter()
        .try_for_each(|(_, response)| limits::check_response(response))?;
    Ok(span("complete_many", None))
}

pub(crate) fn claim_next(request: &ClaimNext) -> Checked {
    request.validate()?;
    Ok(span("claim_next", None))
}

pub(crate) fn renew_many(leases: &[Lease], extend_by: Duration) -> Checked {
    limits::check_batch(leases.iter().map(Lease::task_id))?;
    limits::check_extension(extend_by)?;
    Ok(span("renew_many", None))
}

pub(crate) fn list(query: &TaskQuery) -> Checked {
    query.validate()?;
    Ok(span("list", None))
}

pub(crate) fn counts(scope: Option<&str>) -> Checked {
    if let Some(scope) = scope {
        limits::check_text("scope", scope, limits::MAX_SCOPE_LEN)?;
    }
    Ok(span("counts", None))
}

pub(crate) fn counts_up_to(scope: Option<&str>, cap: u64) -> Checked {
    if let Some(scope) = scope {
        limits::check_text("scope", scope, limits::MAX_SCOPE_LEN)?;
    }
    limits::check_count_cap(cap)?;
    Ok(span("counts_up_to", None))
}

pub(crate) fn story(id: TaskId) -> Span {
    span("story", Some(id))
}

pub(crate) fn stranded(older_than: Duration, limit: usize) -> Checked {
    limits::check_duration("older_than", older_than, limits::MAX_RETENTION)?;
    limits::check_page(limit)?;
    Ok(span("stranded", None))
}

/// Checks a bucket's definition.
pub(crate) fn define_bucket(bucket: &RateBucket) -> Checked {
    bucket.validate()?;
    Ok(span("define_bucket", None))
}

/// Checks a drain: a known-good name and a positive `retry_after` within [`throttle::MAX_DRAIN`].
pub(crate) fn drain_bucket(name: &str, retry_after: Duration) -> Checked {
    limits::check_text("bucket", name, throttle::MAX_NAME_LEN)?;
    limits::check_duration("retry_after", retry_after, throttle::MAX_DRAIN)?;
    Ok(span("drain_bucket", None))
}

/// Checks a concurrency key's name.
pub(crate) fn concurrency(key: &str) -> Checked {
    limits::check_text("concurrency_key", key, throttle::MAX_NAME_LEN)?;
    Ok(span("concurrency", None))
}
