//! The decisions every backend makes, as pure functions of a task snapshot and
//! the store's current instant.
//!
//! [`MemoryStore`](crate::MemoryStore) applies them directly under its lock;
//! the PostgreSQL backend evaluates the same conditions in SQL and uses
//! these functions to classify a refused write from one re-read of the row. A
//! third-party backend can do either, and the
//! [conformance suite](crate::testing) checks that it agrees.

use time::OffsetDateTime;

use super::{Plan, jitter_unit};
use crate::effect::{Effect, EffectOutcome, EffectStart, EffectState};
use crate::error::InvalidInput;
use crate::inspect::TaskSummary;
use crate::policy::{AcceptanceRule, Failure, OnAmbiguous, RetryPolicy, StopReason};
use crate::store::{AttemptOutcome, Claim, ClaimNext, Fenced, Lease, Rejection};
use crate::task::{AttemptId, Status, Task, TaskId};
use crate::throttle::{BucketState, RateBucket, Throttled};

/// What a claim of `task` at `now` must do.
///
/// ```
/// use taskfence::backend::rules::{claim, ClaimRule};
/// # fn f(task: &taskfence::Task) {
/// match claim(task, time::OffsetDateTime::now_utc()) {
///     ClaimRule::Take => { /* new assignment: version + 1, lease from now */ }
///     ClaimRule::Exhaust(reason) => { /* mark Failed, answer Claim::Failed */ }
///     ClaimRule::Answer(claim) => { /* nothing to write */ }
/// }
/// # }
/// ```
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // a short-lived return value, matched at once
pub enum ClaimRule {
    /// Grant a new assignment.
    Take,
    /// The budget is spent: make the task terminally `Failed`, then answer [`Claim::Failed`].
    Exhaust(StopReason),
    /// Write nothing and answer this (completed, failed, cancelled, busy, backoff).
    Answer(Claim),
}

/// Decides a claim (guarantees 6 and 7): done tasks answer with their saved
/// response, live leases and backoffs make the caller wait, a spent budget
/// turns the task terminal, and only then is a new assignment granted.
pub fn claim(task: &Task, now: OffsetDateTime) -> ClaimRule {
    match task.status {
        Status::Completed => return ClaimRule::Answer(Claim::Completed(task.clone())),
        Status::Failed => return ClaimRule::Answer(Claim::Failed(task.clone())),
        Status::Cancelled => return ClaimRule::Answer(Claim::Cancelled(task.clone())),
        Status::Running => {
            if let Some(until) = task.lease_until.filter(|until| *until > now) {
                return ClaimRule::Answer(Claim::Busy { until });
            }
        }
        Status::Pending => {
            if let Some(not_before) = task.not_before.filter(|nb| *nb > now) {
                return ClaimRule::Answer(Claim::Backoff { not_before });
            }
        }
    }
    if task.attempts_in_budget() >= task.policy.max_attempts {
        return ClaimRule::Exhaust(StopReason::AttemptsExhausted);
    }
    if task.deadline_at().is_some_and(|deadline| deadline <= now) {
        return ClaimRule::Exhaust(StopReason::DeadlineExhausted);
    }
    ClaimRule::Take
}

/// Whether `task` counts as stranded at `cutoff` (the store's now less the
/// `older_than` of [`stranded`](crate::inspect::Inspect::stranded)): pending,
/// never claimed, and handed off before the cutoff: submitted, and last
/// reopened, before it. (PostgreSQL's outbox also counts a handoff published
/// since.) A task reopened a moment ago was handed off a moment ago.
///
/// ```
/// # fn f(task: &taskfence::inspect::TaskSummary) {
/// let cutoff = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
/// if taskfence::backend::rules::stranded(task, cutoff) {
///     println!("{} has waited for a worker for over an hour", task.id);
/// }
/// # }
/// ```
pub fn stranded(task: &TaskSummary, cutoff: OffsetDateTime) -> bool {
    task.status == Status::Pending
        && task.version == 0
        && task.created_at < cutoff
        && task.not_before.is_none_or(|reopened| reopened < cutoff)
}

/// Since when `task` has needed a worker, if it needs one at `now`: pending
/// and past its backoff (since the backoff ended, or since submission when
/// it has none), or running with a lease expired at `now` (since the
/// expiry). [`claim_next`](crate::TaskStore::claim_next) hands these out,
/// oldest first (ties by id); [`claim`] then decides each (a spent budget
/// fails the task instead).
///
/// ```
/// use taskfence::backend::rules::due_since;
/// # fn f(task: &taskfence::Task) {
/// if let Some(since) = due_since(task, time::OffsetDateTime::now_utc()) {
///     println!("waiting for a worker since {since}");
/// }
/// # }
/// ```
pub fn due_since(task: &Task, now: OffsetDateTime) -> Option<OffsetDateTime> {
    due(
        task.status,
        task.not_before,
        task.lease_until,
        task.created_at,
        now,
    )
}

/// [`due_since`] of a task's summary (what listings and
/// [`Inspect::depth`](crate::inspect::Inspect::depth) read).
///
/// ```
/// use taskfence::backend::rules::summary_due_since;
/// # fn f(row: &taskfence::inspect::TaskSummary) {
/// let waiting = summary_due_since(row, time::OffsetDateTime::now_utc()).is_some();
/// # }
/// ```
pub fn summary_due_since(task: &TaskSummary, now: OffsetDateTime) -> Option<OffsetDateTime> {
    due(
        task.status,
        task.not_before,
        task.lease_until,
        task.created_at,
        now,
    )
}

fn due(
    status: Status,
    not_before: Option<OffsetDateTime>,
    lease_until: Option<OffsetDateTime>,
    created_at: OffsetDateTime,
    now: OffsetDateTime,
) -> Option<OffsetDateTime> {
    match status {
        Status::Pending => match not_before {
            Some(not_before) => (not_before <= now).then_some(not_before),
            None => Some(created_at),
        },
        Status::Running => lease_until.filter(|until| *until <= now),
        Status::Completed | Status::Failed | Status::Cancelled => None,
    }
}

/// Whether `task` is of the operations and scopes `request` names (an empty
/// list names all).
///
/// ```
/// use std::time::Duration;
/// use taskfence::backend::rules::wanted;
/// # fn f(task: &taskfence::Task) {
/// let any = taskfence::ClaimNext::new("w", Duration::from_secs(30), 8);
/// assert!(wanted(&any, task));
/// # }
/// ```
pub fn wanted(request: &ClaimNext, task: &Task) -> bool {
    (request.operations.is_empty() || request.operations.contains(&task.key.operation))
        && (request.scopes.is_empty() || request.scopes.contains(&task.key.scope))
}

/// A check a write of a lease must pass, given the task, the lease's version
/// and the store's instant: [`fence`] for renew, fail, release (its
/// decision is [`release`]) and
/// record_operation, [`accept`] for a completion. Backends run the same one in
/// the write's guard and when they classify a refused write, with the
/// lease's attempt id compared too ([`check_lease`]).
///
/// ```
/// let checks: [taskfence::backend::rules::LeaseCheck; 2] = [taskfence::backend::rules::fence, taskfence::backend::rules::accept];
/// ```
pub type LeaseCheck = fn(&Task, u64, OffsetDateTime) -> Result<(), Rejection>;

/// The fencing check of renew, complete, fail, release and record_operation
/// (guarantees 1 and 5): the lease's version is current, the task is running,
/// the lease unexpired at `now`. A completed task is reported first, with its
/// saved response, because that is what a late worker most needs to know.
///
/// ```
/// use taskfence::backend::rules::fence;
/// # fn f(task: &taskfence::Task) {
/// if let Err(rejection) = fence(task, 3, time::OffsetDateTime::now_utc()) {
///     eprintln!("refused: {rejection}");
/// }
/// # }
/// ```
pub fn fence(task: &Task, version: u64, now: OffsetDateTime) -> Result<(), Rejection> {
    if task.status == Status::Completed {
        return Err(Rejection::AlreadyCompleted(Box::new(task.clone())));
    }
    if task.version != version {
        return Err(Rejection::Superseded {
            current_version: task.version,
        });
    }
    if task.status != Status::Running {
        return Err(Rejection::NotRunning(task.status));
    }
    if task.lease_until.is_none_or(|until| until <= now) {
        return Err(Rejection::LeaseExpired);
    }
    Ok(())
}

/// A lease's check with its attempt: `check` ([`fence`] or [`accept`]) on
/// the lease's version, then [`granted`] on its attempt id, given
/// `recorded`, the id of the attempt the store recorded at that version
/// (`None`: it recorded none). Every backend whose claim can be undone
/// after it answered (a claim in the caller's transaction, rolled back with
/// it) runs this in the write's guard and when it classifies a refusal.
///
/// ```
/// use taskfence::backend::rules::{check_lease, fence};
/// # fn f(task: &taskfence::Task, lease: &taskfence::Lease) {
/// let now = time::OffsetDateTime::now_utc();
/// // The store recorded another attempt at the lease's version:
/// let other = taskfence::task::AttemptId::new();
/// assert!(check_lease(fence, task, lease, Some(other), now).is_err());
/// # }
/// ```
pub fn check_lease(
    check: LeaseCheck,
    task: &Task,
    lease: &Lease,
    recorded: Option<AttemptId>,
    now: OffsetDateTime,
) -> Result<(), Rejection> {
    check(task, lease.version(), now)?;
    granted(task, lease.attempt_id(), recorded)
}

/// The attempt half of the fence (guarantee 5): the attempt the store
/// recorded at the lease's version must be the lease's own (`attempt`).
///
/// The version alone does not name an assignment once a claim can be
/// undone: a claim in the caller's transaction answers with a lease (version
/// v + 1, attempt A); should that transaction roll back, the task is at v
/// again and the next claim grants v + 1 once more, to attempt B. The lease
/// of A still shows the current version; only its attempt id tells it from
/// B's, and it is refused as superseded.
///
/// ```
/// use taskfence::backend::rules::granted;
/// use taskfence::task::AttemptId;
/// # fn f(task: &taskfence::Task) {
/// let (a, b) = (AttemptId::new(), AttemptId::new());
/// assert!(granted(task, a, Some(a)).is_ok());
/// assert!(granted(task, a, Some(b)).is_err());
/// assert!(granted(task, a, None).is_err());
/// # }
/// ```
pub fn granted(task: &Task, attempt: AttemptId, recorded: Option<AttemptId>) -> Result<(), Rejection> {
    if recorded == Some(attempt) {
        Ok(())
    } else {
        Err(Rejection::Superseded {
            current_version: task.version,
        })
    }
}

/// The check of a completion (guarantees 1 and 5), by the task's
/// [`AcceptanceRule`]: [`fence`] under
/// [`CurrentAssignment`](AcceptanceRule::CurrentAssignment); under
/// [`FirstValidAnswer`](AcceptanceRule::FirstValidAnswer), any attempt that
/// held a lease in the current budget (after the
/// [`budget_base`](Task::budget_base), up to the current version) while no response is saved
/// and the task is not terminal — its own lease may have expired or been
/// taken over. (A claim given back unstarted raises the base: an attempt
/// older than such a claim no longer saves, and the task runs again.)
///
/// ```
/// use taskfence::backend::rules::accept;
/// # fn f(task: &taskfence::Task) {
/// if accept(task, 1, time::OffsetDateTime::now_utc()).is_ok() {
///     /* save the response, complete the task */
/// }
/// # }
/// ```
pub fn accept(task: &Task, version: u64, now: OffsetDateTime) -> Result<(), Rejection> {
    match task.acceptance {
        AcceptanceRule::CurrentAssignment => fence(task, version, now),
        AcceptanceRule::FirstValidAnswer => {
            if task.status == Status::Completed {
                return Err(Rejection::AlreadyCompleted(Box::new(task.clone())));
            }
            if version <= task.budget_base || version > task.version {
                // Not an assignment the store ever granted, or one from
                // before an operator's reopening: an old lease never saves.
                return Err(Rejection::Superseded {
                    current_version: task.version,
                });
            }
            if task.status.is_terminal() {
                return Err(Rejection::NotRunning(task.status));
            }
            Ok(())
        }
    }
}

/// What `failure` of the attempt `attempt` of `task` leads to, before the
/// deadline (which needs the store's clock): the policy's plan for the
/// failure's kind and the attempts spent in the budget, with the failure's
/// own [`retry_after`](crate::Failure::retry_after) in place of the policy's
/// backoff. The jitter draw comes from the attempt id (see [`jitter_unit`]).
///
/// ```
/// use std::time::Duration;
/// use taskfence::backend::{Plan, rules::plan};
/// use taskfence::{Failure, InputHash, NewTask, RequestKey, RetryPolicy, TaskId};
/// let now = time::OffsetDateTime::now_utc();
/// let new = NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"])).policy(RetryPolicy::default().max_attempts(2));
/// let mut task = taskfence::backend::new_task(TaskId::new(), new, now, now + NewTask::DEFAULT_RETENTION);
/// task.version = 1; // the first attempt failed
/// let attempt = taskfence::task::AttemptId::new();
/// let asked = Failure::retryable("429").retry_after(Duration::from_secs(20));
/// assert_eq!(plan(&task, attempt, &asked), Plan::RetryAfter(Duration::from_secs(20)));
/// task.version = 2; // the last attempt failed
/// assert!(matches!(plan(&task, attempt, &asked), Plan::Stop(_)));
/// ```
pub fn plan(task: &Task, attempt: AttemptId, failure: &Failure) -> Plan {
    match task
        .policy
        .plan(failure.kind, task.attempts_in_budget(), jitter_unit(attempt))
    {
        Plan::RetryAfter(backoff) => Plan::RetryAfter(failure.retry_after.unwrap_or(backoff)),
        stop => stop,
    }
}

/// What `failure` of an attempt leads to, given that it passed the fence at
/// `now`: `Ok(not_before)` schedules a retry, `Err(reason)` makes the task
/// `Failed` ([`plan`], then the deadline).
///
/// ```
/// use taskfence::backend::rules::after_failure;
/// use taskfence::task::AttemptId;
/// # fn f(task: &taskfence::Task) {
/// let decision = after_failure(task, AttemptId::new(), &taskfence::Failure::retryable("503"), time::OffsetDateTime::now_utc());
/// # }
/// ```
pub fn after_failure(
    task: &Task,
    attempt: AttemptId,
    failure: &Failure,
    now: OffsetDateTime,
) -> Result<OffsetDateTime, StopReason> {
    match plan(task, attempt, failure) {
        Plan::Stop(reason) => Err(reason),
        Plan::RetryAfter(delay) => {
            let not_before = now + delay;
            if task.deadline_at().is_some_and(|deadline| not_before >= deadline) {
                return Err(StopReason::DeadlineExhausted);
            }
            Ok(not_before)
        }
    }
}

/// Whether the work of a lease given back had begun: what decides if its
/// claim counts against the retry budget.
///
/// ```
/// use taskfence::backend::rules::Work;
/// assert_eq!(Work::NotStarted.refund(), 1);
/// assert_eq!(Work::Started.refund(), 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// The work began ([`release`](crate::TaskStore::release)): the claim
    /// was an attempt, and stays one.
    Started,
    /// The work never began
    /// ([`release_unstarted`](crate::TaskStore::release_unstarted)): the
    /// claim is refunded.
    NotStarted,
}

impl Work {
    /// The attempt outcome a release of this kind records.
    pub const fn outcome(self) -> AttemptOutcome {
        match self {
            Work::Started => AttemptOutcome::Released,
            Work::NotStarted => AttemptOutcome::ReturnedUnstarted,
        }
    }

    /// How much a release of this kind raises the task's
    /// [`budget_base`](Task::budget_base): one for a claim whose work never
    /// began (the version still rose, so fencing is unchanged; the budget,
    /// `version - budget_base`, no longer counts it), none otherwise.
    pub const fn refund(self) -> u64 {
        match self {
            Work::Started => 0,
            Work::NotStarted => 1,
        }
    }
}

/// Decides a release of the assignment `version` of `task` at `now`, and
/// returns the task as the release leaves it: the [`fence`] first (a stale,
/// expired or superseded lease writes nothing and refunds nothing), then
/// pending and due at once, and, when the work never began, the claim
/// refunded ([`Work::refund`]) in the same write. Its attempt ends with
/// [`Work::outcome`].
///
/// Only a holder of the current lease can refund, once: the release ends
/// the assignment, so a repeated release is refused by the fence. A crash or
/// a lease left to expire is never refunded: nothing releases it.
///
/// ```
/// use taskfence::backend::rules::{release, Work};
/// # fn f(task: &taskfence::Task) {
/// let now = time::OffsetDateTime::now_utc();
/// if let Ok(released) = release(task, task.version, now, Work::NotStarted) {
///     assert_eq!(released.attempts_in_budget() + 1, task.attempts_in_budget());
/// }
/// # }
/// ```
pub fn release(task: &Task, version: u64, now: OffsetDateTime, work: Work) -> Result<Task, Rejection> {
    fence(task, version, now)?;
    let mut released = task.clone();
    self::released(&mut released, now);
    released.budget_base = (task.budget_base + work.refund()).min(task.version);
    Ok(released)
}

/// What a cancellation of `task` must do.
///
/// ```
/// use taskfence::backend::rules::{cancel, CancelRule};
/// # fn f(task: &taskfence::Task) {
/// match cancel(task) {
///     CancelRule::Cancel => { /* close the running attempt, mark Cancelled */ }
///     CancelRule::Answer(answer) => { /* nothing to write */ }
/// }
/// # }
/// ```
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // a short-lived return value, matched at once
pub enum CancelRule {
    /// The task is live (pending or running): make it terminally `Cancelled`.
    Cancel,
    /// Write nothing and answer this: a cancelled task is accepted again
    /// (cancelling is idempotent), a completed or failed one is refused.
    Answer(Fenced<Task>),
}

/// Decides a cancellation: only a live task can be cancelled; repeating a
/// cancellation is accepted; a saved response or a terminal failure stands.
pub fn cancel(task: &Task) -> CancelRule {
    match task.status {
        Status::Pending | Status::Running => CancelRule::Cancel,
        Status::Cancelled => CancelRule::Answer(Fenced::Accepted(task.clone())),
        Status::Completed => CancelRule::Answer(Fenced::Rejected(Rejection::AlreadyCompleted(Box::new(
            task.clone(),
        )))),
        Status::Failed => CancelRule::Answer(Fenced::Rejected(Rejection::NotRunning(Status::Failed))),
    }
}

/// What an operator's [`reopen`](crate::TaskStore::reopen) of `task` must do.
///
/// ```
/// use taskfence::backend::rules::{reopen, ReopenRule};
/// # fn f(task: &taskfence::Task) {
/// match reopen(task) {
///     ReopenRule::Reopen => { /* fresh budget from the current version, pending now, record who and why */ }
///     ReopenRule::Answer(rejection) => { /* nothing to write */ }
/// }
/// # }
/// ```
#[derive(Debug)]
pub enum ReopenRule {
    /// The task failed or was cancelled: reopen it with a fresh budget.
    Reopen,
    /// Write nothing and refuse: a saved response stands, a live task needs no reopening.
    Answer(Rejection),
}

/// Decides a reopening: only a terminally failed or cancelled task is reopened.
/// A completed one keeps its response ([`Rejection::AlreadyCompleted`]); a
/// pending or running one is still being worked on ([`Rejection::NotTerminal`]).
pub fn reopen(task: &Task) -> ReopenRule {
    match task.status {
        Status::Failed | Status::Cancelled => ReopenRule::Reopen,
        Status::Completed => ReopenRule::Answer(Rejection::AlreadyCompleted(Box::new(task.clone()))),
        Status::Pending | Status::Running => ReopenRule::Answer(Rejection::NotTerminal(task.status)),
    }
}

/// The task as a [`reopen`] leaves it at `now`: pending and due at once (so
/// [`due`](crate::TaskStore::due) lists it for republishing), a fresh budget
/// from the current version and instant under `policy`, and its retention
/// window restarted: exactly the retention it was submitted with, however
/// often it is reopened. The version, the attempts and the last error stay.
///
/// ```
/// # fn f(task: &mut taskfence::Task) {
/// let policy = task.policy;
/// taskfence::backend::rules::reopened(task, time::OffsetDateTime::now_utc(), policy);
/// assert_eq!(task.status, taskfence::Status::Pending);
/// # }
/// ```
pub fn reopened(task: &mut Task, now: OffsetDateTime, policy: RetryPolicy) {
    // The window last started at the latest reopening (or the submission):
    // that is where the configured retention counts from.
    let retention = task.expires_at - task.budget_started_at;
    task.status = Status::Pending;
    task.lease_until = None;
    task.not_before = Some(now);
    task.finished_at = None;
    task.budget_base = task.version;
    task.budget_started_at = now;
    task.expires_at = now + retention;
    task.policy = policy;
}

/// What a [`begin_effect`](crate::TaskStore::begin_effect) of `lease` must do,
/// once the fence passed.
///
/// ```
/// use taskfence::backend::rules::{begin_effect, BeginEffectRule};
/// # fn f(lease: &taskfence::Lease, recorded: Option<&taskfence::effect::Effect>) {
/// match begin_effect(recorded, lease, "notify-user", time::OffsetDateTime::now_utc()) {
///     BeginEffectRule::Write { effect, start } => { /* store `effect` if the record is still `recorded`, answer `start` */ }
///     BeginEffectRule::Answer(start) => { /* write nothing */ }
/// }
/// # }
/// ```
#[derive(Debug)]
pub enum BeginEffectRule {
    /// Store `effect` in place of the record read (only if that record is
    /// unchanged: same state and version, or still absent), then answer `start`.
    Write {
        /// The record to store.
        effect: Effect,
        /// The answer once it is stored.
        start: EffectStart,
    },
    /// Write nothing and answer this.
    Answer(EffectStart),
}

/// Decides a [`begin_effect`](crate::TaskStore::begin_effect) from the
/// effect's record (`None`: never begun): nothing recorded or a certain
/// failure → record the intent, call; done → skip; this assignment's own
/// intent → call again (the worker knows what its call did); an earlier
/// assignment's intent with no outcome → ambiguous, by the task's
/// [`OnAmbiguous`] policy: record a new intent and call with the same key
/// (counted in [`Effect::ambiguous`]), or stop, writing nothing.
pub fn begin_effect(
    recorded: Option<&Effect>,
    lease: &Lease,
    name: &str,
    now: OffsetDateTime,
) -> BeginEffectRule {
    let version = lease.version();
    let intend = |ambiguous: Option<Box<Effect>>| {
        let mut effect = Effect::intended(lease.task_id(), name, version, lease.attempt(), now);
        if let Some(earlier) = recorded {
            effect.created_at = earlier.created_at;
            effect.ambiguous = earlier.ambiguous + u32::from(ambiguous.is_some());
        }
        let start = EffectStart::Call {
            key: effect.key.clone(),
            ambiguous,
        };
        BeginEffectRule::Write { effect, start }
    };
    let Some(earlier) = recorded else {
        return intend(None);
    };
    match earlier.state {
        EffectState::Done => BeginEffectRule::Answer(EffectStart::Done(Box::new(earlier.clone()))),
        EffectState::Failed => intend(None),
        EffectState::Intended if earlier.version >= version => BeginEffectRule::Answer(EffectStart::Call {
            key: earlier.key.clone(),
            ambiguous: None,
        }),
        EffectState::Intended => match lease.task().policy.on_ambiguous {
            OnAmbiguous::Retry => intend(Some(Box::new(earlier.clone()))),
            OnAmbiguous::Stop => BeginEffectRule::Answer(EffectStart::Stop(Box::new(earlier.clone()))),
        },
    }
}

/// What a [`finish_effect`](crate::TaskStore::finish_effect) of `lease` must
/// do, once the fence passed.
#[derive(Debug)]
pub enum FinishEffectRule {
    /// Store this settled record in place of the intent read (only if that
    /// intent is unchanged), and answer it.
    Write(Effect),
    /// Write nothing and answer this record: the same assignment settled it
    /// already (a repeated call, e.g. after a lost answer), and the first
    /// outcome stands.
    Answer(Effect),
}

/// Decides a [`finish_effect`](crate::TaskStore::finish_effect): only the
/// assignment that recorded the intent settles it, once.
///
/// ```
/// use taskfence::backend::rules::finish_effect;
/// use taskfence::effect::EffectOutcome;
/// use taskfence::error::InvalidInput;
/// # fn f(lease: &taskfence::Lease) {
/// let never_begun = finish_effect(None, lease, "notify-user", &EffectOutcome::done("m-1"), time::OffsetDateTime::now_utc());
/// assert!(matches!(never_begun, Err(InvalidInput::EffectNotBegun { .. })));
/// # }
/// ```
pub fn finish_effect(
    recorded: Option<&Effect>,
    lease: &Lease,
    name: &str,
    outcome: &EffectOutcome,
    now: OffsetDateTime,
) -> Result<FinishEffectRule, InvalidInput> {
    match recorded {
        Some(effect) if effect.version == lease.version() => {
            if effect.state != EffectState::Intended {
                return Ok(FinishEffectRule::Answer(effect.clone()));
            }
            let mut settled = effect.clone();
            outcome.apply(&mut settled, now);
            Ok(FinishEffectRule::Write(settled))
        }
        _ => Err(InvalidInput::EffectNotBegun {
            effect: name.to_owned(),
        }),
    }
}

/// The task as a claim that [`claim`] answered [`ClaimRule::Take`] leaves it:
/// the next assignment (version + 1), running under a lease until
/// `expires_at`, no backoff. Every backend that decides in its own code
/// applies the same change.
///
/// ```
/// use std::time::Duration;
/// use taskfence::{InputHash, NewTask, RequestKey, Status, TaskId};
/// let now = time::OffsetDateTime::now_utc();
/// let new = NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]));
/// let mut task = taskfence::backend::new_task(TaskId::new(), new, now, now + NewTask::DEFAULT_RETENTION);
/// taskfence::backend::rules::taken(&mut task, now + Duration::from_secs(30));
/// assert_eq!((task.status, task.version), (Status::Running, 1));
/// ```
pub fn taken(task: &mut Task, expires_at: OffsetDateTime) {
    task.version += 1;
    task.status = Status::Running;
    task.lease_until = Some(expires_at);
    task.not_before = None;
}

/// The task as it ends at `now` in the terminal `status` (completed, failed
/// or cancelled): no lease, no backoff, finished; `error` (a failure's
/// message or a cancellation's reason), when given, replaces the last error.
///
/// ```
/// # fn f(task: &mut taskfence::Task) {
/// taskfence::backend::rules::terminal(task, taskfence::Status::Cancelled, time::OffsetDateTime::now_utc(), Some("by operator".into()));
/// assert!(task.status.is_terminal());
/// # }
/// ```
pub fn terminal(task: &mut Task, status: Status, now: OffsetDateTime, error: Option<String>) {
    task.status = status;
    task.lease_until = None;
    task.not_before = None;
    task.finished_at = Some(now);
    if error.is_some() {
        task.last_error = error;
    }
}

/// The task as a [`release`](crate::TaskStore::release) at `now` leaves it:
/// pending, no lease, and due again at once (since `now`), so
/// [`due`](crate::TaskStore::due) and [`claim_next`](crate::TaskStore::claim_next) find it.
///
/// ```
/// # fn f(task: &mut taskfence::Task) {
/// taskfence::backend::rules::released(task, time::OffsetDateTime::now_utc());
/// assert_eq!(task.status, taskfence::Status::Pending);
/// # }
/// ```
pub fn released(task: &mut Task, now: OffsetDateTime) {
    task.status = Status::Pending;
    task.lease_until = None;
    task.not_before = Some(now);
}

/// The task as a failure that [`after_failure`] scheduled for a retry leaves
/// it: pending, no lease, not claimable before `not_before`, the failure's
/// message kept as the last error.
///
/// ```
/// # fn f(task: &mut taskfence::Task) {
/// let later = time::OffsetDateTime::now_utc() + time::Duration::seconds(5);
/// taskfence::backend::rules::retrying(task, later, "503".into());
/// assert_eq!(task.not_before, Some(later));
/// # }
/// ```
pub fn retrying(task: &mut Task, not_before: OffsetDateTime, message: String) {
    task.status = Status::Pending;
    task.lease_until = None;
    task.not_before = Some(not_before);
    task.last_error = Some(message);
}

/// What a task's concurrency key looks like at the instant of a claim: the
/// input of [`admit`], read by the backend under the same lock or
/// transaction as the claim.
///
/// ```
/// let idle = taskfence::backend::rules::KeyLoad::default();
/// assert_eq!(idle.running, 0);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyLoad {
    /// Tasks of the key holding a live lease (running, lease unexpired).
    pub running: u32,
    /// The key's oldest unfinished task (pending or running), by submission
    /// order; needed only for a key that runs in order (limit 1).
    pub first_unfinished: Option<TaskId>,
}

impl KeyLoad {
    /// The load at `now` of a key whose tasks are `tasks`, in submission
    /// order: those holding a slot ([`holds_slot`]) counted, the first
    /// unfinished one kept.
    ///
    /// ```
    /// use taskfence::backend::rules::KeyLoad;
    /// let none: [&taskfence::Task; 0] = [];
    /// assert_eq!(KeyLoad::of(none, time::OffsetDateTime::now_utc()), KeyLoad::default());
    /// ```
    pub fn of<'a>(tasks: impl IntoIterator<Item = &'a Task>, now: OffsetDateTime) -> Self {
        let mut load = Self::default();
        for task in tasks {
            if holds_slot(task, now) {
                load.running += 1;
            }
            if load.first_unfinished.is_none() && !task.status.is_terminal() {
                load.first_unfinished = Some(task.id);
            }
        }
        load
    }
}

/// Whether `task` holds a slot of its concurrency key at `now`: running
/// under a lease that has not expired. Slots are leases: an expired lease
/// frees its slot, and only the current assignment holds one.
///
/// ```
/// use taskfence::backend::rules::holds_slot;
/// # fn f(task: &taskfence::Task) {
/// if holds_slot(task, time::OffsetDateTime::now_utc()) {
///     println!("{} runs", task.id);
/// }
/// # }
/// ```
pub fn holds_slot(task: &Task, now: OffsetDateTime) -> bool {
    task.status == Status::Running && task.lease_until.is_some_and(|until| until > now)
}

/// A claim's limits, once [`claim`] said [`ClaimRule::Take`]: [`admit`]
/// under the task's concurrency key given its `load`, then a token from
/// its rate bucket ([`take_token`]; `bucket` is the store's state of the
/// bucket the task names). The answer is the bucket's new schedule, to
/// store with the claim (`None`: the task names no bucket), or why not: a
/// refusal writes nothing, and no token is taken when the key refused
/// first. (A store accepts a task naming a bucket only once the bucket is
/// defined, and never removes one; a bucket missing all the same gives no
/// token to take.)
///
/// ```
/// use taskfence::backend::rules::{within_limits, KeyLoad};
/// use taskfence::throttle::{BucketState, ConcurrencyKey, RateBucket, Throttled};
/// use taskfence::{InputHash, NewTask, RequestKey, TaskId};
/// let now = time::OffsetDateTime::UNIX_EPOCH;
/// let new = NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]))
///     .concurrency(ConcurrencyKey::new("tenant-acme", 2))
///     .rate_bucket("provider");
/// let task = taskfence::backend::new_task(TaskId::new(), new, now, now + NewTask::DEFAULT_RETENTION);
/// let bucket = BucketState { bucket: RateBucket::per_second("provider", 10), schedule: None };
/// // A free slot and a token: the bucket's schedule moves on by one interval.
/// let free = KeyLoad { running: 1, first_unfinished: None };
/// let schedule = within_limits(&task, &free, Some(&bucket), now).unwrap();
/// assert_eq!(schedule, Some(now + bucket.bucket.interval()));
/// // The key is full: refused for the key, before any token is taken.
/// let full = KeyLoad { running: 2, first_unfinished: None };
/// assert!(matches!(within_limits(&task, &full, Some(&bucket), now), Err(Throttled::Concurrency { limit: 2, .. })));
/// ```
pub fn within_limits(
    task: &Task,
    load: &KeyLoad,
    bucket: Option<&BucketState>,
    now: OffsetDateTime,
) -> Result<Option<OffsetDateTime>, Throttled> {
    admit(task, load)?;
    match bucket {
        Some(state) if task.limits.bucket.is_some() => {
            take_token(&state.bucket, state.schedule, now).map(Some)
        }
        _ => Ok(None),
    }
}

/// Whether `task` may start under its concurrency key, given the key's
/// load: a key that runs in order (limit 1) starts only its oldest
/// unfinished task; any key starts a task only while fewer than its limit
/// run. A task without a key is always admitted. Decided after
/// [`claim`] said [`ClaimRule::Take`]; a refusal writes nothing.
///
/// ```
/// use taskfence::backend::rules::{admit, KeyLoad};
/// # fn f(task: &taskfence::Task) {
/// let full = KeyLoad { running: 8, first_unfinished: None };
/// if let Err(why) = admit(task, &full) {
///     println!("not now: {why}");
/// }
/// # }
/// ```
pub fn admit(task: &Task, load: &KeyLoad) -> Result<(), Throttled> {
    let Some(key) = &task.limits.concurrency else {
        return Ok(());
    };
    if key.in_order()
        && let Some(first) = load.first_unfinished.filter(|first| *first != task.id)
    {
        return Err(Throttled::InOrder {
            key: key.name().to_owned(),
            behind: first,
        });
    }
    if load.running >= key.limit() {
        return Err(Throttled::Concurrency {
            key: key.name().to_owned(),
            limit: key.limit(),
        });
    }
    Ok(())
}

/// Takes a token from `bucket` at `now`, given the bucket's schedule (the
/// one instant the store keeps per bucket; `None` before the first token):
/// the new schedule to store, or the refusal with the instant the next
/// token is due. The generic cell rate algorithm: a token is there when the
/// schedule, less the burst's tolerance, is not in the future.
///
/// ```
/// use std::time::Duration;
/// use taskfence::backend::rules::take_token;
/// use taskfence::throttle::RateBucket;
/// let bucket = RateBucket::per_second("k", 2).burst(2);
/// let now = time::OffsetDateTime::UNIX_EPOCH;
/// let one = take_token(&bucket, None, now).unwrap();
/// let two = take_token(&bucket, Some(one), now).unwrap();
/// assert!(take_token(&bucket, Some(two), now).is_err(), "the burst is spent");
/// assert!(take_token(&bucket, Some(two), now + Duration::from_millis(500)).is_ok());
/// ```
pub fn take_token(
    bucket: &RateBucket,
    schedule: Option<OffsetDateTime>,
    now: OffsetDateTime,
) -> Result<OffsetDateTime, Throttled> {
    let from = schedule.filter(|at| *at > now).unwrap_or(now);
    let next = from - bucket.tolerance();
    if next > now {
        return Err(Throttled::Rate {
            bucket: bucket.name().to_owned(),
            next,
        });
    }
    Ok(from + bucket.interval())
}

/// The schedule of `bucket` after a provider said "no more until `until`"
/// (a `429` with `Retry-After`): no token before `until`, then tokens at
/// the steady pace without a burst. A drain never brings tokens back: a
/// schedule already past it stays.
///
/// ```
/// use std::time::Duration;
/// use taskfence::backend::rules::{drain, take_token};
/// use taskfence::throttle::RateBucket;
/// let bucket = RateBucket::per_second("k", 10).burst(10);
/// let now = time::OffsetDateTime::UNIX_EPOCH;
/// let drained = drain(&bucket, None, now + Duration::from_secs(30));
/// assert!(take_token(&bucket, Some(drained), now + Duration::from_secs(29)).is_err());
/// assert!(take_token(&bucket, Some(drained), now + Duration::from_secs(30)).is_ok());
/// ```
pub fn drain(bucket: &RateBucket, schedule: Option<OffsetDateTime>, until: OffsetDateTime) -> OffsetDateTime {
    let drained = until + bucket.tolerance();
    schedule.map_or(drained, |at| at.max(drained))
}

/// The order [`claim_next`](crate::TaskStore::claim_next) offers due
/// tasks in: round-robin by concurrency key. Each candidate is ranked by how
/// many older due candidates share its key (a task without a key is alone);
/// candidates are offered by rank, then by how long they have been due, then
/// by id. So a key with a thousand due tasks and a key with one both get
/// their oldest task offered before either gets a second: one busy tenant
/// cannot starve the others. Without keys this is plain oldest-due-first.
///
/// `candidates` are `(task, due since)` pairs; the answer is their indices
/// in offering order.
///
/// ```
/// use taskfence::backend::rules::fair_order;
/// # fn f(a: &taskfence::Task, b: &taskfence::Task, now: time::OffsetDateTime) {
/// let order = fair_order(&[(a, now), (b, now)]);
/// assert_eq!(order.len(), 2);
/// # }
/// ```
pub fn fair_order(candidates: &[(&Task, OffsetDateTime)]) -> Vec<usize> {
    let mut by_age: Vec<usize> = (0..candidates.len()).collect();
    by_age.sort_by_key(|&i| (candidates[i].1, candidates[i].0.id));
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut ranked: Vec<(usize, usize)> = by_age
        .into_iter()
        .map(|i| {
            let rank = match &candidates[i].0.limits.concurrency {
                Some(key) => {
                    let count = seen.entry(key.name()).or_default();
                    *count += 1;
                    *count - 1
                }
                None => 0,
            };
            (rank, i)
        })
        .collect();
    ranked.sort_by_key(|&(rank, i)| (rank, candidates[i].1, candidates[i].0.id));
    ranked.into_iter().map(|(_, i)| i).collect()
}
