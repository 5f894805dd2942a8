//! [`Observed`]: a store wrapper that counts and times every call on the
//! [`metrics`](https://docs.rs/metrics) facade and opens one documented
//! `tracing` span per call — the numbers and traces an operator alerts and
//! debugs on, without touching the backend.
//!
//! Wrap any [`TaskStore`] (and, when it is one, its [`Inspect`](crate::inspect::Inspect)) with
//! [`observe`]; install the recorder of your choice (Prometheus, StatsD,
//! OpenTelemetry…) in the application. With no recorder installed,
//! recording costs next to nothing. The wrapper is an
//! [`Intercepted`] store whose interceptor, [`Recorder`], implements only
//! the hook around every call ([`Intercept::around`]): it knows no backend
//! and forwards everything, batches natively.
//!
//! Only calls through the wrapper are observed: operations run on the
//! concrete store it wraps — `PgStore::on(&mut tx)` inside your transaction,
//! `DynamoStore::with(items)` — open their `DEBUG` span but count no metric.
//! Count those yourself where you make them, or make them inside an
//! [`Intercept`] hook of a store this wrapper wraps (a `complete` hook that
//! writes the reply and completes in one transaction), so the wrapper sees
//! the call.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
//! use std::time::Duration;
//! use taskfence::*;
//!
//! taskfence::metrics::describe(); // HELP texts and units for the exporter
//! let store = taskfence::metrics::observe(MemoryStore::new());
//! let task = store.submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]))).await?.into_task();
//! let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await? else {
//!     unreachable!()
//! };
//! // Counts taskfence_operations_total{operation="complete",outcome="accepted"}.
//! assert!(store.complete(lease, Response::from("hi")).await?.is_accepted());
//! # Ok(()) }
//! ```
//!
//! # Metrics
//!
//! Every label value is one of a short fixed list: never a task id, a key,
//! a worker or a message, so the number of series stays small.
//!
//! | name | type | labels | meaning |
//! | --- | --- | --- | --- |
//! | `taskfence_operations_total` | counter | `operation`, `outcome`, `reason` (when there is one) | one per call; for `claim_many`, `complete_many`, `renew_many` and `claim_next`, one per task in the batch (for `claim_next`, one per task handed out) (see [Outcomes](#outcomes)) |
//! | `taskfence_operation_duration_seconds` | histogram | `operation` | wall-clock latency of each call as the caller saw it (one sample per call, batches included), errors included |
//! | `taskfence_tasks_failed_total` | counter | `via` (`fail`, `claim`), `reason` (`permanent`, `ambiguous`, `attempts_exhausted`, `deadline_exhausted`, `other`) | tasks seen turning terminally failed (see [Terminal failures](#terminal-failures)) |
//! | `taskfence_tasks_redispatched_total` | counter | `source` (`due`, `stranded`) | task ids found for publishing again: the ids [`due`](TaskStore::due) returned (a [`republish_due`](crate::republish::republish_due) round reads `due`), the tasks [`stranded`](crate::inspect::Inspect::stranded) returned (an operator's [`redispatch`](crate::dispatch::Outbox::redispatch) starts there). A task stays due until claimed, so one loop pass after another may count it again. (The name predates the words "republish" and "redispatch"; it stays so dashboards keep working.) |
//! | `taskfence_tasks_reopened_total` | counter | — | tasks reopened by an accepted [`reopen`](TaskStore::reopen) |
//! | `taskfence_tasks_purged_total` | counter | — | tasks removed by [`purge_expired`](TaskStore::purge_expired) (the sum of its counts) |
//! | `taskfence_tasks` | gauge | `status`, `scope` (`*` for every scope, or one the [`StateSampler`] names) | tasks in the store, set by [`StateSampler::sample`] |
//! | `taskfence_oldest_pending_age_seconds` | gauge | — | how long ago the oldest pending task was submitted (0: none pending), set by the sampler |
//! | `taskfence_stranded_tasks` | gauge | — | [stranded](crate::inspect::Inspect::stranded) tasks (at most one page), set by the sampler |
//!
//! ## Outcomes
//!
//! `operation` is the [`TaskStore`] or [`Inspect`](crate::inspect::Inspect) method's name (`submit`,
//! `get`, `find`, `claim`, `claim_many`, `claim_next`, `renew`, `renew_many`, `complete`,
//! `complete_many`, `fail`, `release`, `release_unstarted`, `cancel`, `record_operation`,
//! `begin_effect`, `finish_effect`, `effects`, `attempts`, `reopen`, `due`, `purge_expired`, `list`, `counts`, `story`,
//! `stranded`). `outcome` and `reason` are the [`Outcome`] of the answer:
//!
//! | operation | outcome | reason |
//! | --- | --- | --- |
//! | `submit` | `created`, `existing` | — |
//! | `get`, `find`, `story` | `found`, `absent` | — |
//! | `claim`, each task of `claim_many` | `acquired`, `completed`, `busy`, `backoff`, `failed`, `cancelled`, `not_found` | — |
//! | each task `claim_next` handed out | `acquired` | — |
//! | `renew`, each lease of `renew_many`, `complete`, each lease of `complete_many`, `release`, `release_unstarted`, `cancel`, `record_operation`, `finish_effect`, `reopen` | `accepted` | — |
//! | `begin_effect` | `accepted` | `call` (first call), `call_ambiguous` (calling again after an intent with no outcome), `done` (skip: done before), `stop` (ambiguous, the policy stops) |
//! | `fail` | `accepted` | `scheduled` (a retry is planned), `exhausted` (terminally failed) |
//! | any fenced write (the row above, and `fail`) | `rejected` | the [`Rejection::label`](crate::Rejection::label): `already_completed`, `superseded`, `lease_expired`, `not_running`, `not_terminal`, `key_reused` |
//! | `attempts`, `effects`, `due`, `purge_expired`, `list`, `counts`, `stranded` | `ok` | — |
//! | any | `error` | the [`Error::label`](crate::Error::label): `not_found`, `invalid_input`, `key_conflict`, `not_migrated`, `migration`, `item_refused`, `storage` |
//!
//! A batch refused as a whole (bad input, a backend error) counts one
//! `error`; a lease of `complete_many` whose task is gone counts one
//! `error` with `reason="not_found"` and the others count as they went.
//!
//! ## Terminal failures
//!
//! What the wrapper can see is the answer of each call, not the state
//! before it, so:
//!
//! - `via="fail"` counts every [`fail`](TaskStore::fail) answered
//!   [`Retry::Exhausted`](crate::Retry::Exhausted): exactly once per task that a failure report made
//!   terminal (the fenced write is accepted once). The `reason` is read from
//!   the task's `last_error`, which every backend starts with the
//!   [`StopReason`]'s phrase.
//! - `via="claim"` counts claims answered [`Claim::Failed`] for a task whose
//!   budget ran out *at a claim* (its `last_error` is the bare phrase
//!   `attempts exhausted` or `deadline exhausted`, as every backend writes
//!   it then): typically the last worker's lease expired. The answer of the
//!   claim that spent the budget and of a later claim of the same failed
//!   task (a redelivered message) are the same, so a redelivery counts
//!   again: read it as an upper bound. Claims of tasks that failed through
//!   `fail` are not counted here (they were counted once under `via="fail"`).
//!   A task whose budget [`claim_next`](TaskStore::claim_next) found spent
//!   is failed without appearing in its answer, so it is not counted here.
//!
//! Each counted failure also logs a `WARN` event "task failed terminally"
//! with `task_id`, `scope`, `operation`, `key`, `via` and `reason`.
//!
//! # Spans
//!
//! Each call runs inside an `INFO` span named `taskfence.<operation>`
//! (`taskfence.claim`, `taskfence.complete`, `taskfence.claim_many`…), the
//! stable names to filter and trace on. Fields, filled when the call knows
//! them (from the lease's task, the task id asked for, or the task
//! returned):
//!
//! | field | value |
//! | --- | --- |
//! | `task_id` | the task's id |
//! | `version` | the assignment version (the lease's, or the returned task's) |
//! | `attempt` | the attempt number |
//! | `scope`, `operation` | the task's request-key scope and operation (`chat.reply`…) |
//! | `batch` | how many tasks: asked for in a `claim_many` / `complete_many` / `renew_many`, at most in a `claim_next`, returned by `due` / `stranded`, removed by `purge_expired` |
//! | `outcome`, `reason` | as in [`taskfence_operations_total`](#outcomes); `ok` for a batch answered item by item |
//!
//! The `DEBUG` span named `taskfence` (field `op`) that every backend call
//! opens where it enters ([`backend`](crate::backend)) is a child of this one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tracing::field::{Empty, display};
use tracing::{Instrument, Span};

use crate::error::Result;
use crate::intercept::{Call, Intercept, Intercepted, Outcome, Pending};
use crate::policy::StopReason;
use crate::store::{Claim, ClaimRequest, Fenced, Lease, TaskStore};
use crate::task::{Response, Task, TaskId};

mod state;

pub use state::{ALL_SCOPES, State, StateSampler};

/// The counter of calls by operation, outcome and reason.
pub const OPERATIONS_TOTAL: &str = "taskfence_operations_total";
/// The histogram of call latency in seconds, by operation.
pub const OPERATION_DURATION_SECONDS: &str = "taskfence_operation_duration_seconds";
/// The counter of tasks seen failing terminally, by `via` and `reason`.
pub const TASKS_FAILED_TOTAL: &str = "taskfence_tasks_failed_total";
/// The counter of task ids found for publishing again (`due`: republishing; `stranded`: redispatch), by `source`.
pub const TASKS_REDISPATCHED_TOTAL: &str = "taskfence_tasks_redispatched_total";
/// The counter of tasks reopened by an accepted reopening.
pub const TASKS_REOPENED_TOTAL: &str = "taskfence_tasks_reopened_total";
/// The counter of tasks purged after their retention.
pub const TASKS_PURGED_TOTAL: &str = "taskfence_tasks_purged_total";
/// The gauge of tasks by `status` and `scope`, set by the state sampler.
pub const TASKS: &str = "taskfence_tasks";
/// The gauge of the oldest pending task's age in seconds, set by the state sampler.
pub const OLDEST_PENDING_AGE_SECONDS: &str = "taskfence_oldest_pending_age_seconds";
/// The gauge of stranded tasks (pending, handed off, never claimed), set by the state sampler.
pub const STRANDED_TASKS: &str = "taskfence_stranded_tasks";

/// Every metric name taskfence emits, and no other: what the [`Observed`]
/// wrapper records, then the three gauges the state sampler sets ([`TASKS`],
/// [`OLDEST_PENDING_AGE_SECONDS`], [`STRANDED_TASKS`]). The dashboard and
/// alert rules in the repository's `docs/` may name these only (a test
/// checks it), so a rename here is a rename there.
///
/// ```
/// use taskfence::metrics::{NAMES, OPERATIONS_TOTAL, STRANDED_TASKS};
/// assert!(NAMES.contains(&OPERATIONS_TOTAL) && NAMES.contains(&STRANDED_TASKS));
/// assert!(NAMES.iter().all(|name| name.starts_with("taskfence_")));
/// ```
pub const NAMES: [&str; 9] = [
    // The `Observed` wrapper.
    OPERATIONS_TOTAL,
    OPERATION_DURATION_SECONDS,
    TASKS_FAILED_TOTAL,
    TASKS_REDISPATCHED_TOTAL,
    TASKS_REOPENED_TOTAL,
    TASKS_PURGED_TOTAL,
    // The state sampler.
    TASKS,
    OLDEST_PENDING_AGE_SECONDS,
    STRANDED_TASKS,
];

/// Registers every metric's description and unit with the installed
/// recorder, so an exporter prints them (Prometheus' `# HELP`). Call it
/// once after installing the recorder; recording works without it.
///
/// ```
/// taskfence::metrics::describe();
/// ```
pub fn describe() {
    use ::metrics::{Unit, describe_counter, describe_histogram};
    describe_counter!(
        OPERATIONS_TOTAL,
        Unit::Count,
        "taskfence store calls by operation, outcome and reason (batches: one per task)"
    );
    describe_histogram!(
        OPERATION_DURATION_SECONDS,
        Unit::Seconds,
        "taskfence store call latency by operation"
    );
    describe_counter!(
        TASKS_FAILED_TOTAL,
        Unit::Count,
        "tasks seen failing terminally, by via (fail, claim) and reason"
    );
    describe_counter!(
        TASKS_REDISPATCHED_TOTAL,
        Unit::Count,
        "task ids found for publishing again, by source (due, stranded)"
    );
    describe_counter!(TASKS_REOPENED_TOTAL, Unit::Count, "tasks reopened by an operator");
    describe_counter!(
        TASKS_PURGED_TOTAL,
        Unit::Count,
        "tasks purged after their retention"
    );
    ::metrics::describe_gauge!(
        TASKS,
        Unit::Count,
        "tasks in the store by status and scope (\"*\": every scope), set by the state sampler"
    );
    ::metrics::describe_gauge!(
        OLDEST_PENDING_AGE_SECONDS,
        Unit::Seconds,
        "how long ago the oldest pending task was submitted, set by the state sampler"
    );
    ::metrics::describe_gauge!(
        STRANDED_TASKS,
        Unit::Count,
        "pending tasks never claimed past the stranded threshold (at most one page), set by the state sampler"
    );
}

/// A store (and [`Inspect`](crate::inspect::Inspect), when the wrapped store is one) that forwards
/// every call to the wrapped store unchanged and records its metrics and
/// span (see the [module documentation](self)).
///
/// Cheap to clone (an `Arc`). Wraps a concrete store or a trait object:
/// `Observed<dyn TaskStore>` from an `Arc<dyn TaskStore>`.
///
/// ```
/// use std::sync::Arc;
/// use taskfence::metrics::{Observed, Recorder, observe};
/// use taskfence::intercept::Intercepted;
/// use taskfence::{MemoryStore, TaskStore};
///
/// let concrete: Observed<MemoryStore> = observe(MemoryStore::new());
/// let shared: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
/// let erased: Arc<dyn TaskStore> = Arc::new(Intercepted::new(shared, Recorder));
/// ```
pub type Observed<S> = Intercepted<S, Recorder>;

/// Wraps `store` so every call is recorded.
///
/// ```
/// let store = taskfence::metrics::observe(taskfence::MemoryStore::new());
/// assert_eq!(store.inner().record_count(), 0); // calls on the inner store are not recorded
/// ```
pub fn observe<S: TaskStore>(store: S) -> Observed<S> {
    Intercepted::new(Arc::new(store), Recorder)
}

/// The interceptor that records every call's metrics and span: it
/// implements only [`Intercept::around`] (and forwards batches natively).
///
/// ```
/// use std::sync::Arc;
/// let store = taskfence::intercept::Intercepted::new(Arc::new(taskfence::MemoryStore::new()), taskfence::metrics::Recorder);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Recorder;

/// The span of one call: a fixed name per operation (span names are
/// static), every field declared up front and recorded as it becomes known.
macro_rules! op_span {
    ($operation:expr; $($name:literal),* $(,)?) => {
        match $operation {
            $(
                $name => tracing::info_span!(
                    concat!("taskfence.", $name),
                    task_id = Empty,
                    version = Empty,
                    attempt = Empty,
                    scope = Empty,
                    operation = Empty,
                    batch = Empty,
                    outcome = Empty,
                    reason = Empty,
                ),
            )*
            _ => tracing::info_span!(
                "taskfence.other",
                task_id = Empty,
                version = Empty,
                attempt = Empty,
                scope = Empty,
                operation = Empty,
                batch = Empty,
                outcome = Empty,
                reason = Empty,
            ),
        }
    };
}

/// The call's span, with what the call names recorded.
fn call_span(call: &Call) -> Span {
    let span = op_span!(call.operation;
        "submit", "get", "find", "claim", "renew", "complete", "fail", "release", "release_unstarted", "cancel",
        "record_operation", "begin_effect", "finish_effect", "effects", "attempts", "reopen", "due", "purge_expired", "claim_many",
        "complete_many", "claim_next", "renew_many", "list", "counts", "counts_up_to", "story", "stranded",
    );
    if let Some(id) = call.task_id {
        span.record("task_id", display(id));
    }
    if let Some(version) = call.version {
        span.record("version", version);
    }
    if let Some(attempt) = call.attempt {
        span.record("attempt", attempt);
    }
    if let Some(key) = &call.key {
        span.record("scope", key.scope.as_str());
        span.record("operation", key.operation.as_str());
    }
    if let Some(scope) = &call.scope {
        span.record("scope", scope.as_str());
    }
    if let Some(n) = call.batch {
        span.record("batch", n);
    }
    span
}

/// The task an answer carries, on the span.
fn record_task(span: &Span, task: &Task) {
    span.record("task_id", display(task.id));
    span.record("version", task.version);
    span.record("attempt", task.attempts());
    span.record("scope", task.key.scope.as_str());
    span.record("operation", task.key.operation.as_str());
}

#[async_trait]
impl Intercept for Recorder {
    async fn around<'a, T: Outcome + Send + 'a>(&'a self, call: Call, run: Pending<'a, T>) -> Result<T> {
        let op = call.operation;
        let span = call_span(&call);
        let start = Instant::now();
        let answer = run.instrument(span.clone()).await;
        ::metrics::histogram!(OPERATION_DURATION_SECONDS, "operation" => op)
            .record(start.elapsed().as_secs_f64());
        let (outcome, reason) = match &answer {
            // A batch refused as a whole counts one error too.
            Err(e) => {
                count(op, "error", Some(e.label()));
                ("error", Some(e.label()))
            }
            Ok(value) => {
                let summary = value.summary();
                if call.batch.is_some() {
                    value.items(&mut |outcome, reason| count(op, outcome, reason));
                } else {
                    count(op, summary.0, summary.1);
                }
                if let Some(task) = value.task() {
                    record_task(&span, task);
                }
                if let Some(n) = value.count() {
                    span.record("batch", n);
                    match op {
                        "due" => redispatched("due", n),
                        "stranded" => redispatched("stranded", n),
                        "purge_expired" => ::metrics::counter!(TASKS_PURGED_TOTAL).increment(n),
                        _ => {}
                    }
                }
                if op == "reopen" && summary.0 == "accepted" {
                    ::metrics::counter!(TASKS_REOPENED_TOTAL).increment(1);
                }
                let _entered = span.enter();
                value.failed(&mut |task| failed(op, task));
                summary
            }
        };
        span.record("outcome", outcome);
        if let Some(reason) = reason {
            span.record("reason", reason);
        }
        answer
    }

    async fn claim_many(
        &self,
        inner: &dyn TaskStore,
        ids: &[TaskId],
        request: ClaimRequest,
    ) -> Result<Vec<Claim>> {
        inner.claim_many(ids, request).await
    }

    async fn complete_many(
        &self,
        inner: &dyn TaskStore,
        completions: Vec<(Lease, Response)>,
    ) -> Result<Vec<Result<Fenced<Task>>>> {
        inner.complete_many(completions).await
    }

    async fn renew_many(
        &self,
        inner: &dyn TaskStore,
        leases: &mut [Lease],
        extend_by: Duration,
    ) -> Result<Vec<Fenced<()>>> {
        inner.renew_many(leases, extend_by).await
    }
}

fn count(op: &'static str, outcome: &'static str, reason: Option<&'static str>) {
    match reason {
        Some(reason) => {
            ::metrics::counter!(OPERATIONS_TOTAL, "operation" => op, "outcome" => outcome, "reason" => reason)
                .increment(1);
        }
        None => ::metrics::counter!(OPERATIONS_TOTAL, "operation" => op, "outcome" => outcome).increment(1),
    }
}

fn redispatched(source: &'static str, n: u64) {
    ::metrics::counter!(TASKS_REDISPATCHED_TOTAL, "source" => source).increment(n);
}

const STOP_REASONS: [(StopReason, &str); 4] = [
    (StopReason::Permanent, "permanent"),
    (StopReason::Ambiguous, "ambiguous"),
    (StopReason::AttemptsExhausted, "attempts_exhausted"),
    (StopReason::DeadlineExhausted, "deadline_exhausted"),
];

/// The stop reason a terminally failed task's `last_error` starts with.
fn stop_reason(task: &Task) -> &'static str {
    let error = task.last_error.as_deref().unwrap_or_default();
    STOP_REASONS
        .iter()
        .find(|(reason, _)| error.starts_with(reason.as_str()))
        .map_or("other", |(_, label)| label)
}

/// The stop reason of a task whose budget ran out at a claim: its
/// `last_error` is exactly the phrase (no failure message follows).
fn claim_stop_reason(task: &Task) -> Option<&'static str> {
    let error = task.last_error.as_deref()?;
    STOP_REASONS
        .iter()
        .filter(|(reason, _)| {
            matches!(
                reason,
                StopReason::AttemptsExhausted | StopReason::DeadlineExhausted
            )
        })
        .find(|(reason, _)| error == reason.as_str())
        .map(|(_, label)| *label)
}

fn terminal_failure(task: &Task, via: &'static str, reason: &'static str) {
    ::metrics::counter!(TASKS_FAILED_TOTAL, "via" => via, "reason" => reason).increment(1);
    tracing::warn!(
        task_id = %task.id,
        scope = %task.key.scope,
        operation = %task.key.operation,
        key = %task.key.key,
        via,
        reason,
        last_error = task.last_error.as_deref().unwrap_or_default(),
        "task failed terminally"
    );
}

/// Counts a task an answer shows failed terminally: through `fail` (every
/// stop reason), or at a claim that found its budget spent.
fn failed(operation: &'static str, task: &Task) {
    if operation == "fail" {
        terminal_failure(task, "fail", stop_reason(task));
    } else if let Some(reason) = claim_stop_reason(task) {
        terminal_failure(task, "claim", reason);
    }
}
