//! [`Observed`]: a store wrapper that counts and times every call on the
//! [`metrics`](https://docs.rs/metrics) facade and opens one documented
//! `tracing` span per call — the numbers and traces an operator alerts and
//! debugs on, without touching the backend.
//!
//! Wrap any [`TaskStore`] (and, when it is one, its [`Inspect`]); install
//! the recorder of your choice (Prometheus, StatsD, OpenTelemetry…) in the
//! application. With no recorder installed, recording costs next to nothing.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
//! use std::time::Duration;
//! use taskfence::metrics::Observed;
//! use taskfence::*;
//!
//! taskfence::metrics::describe(); // HELP texts and units for the exporter
//! let store = Observed::new(MemoryStore::new());
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
//! | `taskfence_operations_total` | counter | `operation`, `outcome`, `reason` (when there is one) | one per call; for `claim_many` and `complete_many`, one per task in the batch (see [Outcomes](#outcomes)) |
//! | `taskfence_operation_duration_seconds` | histogram | `operation` | wall-clock latency of each call as the caller saw it (one sample per call, batches included), errors included |
//! | `taskfence_tasks_failed_total` | counter | `via` (`fail`, `claim`), `reason` (`permanent`, `ambiguous`, `attempts_exhausted`, `deadline_exhausted`, `other`) | tasks seen turning terminally failed (see [Terminal failures](#terminal-failures)) |
//! | `taskfence_tasks_redispatched_total` | counter | `source` (`due`, `stranded`) | task ids handed to a re-dispatch loop: the ids [`due`](TaskStore::due) returned, the tasks [`stranded`](Inspect::stranded) returned, the tasks `Observed<PgStore>::dispatch_due` published. A task stays due until claimed, so one loop pass after another may count it again |
//! | `taskfence_tasks_retried_total` | counter | — | tasks reopened by an accepted [`retry`](TaskStore::retry) |
//! | `taskfence_tasks_purged_total` | counter | — | tasks removed by [`purge_expired`](TaskStore::purge_expired) (the sum of its counts) |
//!
//! ## Outcomes
//!
//! `operation` is the [`TaskStore`] or [`Inspect`] method's name (`submit`,
//! `get`, `find`, `claim`, `claim_many`, `renew`, `complete`,
//! `complete_many`, `fail`, `release`, `cancel`, `record_operation`,
//! `attempts`, `retry`, `due`, `purge_expired`, `list`, `counts`, `story`,
//! `stranded`, and `dispatch_due` on PostgreSQL). `outcome` and `reason`:
//!
//! | operation | outcome | reason |
//! | --- | --- | --- |
//! | `submit` | `created`, `existing` | — |
//! | `get`, `find`, `story` | `found`, `absent` | — |
//! | `claim`, each task of `claim_many` | `acquired`, `completed`, `busy`, `backoff`, `failed`, `cancelled`, `not_found` | — |
//! | `renew`, `complete`, each lease of `complete_many`, `release`, `cancel`, `record_operation`, `retry` | `accepted` | — |
//! | `fail` | `accepted` | `scheduled` (a retry is planned), `exhausted` (terminally failed) |
//! | any fenced write (the row above, and `fail`) | `rejected` | `already_completed`, `superseded`, `lease_expired`, `not_running`, `not_terminal` |
//! | `attempts`, `due`, `purge_expired`, `list`, `counts`, `stranded`, `dispatch_due` | `ok` | — |
//! | any | `error` | `not_found`, `invalid_input`, `key_conflict`, `storage` |
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
//!   [`Retry::Exhausted`]: exactly once per task that a failure report made
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
//!
//! Each counted failure also logs a `WARN` event "task failed terminally"
//! with `task_id`, `scope`, `operation`, `key`, `via` and `reason`.
//!
//! `PgStore::dispatch_due` reads `due` inside the store: call it through
//! `Observed<PgStore>::dispatch_due` (feature `postgres`), which counts the
//! tasks it *published* under `source="due"` and the call under
//! `operation="dispatch_due"`.
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
//! | `batch` | how many tasks: asked for in a `claim_many` / `complete_many`, returned by `due` / `stranded`, removed by `purge_expired`, published by `dispatch_due` |
//! | `outcome`, `reason` | as in [`taskfence_operations_total`](#outcomes); `ok` for a batch answered item by item |
//!
//! The backends' own `DEBUG` spans named `taskfence` (field `op`) open
//! inside these ones, as children.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tracing::field::{Empty, display};
use tracing::{Instrument, Span};

use crate::error::Error;
use crate::inspect::{Counts, Inspect, Page, Story, TaskQuery};
use crate::policy::{Failure, StopReason};
use crate::store::{
    Attempt, Claim, ClaimRequest, Fenced, Lease, Rejection, Result, Retry, RetryRequest, Submitted, TaskStore,
};
use crate::task::{NewTask, RequestKey, Response, Task, TaskId};

/// The counter of calls by operation, outcome and reason.
pub const OPERATIONS_TOTAL: &str = "taskfence_operations_total";
/// The histogram of call latency in seconds, by operation.
pub const OPERATION_DURATION_SECONDS: &str = "taskfence_operation_duration_seconds";
/// The counter of tasks seen failing terminally, by `via` and `reason`.
pub const TASKS_FAILED_TOTAL: &str = "taskfence_tasks_failed_total";
/// The counter of task ids handed to a re-dispatch loop, by `source`.
pub const TASKS_REDISPATCHED_TOTAL: &str = "taskfence_tasks_redispatched_total";
/// The counter of tasks reopened by an accepted retry.
pub const TASKS_RETRIED_TOTAL: &str = "taskfence_tasks_retried_total";
/// The counter of tasks purged after their retention.
pub const TASKS_PURGED_TOTAL: &str = "taskfence_tasks_purged_total";

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
        "task ids handed to a re-dispatch loop, by source (due, stranded)"
    );
    describe_counter!(
        TASKS_RETRIED_TOTAL,
        Unit::Count,
        "tasks reopened by an operator's retry"
    );
    describe_counter!(
        TASKS_PURGED_TOTAL,
        Unit::Count,
        "tasks purged after their retention"
    );
}

/// A [`TaskStore`] (and [`Inspect`], when the wrapped store is one) that
/// forwards every call to the wrapped store unchanged and records its
/// metrics and span (see the [module documentation](self)).
///
/// Cheap to clone (an `Arc`). Wraps a concrete store or a trait object:
/// `Observed<dyn TaskStore>` from an `Arc<dyn TaskStore>`.
///
/// ```
/// use std::sync::Arc;
/// use taskfence::metrics::Observed;
/// use taskfence::{MemoryStore, TaskStore};
///
/// let concrete: Observed<MemoryStore> = Observed::new(MemoryStore::new());
/// let shared: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
/// let erased: Arc<dyn TaskStore> = Arc::new(Observed::from_arc(shared));
/// ```
pub struct Observed<S: ?Sized> {
    inner: Arc<S>,
}

impl<S> Observed<S> {
    /// Wraps `store`.
    ///
    /// ```
    /// let store = taskfence::metrics::Observed::new(taskfence::MemoryStore::new());
    /// ```
    pub fn new(store: S) -> Self {
        Self {
            inner: Arc::new(store),
        }
    }
}

impl<S: ?Sized> Observed<S> {
    /// Wraps a shared store (possibly a trait object).
    ///
    /// ```
    /// use std::sync::Arc;
    /// let inner: Arc<dyn taskfence::inspect::Inspect> = Arc::new(taskfence::MemoryStore::new());
    /// let store = taskfence::metrics::Observed::from_arc(inner);
    /// ```
    pub fn from_arc(store: Arc<S>) -> Self {
        Self { inner: store }
    }

    /// The wrapped store: calls made on it directly are not recorded.
    ///
    /// ```
    /// let store = taskfence::metrics::Observed::new(taskfence::MemoryStore::new());
    /// assert_eq!(store.inner().record_count(), 0);
    /// ```
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }
}

impl<S: ?Sized> Clone for Observed<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: ?Sized> fmt::Debug for Observed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observed").finish_non_exhaustive()
    }
}

/// The span of one call: a fixed name per operation (span names are
/// static), every field declared up front and recorded as it becomes known.
macro_rules! op_span {
    ($name:literal) => {
        tracing::info_span!(
            $name,
            task_id = Empty,
            version = Empty,
            attempt = Empty,
            scope = Empty,
            operation = Empty,
            batch = Empty,
            outcome = Empty,
            reason = Empty,
        )
    };
}

/// One call being observed: its operation name, span and start instant.
struct Call {
    op: &'static str,
    span: Span,
    start: Instant,
}

impl Call {
    fn new(op: &'static str, span: Span) -> Self {
        Self {
            op,
            span,
            start: Instant::now(),
        }
    }

    fn id(self, id: TaskId) -> Self {
        self.span.record("task_id", display(id));
        self
    }

    fn task(&self, task: &Task) {
        self.span.record("task_id", display(task.id));
        self.span.record("version", task.version);
        self.span.record("attempt", task.attempts());
        self.span.record("scope", task.key.scope.as_str());
        self.span.record("operation", task.key.operation.as_str());
    }

    fn lease(self, lease: &Lease) -> Self {
        self.task(lease.task());
        self
    }

    fn batch(self, n: usize) -> Self {
        self.span.record("batch", n);
        self
    }

    /// Runs the forwarded call inside the span.
    async fn run<T>(&self, call: impl Future<Output = T>) -> T {
        call.instrument(self.span.clone()).await
    }

    /// Records the latency sample and the call's outcome on the span.
    fn finish(&self, outcome: &'static str, reason: Option<&'static str>) {
        ::metrics::histogram!(OPERATION_DURATION_SECONDS, "operation" => self.op)
            .record(self.start.elapsed().as_secs_f64());
        self.span.record("outcome", outcome);
        if let Some(reason) = reason {
            self.span.record("reason", reason);
        }
    }

    /// Counts one outcome of this operation.
    fn count(&self, outcome: &'static str, reason: Option<&'static str>) {
        count(self.op, outcome, reason);
    }

    /// Counts and finishes a call with a single outcome.
    fn done(&self, outcome: &'static str, reason: Option<&'static str>) {
        self.count(outcome, reason);
        self.finish(outcome, reason);
    }

    /// Finishes a call that ended in `Err`.
    fn error(&self, error: &Error) {
        self.done("error", Some(error_reason(error)));
    }

    /// Records a fenced write's result whose acceptance carries no reason.
    fn settled<T>(&self, result: &Result<Fenced<T>>) {
        match result {
            Ok(fenced) => self.fenced(fenced, |_| None),
            Err(e) => self.error(e),
        }
    }

    /// Finishes a fenced write by its answer; `accepted` gives the reason
    /// of an accepted one (none but `fail`'s).
    fn fenced<T>(&self, fenced: &Fenced<T>, accepted: impl FnOnce(&T) -> Option<&'static str>) {
        match fenced {
            Fenced::Accepted(v) => self.done("accepted", accepted(v)),
            Fenced::Rejected(r) => self.done("rejected", Some(rejection_reason(r))),
        }
    }

    /// Finishes a plain call: `ok`, or the error.
    fn plain<T>(&self, result: &Result<T>) {
        match result {
            Ok(_) => self.done("ok", None),
            Err(e) => self.error(e),
        }
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

fn error_reason(error: &Error) -> &'static str {
    error.label()
}

fn rejection_reason(rejection: &Rejection) -> &'static str {
    match rejection {
        Rejection::AlreadyCompleted(_) => "already_completed",
        Rejection::Superseded { .. } => "superseded",
        Rejection::LeaseExpired => "lease_expired",
        Rejection::NotRunning(_) => "not_running",
        Rejection::NotTerminal(_) => "not_terminal",
    }
}

fn claim_outcome(claim: &Claim) -> &'static str {
    match claim {
        Claim::Acquired(_) => "acquired",
        Claim::Completed(_) => "completed",
        Claim::Busy { .. } => "busy",
        Claim::Backoff { .. } => "backoff",
        Claim::Failed(_) => "failed",
        Claim::Cancelled(_) => "cancelled",
        Claim::NotFound => "not_found",
    }
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

/// Counts what a claim answer says beyond its outcome (a budget spent at a claim).
fn observe_claim(claim: &Claim) {
    if let Claim::Failed(task) = claim
        && let Some(reason) = claim_stop_reason(task)
    {
        terminal_failure(task, "claim", reason);
    }
}

fn redispatched(source: &'static str, n: usize) {
    ::metrics::counter!(TASKS_REDISPATCHED_TOTAL, "source" => source).increment(n as u64);
}

#[async_trait]
impl<S: TaskStore + ?Sized> TaskStore for Observed<S> {
    async fn submit(&self, task: NewTask) -> Result<Submitted> {
        let call = Call::new("submit", op_span!("taskfence.submit"));
        call.span.record("scope", task.key.scope.as_str());
        call.span.record("operation", task.key.operation.as_str());
        let result = call.run(self.inner.submit(task)).await;
        match &result {
            Ok(submitted) => {
                call.task(submitted.task());
                call.done(
                    if submitted.is_created() {
                        "created"
                    } else {
                        "existing"
                    },
                    None,
                );
            }
            Err(e) => call.error(e),
        }
        result
    }

    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        let call = Call::new("get", op_span!("taskfence.get")).id(id);
        let result = call.run(self.inner.get(id)).await;
        match &result {
            Ok(Some(task)) => {
                call.task(task);
                call.done("found", None);
            }
            Ok(None) => call.done("absent", None),
            Err(e) => call.error(e),
        }
        result
    }

    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        let call = Call::new("find", op_span!("taskfence.find"));
        call.span.record("scope", key.scope.as_str());
        call.span.record("operation", key.operation.as_str());
        let result = call.run(self.inner.find(key)).await;
        match &result {
            Ok(Some(task)) => {
                call.task(task);
                call.done("found", None);
            }
            Ok(None) => call.done("absent", None),
            Err(e) => call.error(e),
        }
        result
    }

    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        let call = Call::new("claim", op_span!("taskfence.claim")).id(id);
        let result = call.run(self.inner.claim(id, request)).await;
        match &result {
            Ok(claim) => {
                match claim {
                    Claim::Acquired(lease) => call.task(lease.task()),
                    Claim::Completed(task) | Claim::Failed(task) | Claim::Cancelled(task) => call.task(task),
                    Claim::Busy { .. } | Claim::Backoff { .. } | Claim::NotFound => {}
                }
                call.done(claim_outcome(claim), None);
                let _entered = call.span.enter();
                observe_claim(claim);
            }
            Err(e) => call.error(e),
        }
        result
    }

    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        let call = Call::new("renew", op_span!("taskfence.renew")).lease(lease);
        let result = call.run(self.inner.renew(lease, extend_by)).await;
        call.settled(&result);
        result
    }

    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        let call = Call::new("complete", op_span!("taskfence.complete")).lease(&lease);
        let result = call.run(self.inner.complete(lease, response)).await;
        call.settled(&result);
        result
    }

    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        let call = Call::new("fail", op_span!("taskfence.fail")).lease(&lease);
        let result = call.run(self.inner.fail(lease, failure)).await;
        match &result {
            Ok(fenced) => {
                call.fenced(fenced, |retry| match retry {
                    Retry::Scheduled { .. } => Some("scheduled"),
                    Retry::Exhausted(_) => Some("exhausted"),
                });
                if let Fenced::Accepted(Retry::Exhausted(task)) = fenced {
                    let _entered = call.span.enter();
                    terminal_failure(task, "fail", stop_reason(task));
                }
            }
            Err(e) => call.error(e),
        }
        result
    }

    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        let call = Call::new("release", op_span!("taskfence.release")).lease(&lease);
        let result = call.run(self.inner.release(lease)).await;
        call.settled(&result);
        result
    }

    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        let call = Call::new("cancel", op_span!("taskfence.cancel")).id(id);
        let result = call.run(self.inner.cancel(id, reason)).await;
        match &result {
            Ok(fenced) => {
                if let Fenced::Accepted(task) = fenced {
                    call.task(task);
                }
                call.fenced(fenced, |_| None);
            }
            Err(e) => call.error(e),
        }
        result
    }

    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        let call = Call::new("record_operation", op_span!("taskfence.record_operation")).lease(lease);
        let result = call.run(self.inner.record_operation(lease, operation_id)).await;
        call.settled(&result);
        result
    }

    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        let call = Call::new("attempts", op_span!("taskfence.attempts")).id(id);
        let result = call.run(self.inner.attempts(id)).await;
        call.plain(&result);
        result
    }

    async fn retry(&self, id: TaskId, request: RetryRequest) -> Result<Fenced<Task>> {
        let call = Call::new("retry", op_span!("taskfence.retry")).id(id);
        let result = call.run(self.inner.retry(id, request)).await;
        match &result {
            Ok(fenced) => {
                if let Fenced::Accepted(task) = fenced {
                    call.task(task);
                    ::metrics::counter!(TASKS_RETRIED_TOTAL).increment(1);
                }
                call.fenced(fenced, |_| None);
            }
            Err(e) => call.error(e),
        }
        result
    }

    async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
        let call = Call::new("due", op_span!("taskfence.due"));
        let result = call.run(self.inner.due(limit)).await;
        call.plain(&result);
        if let Ok(ids) = &result {
            call.span.record("batch", ids.len());
            redispatched("due", ids.len());
        }
        result
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        let call = Call::new("purge_expired", op_span!("taskfence.purge_expired"));
        let result = call.run(self.inner.purge_expired(limit)).await;
        call.plain(&result);
        if let Ok(n) = result {
            call.span.record("batch", n);
            ::metrics::counter!(TASKS_PURGED_TOTAL).increment(n);
        }
        result
    }

    async fn claim_many(&self, ids: &[TaskId], request: ClaimRequest) -> Result<Vec<Claim>> {
        let call = Call::new("claim_many", op_span!("taskfence.claim_many")).batch(ids.len());
        let result = call.run(self.inner.claim_many(ids, request)).await;
        match &result {
            Ok(claims) => {
                let _entered = call.span.enter();
                for claim in claims {
                    call.count(claim_outcome(claim), None);
                    observe_claim(claim);
                }
                call.finish("ok", None);
            }
            Err(e) => call.error(e),
        }
        result
    }

    async fn complete_many(&self, completions: Vec<(Lease, Response)>) -> Result<Vec<Result<Fenced<Task>>>> {
        let call = Call::new("complete_many", op_span!("taskfence.complete_many")).batch(completions.len());
        let result = call.run(self.inner.complete_many(completions)).await;
        match &result {
            Ok(items) => {
                for item in items {
                    match item {
                        Ok(Fenced::Accepted(_)) => call.count("accepted", None),
                        Ok(Fenced::Rejected(r)) => call.count("rejected", Some(rejection_reason(r))),
                        Err(e) => call.count("error", Some(error_reason(e))),
                    }
                }
                call.finish("ok", None);
            }
            Err(e) => call.error(e),
        }
        result
    }
}

#[cfg(feature = "postgres")]
impl Observed<crate::PgStore> {
    /// [`PgStore::dispatch_due`](crate::PgStore::dispatch_due), observed:
    /// the re-dispatch loop of a PostgreSQL service, whose `due` read
    /// happens inside the store where the wrapper cannot see it otherwise.
    /// Counts `taskfence_operations_total{operation="dispatch_due"}` (`ok`
    /// or the error), its latency, and each task *published* under
    /// `taskfence_tasks_redispatched_total{source="due"}`; its span is
    /// `taskfence.dispatch_due` (`batch`: the tasks published).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// let observed = taskfence::metrics::Observed::new(store);
    /// let round = observed.dispatch_due(100, |task_id| async move { Ok::<(), std::io::Error>(()) }).await?;
    /// println!("re-published {}", round.published.len());
    /// # Ok(()) }
    /// ```
    pub async fn dispatch_due<F, Fut, E>(
        &self,
        limit: usize,
        publish: F,
    ) -> Result<crate::postgres::Dispatched<E>>
    where
        F: FnMut(TaskId) -> Fut + Send,
        Fut: Future<Output = std::result::Result<(), E>> + Send,
        E: Send,
    {
        let call = Call::new("dispatch_due", op_span!("taskfence.dispatch_due"));
        let result = call.run(self.inner.dispatch_due(limit, publish)).await;
        call.plain(&result);
        if let Ok(round) = &result {
            call.span.record("batch", round.published.len());
            redispatched("due", round.published.len());
        }
        result
    }
}

#[async_trait]
impl<S: Inspect + ?Sized> Inspect for Observed<S> {
    async fn list(&self, query: &TaskQuery) -> Result<Page> {
        let call = Call::new("list", op_span!("taskfence.list"));
        let result = call.run(self.inner.list(query)).await;
        call.plain(&result);
        result
    }

    async fn counts(&self, scope: Option<&str>) -> Result<Counts> {
        let call = Call::new("counts", op_span!("taskfence.counts"));
        if let Some(scope) = scope {
            call.span.record("scope", scope);
        }
        let result = call.run(self.inner.counts(scope)).await;
        call.plain(&result);
        result
    }

    async fn story(&self, id: TaskId) -> Result<Option<Story>> {
        let call = Call::new("story", op_span!("taskfence.story")).id(id);
        let result = call.run(self.inner.story(id)).await;
        match &result {
            Ok(Some(story)) => {
                call.task(&story.task);
                call.done("found", None);
            }
            Ok(None) => call.done("absent", None),
            Err(e) => call.error(e),
        }
        result
    }

    async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<Task>> {
        let call = Call::new("stranded", op_span!("taskfence.stranded"));
        let result = call.run(self.inner.stranded(older_than, limit)).await;
        call.plain(&result);
        if let Ok(tasks) = &result {
            call.span.record("batch", tasks.len());
            redispatched("stranded", tasks.len());
        }
        result
    }
}
