//! The [`TaskStore`] contract and its typed outcomes.
//!
//! Every backend keeps the guarantees listed in the crate documentation; the
//! [conformance suite](crate::testing) checks them.

use std::time::Duration;

use async_trait::async_trait;
use time::OffsetDateTime;

use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::{InvalidInput, Result};
use crate::limits;
use crate::policy::{Failure, FailureKind, RetryPolicy};
use crate::task::{AttemptId, NewTask, RequestKey, Response, Status, Task, TaskId};

/// The durable side store that decides who may work on a task, whether it is
/// done already, and which result becomes *the* result.
///
/// Object safe: hold it as `Arc<dyn TaskStore>`. Every operation validates its
/// input first and writes nothing when it is invalid.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use taskfence::*;
///
/// let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
/// let key = RequestKey::new("user-1", "chat.reply", "req-1");
/// let task = store.submit(NewTask::new(key, InputHash::of(["msg-1"]))).await?.into_task();
///
/// let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("worker-a", Duration::from_secs(30))).await? else {
///     unreachable!("a fresh task is available");
/// };
/// let done = store.complete(lease, Response::from("hello")).await?;
/// assert!(done.is_accepted());
///
/// // A duplicate delivery: the claim returns the saved response, no new attempt.
/// let again = store.claim(task.id, ClaimRequest::new("worker-b", Duration::from_secs(30))).await?;
/// assert!(matches!(again, Claim::Completed(t) if t.response == Some(Response::from("hello"))));
/// # Ok(()) }
/// ```
#[async_trait]
pub trait TaskStore: Send + Sync {
    /// Submits work under a request key. The same key with the same input hash
    /// returns the existing task ([`Submitted::Existing`]); with another input
    /// hash it fails with [`Error::KeyConflict`](crate::Error::KeyConflict). A new key is always new work.
    async fn submit(&self, task: NewTask) -> Result<Submitted>;

    /// Reads a task by id.
    async fn get(&self, id: TaskId) -> Result<Option<Task>>;

    /// Looks a task up by its request key (scoped: another scope never matches).
    async fn find(&self, key: &RequestKey) -> Result<Option<Task>>;

    /// Asks for the right to work on the task now. Acquiring counts an attempt
    /// and increments the assignment version.
    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim>;

    /// Extends the lease to `extend_by` from now (store clock). On success the
    /// lease's expiry is updated in place.
    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>>;

    /// Saves the response and completes the task, if no response is saved yet
    /// and the task's [`AcceptanceRule`](crate::policy::AcceptanceRule) accepts this
    /// lease (by default: the assignment is still current and its lease
    /// unexpired): one atomic decision.
    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>>;

    /// Reports a failed attempt. The task's policy decides: retry after a
    /// backoff, or terminal failure.
    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>>;

    /// Gives the task back now (graceful shutdown): pending and due at once
    /// (`due` and `claim_next` find it). The attempt stays counted.
    async fn release(&self, lease: Lease) -> Result<Fenced<()>>;

    /// Cancels a live task. A worker still running it is then rejected with
    /// [`Rejection::NotRunning`]. Cancelling a cancelled task is accepted again;
    /// a completed or failed one is rejected.
    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>>;

    /// Durably records the provider's operation id for this attempt (before the
    /// call when the provider lets you choose it, right after otherwise), so a
    /// later attempt can look the operation up instead of paying twice.
    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>>;

    /// Every attempt of the task, oldest first.
    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>>;

    /// Records the intent to cause external effect `name` (a notification,
    /// a charge) under this lease, and says what to do: call the provider
    /// with the effect's [`EffectKey`](crate::effect::EffectKey) — the same
    /// on every attempt, for the provider's idempotency key — or skip the
    /// call because an earlier attempt did it, or stop because an earlier
    /// attempt's call has no known outcome and the task's policy says stop.
    /// Fenced like [`renew`](Self::renew): a lease that is not current writes
    /// nothing. See [`effect`](crate::effect) for the whole contract.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// # use std::time::Duration;
    /// use taskfence::effect::{EffectOutcome, EffectStart};
    /// # use taskfence::*;
    /// # let store = MemoryStore::new();
    /// # let task = store.submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]))).await?.into_task();
    /// # let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await? else { unreachable!() };
    /// if let Fenced::Accepted(EffectStart::Call { key, .. }) = store.begin_effect(&lease, "charge-card").await? {
    ///     // charge with idempotency key `key`, then:
    ///     store.finish_effect(&lease, "charge-card", EffectOutcome::done("ch_1")).await?;
    /// }
    /// let effects = store.effects(task.id).await?;
    /// assert_eq!(effects[0].reference.as_deref(), Some("ch_1"));
    /// # Ok(()) }
    /// ```
    async fn begin_effect(&self, lease: &Lease, name: &str) -> Result<Fenced<EffectStart>>;

    /// Records the outcome of effect `name`, begun under this same lease:
    /// done (with the provider's reference) or failed for certain. An
    /// unknown outcome (a timeout) is recorded by recording nothing: the
    /// next attempt finds the intent and treats it as ambiguous. Fenced: a
    /// superseded or expired lease records nothing. Settling an effect this
    /// assignment did not begin is [`InvalidInput::EffectNotBegun`]; settling
    /// it twice answers the first outcome.
    async fn finish_effect(
        &self,
        lease: &Lease,
        name: &str,
        outcome: EffectOutcome,
    ) -> Result<Fenced<Effect>>;

    /// The task's effects, by name.
    async fn effects(&self, id: TaskId) -> Result<Vec<Effect>>;

    /// Reopens a terminally failed or cancelled task with a fresh retry
    /// budget: an operator's decision after fixing what made it fail.
    ///
    /// The task becomes pending and due at once ([`due`](Self::due) lists it,
    /// so a re-dispatch loop publishes it again); its budget restarts from the
    /// current assignment version and instant under the request's policy (or
    /// the stored one). The version never goes back, so a lease from before
    /// can never save; the attempt journal keeps every earlier attempt; the
    /// reopening is recorded with who asked, why and when
    /// ([`Inspect::story`](crate::inspect::Inspect::story)).
    ///
    /// A completed task is refused with [`Rejection::AlreadyCompleted`], a
    /// live one with [`Rejection::NotTerminal`], one whose request key a newer
    /// task took (DynamoDB, after the dedup record expired) with
    /// [`Rejection::KeyReused`]; an unknown id is
    /// [`Error::NotFound`](crate::Error::NotFound). Bad input is a typed error and writes nothing.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use std::time::Duration;
    /// use taskfence::store::ReopenRequest;
    /// use taskfence::*;
    /// let store = MemoryStore::new();
    /// let once = RetryPolicy::default().max_attempts(1);
    /// let task = store.submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"])).policy(once)).await?.into_task();
    /// let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await? else { unreachable!() };
    /// store.fail(lease, Failure::retryable("provider down")).await?;
    ///
    /// let reopened = store.reopen(task.id, ReopenRequest::new("alice", "provider fixed")).await?;
    /// let reopened = reopened.accepted().expect("a failed task can be reopened");
    /// assert_eq!((reopened.status, reopened.attempts_left()), (Status::Pending, 1));
    /// assert!(store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await?.is_acquired());
    /// # Ok(()) }
    /// ```
    async fn reopen(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>>;

    /// Up to `limit` tasks to re-dispatch: a backoff that has passed, a
    /// lease that has expired, a release or a reopening. Reading only;
    /// publishing twice is harmless. A task waiting for its first claim since
    /// submission is not listed (its handoff covers it; [`Inspect::stranded`](crate::inspect::Inspect::stranded)
    /// finds one whose handoff was lost); [`claim_next`](Self::claim_next)
    /// takes both kinds.
    async fn due(&self, limit: usize) -> Result<Vec<TaskId>>;

    /// Removes up to `limit` terminal tasks whose retention has passed, with
    /// their dedup records and attempts. After it, replaying the key is new work.
    async fn purge_expired(&self, limit: usize) -> Result<u64>;

    /// Claims several tasks for one worker (a queue's batch of deliveries),
    /// answering each exactly as [`claim`](Self::claim) would, in order; one
    /// task's refusal never affects another's.
    ///
    /// Ids must be distinct and at most [`limits::MAX_BATCH`]; bad input is a
    /// typed error and claims nothing. The default claims one by one; a
    /// backend overrides it to decide the batch in one round trip (`PgStore`
    /// does). Not atomic as a whole: after an `Err`, some tasks may have been
    /// claimed — their leases expire as any crashed worker's do.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use std::time::Duration;
    /// use taskfence::*;
    /// let store = MemoryStore::new();
    /// let a = store.submit(NewTask::new(RequestKey::new("u", "op", "a"), InputHash::of(["a"]))).await?.into_task();
    /// let claims = store.claim_many(&[a.id, TaskId::new()], ClaimRequest::new("w", Duration::from_secs(30))).await?;
    /// assert!(claims[0].is_acquired());
    /// assert!(matches!(claims[1], Claim::NotFound));
    /// # Ok(()) }
    /// ```
    async fn claim_many(&self, ids: &[TaskId], request: ClaimRequest) -> Result<Vec<Claim>>;

    /// Completes several leases (a batch of finished work), each fenced on its
    /// own exactly as [`complete`](Self::complete) would decide it, in order:
    /// one refused lease never blocks the others. Each item is the
    /// completion's answer, or `Err(Error::NotFound)` when its task is gone.
    ///
    /// Leases must be of distinct tasks, at most [`limits::MAX_BATCH`], each
    /// response within limits; bad input is a typed error and saves nothing.
    /// The default completes one by one; `PgStore` decides the batch in one
    /// statement. After an outer `Err` some completions may have been saved:
    /// completing again is safe (a saved task answers `AlreadyCompleted` with
    /// its response).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use std::time::Duration;
    /// use taskfence::*;
    /// let store = MemoryStore::new();
    /// let a = store.submit(NewTask::new(RequestKey::new("u", "op", "a"), InputHash::of(["a"]))).await?.into_task();
    /// let leases = store.claim_many(&[a.id], ClaimRequest::new("w", Duration::from_secs(30))).await?;
    /// let Claim::Acquired(lease) = leases.into_iter().next().unwrap() else { unreachable!() };
    /// let saved = store.complete_many(vec![(lease, Response::from("hi"))]).await?;
    /// assert!(saved[0].as_ref().is_ok_and(|f| f.is_accepted()));
    /// # Ok(()) }
    /// ```
    async fn complete_many(&self, completions: Vec<(Lease, Response)>) -> Result<Vec<Result<Fenced<Task>>>>;

    /// Claims up to [`ClaimNext::limit`] of the tasks that need a worker now,
    /// oldest due first, each with its own fenced lease: the store is the
    /// queue, and this is how a worker asks it for work.
    ///
    /// A task needs a worker when it is pending and not backing off (new,
    /// released, retrying past its backoff, reopened) or running with an
    /// expired lease. Concurrent callers never get the same task: one that
    /// another caller holds or is claiming right now is skipped, not waited
    /// for. Each task is decided exactly as [`claim`](Self::claim) decides
    /// it: a task among the oldest due whose budget is spent (attempts or
    /// deadline) is failed instead and not returned, so fewer leases than
    /// the limit may come back while more tasks are due. An empty answer
    /// means nothing was due. [`ClaimNext::operation`] and
    /// [`ClaimNext::scope`] restrict it to some queues.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use std::time::Duration;
    /// use taskfence::*;
    /// let store = MemoryStore::new();
    /// for k in ["a", "b", "c"] {
    ///     store.submit(NewTask::new(RequestKey::new("u", "chat.reply", k), InputHash::of([k]))).await?;
    /// }
    /// let leases = store.claim_next(ClaimNext::new("w", Duration::from_secs(30), 2)).await?;
    /// assert_eq!(leases.len(), 2);
    /// assert_eq!(leases[0].task().key.key, "a", "oldest first");
    /// let rest = store.claim_next(ClaimNext::new("w", Duration::from_secs(30), 10)).await?;
    /// assert_eq!(rest.len(), 1, "a task is handed out once");
    /// # Ok(()) }
    /// ```
    async fn claim_next(&self, request: ClaimNext) -> Result<Vec<Lease>>;

    /// Renews several leases in one request (a consumer's held leases), each
    /// fenced on its own exactly as [`renew`](Self::renew) would decide it,
    /// in order; an accepted renewal moves that lease's expiry in place.
    ///
    /// Leases must be of distinct tasks, at most [`limits::MAX_BATCH`]; bad
    /// input is a typed error and renews nothing. The default renews one by
    /// one; `PgStore` renews the batch in one statement.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use std::time::Duration;
    /// use taskfence::*;
    /// let store = MemoryStore::new();
    /// store.submit(NewTask::new(RequestKey::new("u", "op", "a"), InputHash::of(["a"]))).await?;
    /// let mut held = store.claim_next(ClaimNext::new("w", Duration::from_secs(30), 10)).await?;
    /// let renewed = store.renew_many(&mut held, Duration::from_secs(60)).await?;
    /// assert!(renewed.iter().all(Fenced::is_accepted));
    /// # Ok(()) }
    /// ```
    async fn renew_many(&self, leases: &mut [Lease], extend_by: Duration) -> Result<Vec<Fenced<()>>>;
}

/// What a [`TaskStore::claim_next`] asks for: who claims, for how long, how
/// many at most, and optionally which operations and scopes (one
/// deployment's several queues).
///
/// ```
/// use std::time::Duration;
/// use taskfence::ClaimNext;
/// let next = ClaimNext::new("worker-7", Duration::from_secs(30), 16).operation("chat.reply");
/// assert!(next.validate().is_ok());
/// assert!(ClaimNext::new("worker-7", Duration::from_secs(30), 0).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimNext {
    /// The worker's id, recorded with each attempt.
    pub worker: String,
    /// Lease length of each claimed task, measured on the store's clock.
    pub lease: Duration,
    /// At most this many leases (`1..=`[`limits::MAX_BATCH`]).
    pub limit: usize,
    /// Only tasks of these operations; empty: any.
    pub operations: Vec<String>,
    /// Only tasks of these scopes; empty: any.
    pub scopes: Vec<String>,
}

impl ClaimNext {
    /// Up to `limit` due tasks for `worker`, each for a lease of `lease`.
    pub fn new(worker: impl Into<String>, lease: Duration, limit: usize) -> Self {
        Self {
            worker: worker.into(),
            lease,
            limit,
            operations: Vec::new(),
            scopes: Vec::new(),
        }
    }

    /// Adds an operation to claim from (call once per operation).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let next = taskfence::ClaimNext::new("w", Duration::from_secs(30), 8).operation("a").operation("b");
    /// assert_eq!(next.operations, ["a", "b"]);
    /// ```
    pub fn operation(mut self, operation: impl Into<String>) -> Self {
        self.operations.push(operation.into());
        self
    }

    /// Adds a scope to claim from (call once per scope).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let next = taskfence::ClaimNext::new("w", Duration::from_secs(30), 8).scope("tenant-7");
    /// assert_eq!(next.scopes, ["tenant-7"]);
    /// ```
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scopes.push(scope.into());
        self
    }

    /// The claim each task gets: the same worker and lease.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let next = taskfence::ClaimNext::new("w", Duration::from_secs(30), 8);
    /// assert_eq!(next.request(), taskfence::ClaimRequest::new("w", Duration::from_secs(30)));
    /// ```
    pub fn request(&self) -> ClaimRequest {
        ClaimRequest::new(self.worker.clone(), self.lease)
    }

    /// Checks the worker, the lease, the limit and each operation and scope
    /// against [`limits`].
    pub fn validate(&self) -> Result<(), InvalidInput> {
        self.request().validate()?;
        limits::check_claim_limit(self.limit)?;
        limits::check_filters("operations", self.operations.len())?;
        limits::check_filters("scopes", self.scopes.len())?;
        for operation in &self.operations {
            limits::check_text("operation", operation, limits::MAX_OPERATION_LEN)?;
        }
        for scope in &self.scopes {
            limits::check_text("scope", scope, limits::MAX_SCOPE_LEN)?;
        }
        Ok(())
    }
}

/// What [`TaskStore::submit`] did.
///
/// ```
/// # fn f(s: taskfence::Submitted) {
/// let created = s.is_created();
/// let task = s.into_task();
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// A new task was written.
    Created(Task),
    /// The key was seen before with the same inputs: this is that task, nothing was written.
    Existing(Task),
}

impl Submitted {
    /// The task, new or existing.
    pub fn task(&self) -> &Task {
        match self {
            Submitted::Created(t) | Submitted::Existing(t) => t,
        }
    }
    /// Takes the task out.
    pub fn into_task(self) -> Task {
        match self {
            Submitted::Created(t) | Submitted::Existing(t) => t,
        }
    }
    /// `true` for [`Submitted::Created`].
    pub fn is_created(&self) -> bool {
        matches!(self, Submitted::Created(_))
    }
}

/// Who is claiming and for how long.
///
/// ```
/// use std::time::Duration;
/// use taskfence::ClaimRequest;
/// let req = ClaimRequest::new("worker-7", Duration::from_secs(30));
/// assert!(req.validate().is_ok());
/// assert!(ClaimRequest::new("", Duration::from_secs(30)).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// The worker's id, recorded with the attempt.
    pub worker: String,
    /// Lease length, measured on the store's clock.
    pub lease: Duration,
}

impl ClaimRequest {
    /// A claim by `worker` for a lease of `lease`.
    pub fn new(worker: impl Into<String>, lease: Duration) -> Self {
        Self {
            worker: worker.into(),
            lease,
        }
    }

    /// Checks the worker id and the lease length against [`limits`].
    pub fn validate(&self) -> Result<(), InvalidInput> {
        limits::check_text("worker", &self.worker, limits::MAX_WORKER_LEN)?;
        limits::check_duration("lease", self.lease, limits::MAX_LEASE)
    }
}

/// Who reopens a task with [`TaskStore::reopen`], why, and the budget it gets.
///
/// ```
/// use std::time::Duration;
/// use taskfence::RetryPolicy;
/// use taskfence::store::ReopenRequest;
/// let request = ReopenRequest::new("alice@ops", "quota raised")
///     .policy(RetryPolicy::default().max_attempts(3).deadline(Duration::from_secs(3600)));
/// assert!(request.validate().is_ok());
/// assert!(ReopenRequest::new("", "why").validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ReopenRequest {
    /// Who asked (an operator, a tool): recorded with the reopening.
    pub by: String,
    /// Why: recorded with the reopening.
    pub reason: String,
    /// The policy of the fresh budget; `None` keeps the task's stored policy.
    pub policy: Option<RetryPolicy>,
    /// The fresh budget's attempts, over the policy above (or the stored
    /// one): the one setting an operator most often changes, decided in the
    /// store's own write without reading the policy first.
    pub max_attempts: Option<u32>,
}

impl ReopenRequest {
    /// A reopening by `by` for `reason`, under the task's stored policy.
    pub fn new(by: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            by: by.into(),
            reason: reason.into(),
            policy: None,
            max_attempts: None,
        }
    }

    /// Gives the fresh budget this policy instead of the stored one.
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Gives the fresh budget `n` attempts, keeping every other setting of
    /// the policy (the stored one, or the one given to [`policy`](Self::policy)).
    ///
    /// ```
    /// let request = taskfence::store::ReopenRequest::new("alice@ops", "provider back").max_attempts(10);
    /// assert_eq!(request.max_attempts, Some(10));
    /// assert!(taskfence::store::ReopenRequest::new("alice@ops", "none").max_attempts(0).validate().is_err());
    /// ```
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// The policy of the fresh budget for a task whose stored policy is `stored`.
    ///
    /// ```
    /// use taskfence::{RetryPolicy, store::ReopenRequest};
    /// let stored = RetryPolicy::default().max_attempts(3);
    /// assert_eq!(ReopenRequest::new("ops", "why").policy_for(&stored), stored);
    /// assert_eq!(ReopenRequest::new("ops", "why").max_attempts(9).policy_for(&stored).max_attempts, 9);
    /// ```
    pub fn policy_for(&self, stored: &RetryPolicy) -> RetryPolicy {
        let mut policy = self.policy.unwrap_or(*stored);
        if let Some(n) = self.max_attempts {
            policy.max_attempts = n;
        }
        policy
    }

    /// Checks who, why and the policy against [`limits`].
    pub fn validate(&self) -> Result<(), InvalidInput> {
        limits::check_text("by", &self.by, limits::MAX_WORKER_LEN)?;
        limits::check_reason(&self.reason)?;
        self.policy.as_ref().map_or(Ok(()), RetryPolicy::validate)?;
        match self.max_attempts {
            Some(n) => RetryPolicy::default().max_attempts(n).validate(),
            None => Ok(()),
        }
    }
}

/// One [`TaskStore::reopen`] of a task, as its story records it.
///
/// ```
/// # fn f(r: taskfence::store::Reopening) {
/// println!("reopened #{} by {} at version {}: {}", r.number, r.by, r.version, r.reason);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Reopening {
    /// The task.
    pub task_id: TaskId,
    /// 1-based: the task's first, second… reopening.
    pub number: u32,
    /// When (store clock).
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339"))]
    pub at: OffsetDateTime,
    /// Who asked.
    pub by: String,
    /// Why.
    pub reason: String,
    /// The status it was reopened from (failed or cancelled).
    pub from: Status,
    /// The assignment version then: the new budget's base.
    pub version: u64,
}

impl Reopening {
    /// The `number`th reopening of `task_id` (a backend's record): at `at`,
    /// by `by` for `reason`, from status `from` at assignment version `version`.
    ///
    /// ```
    /// use taskfence::store::Reopening;
    /// let r = Reopening::new(taskfence::TaskId::new(), 1, time::OffsetDateTime::now_utc(), "ops", "fixed", taskfence::Status::Failed, 3);
    /// assert_eq!(r.number, 1);
    /// ```
    pub fn new(
        task_id: TaskId,
        number: u32,
        at: OffsetDateTime,
        by: impl Into<String>,
        reason: impl Into<String>,
        from: Status,
        version: u64,
    ) -> Self {
        Self {
            task_id,
            number,
            at,
            by: by.into(),
            reason: reason.into(),
            from,
            version,
        }
    }
}

/// The answer to [`TaskStore::claim`].
///
/// ```
/// use taskfence::Claim;
/// fn should_call_provider(c: &Claim) -> bool {
///     matches!(c, Claim::Acquired(_))
/// }
/// assert!(!should_call_provider(&Claim::NotFound));
/// ```
#[derive(Debug)]
pub enum Claim {
    /// This worker holds the task now. Do the work, then complete, fail or release.
    Acquired(Lease),
    /// Already done: here is the saved response. No attempt was counted.
    Completed(Task),
    /// Another assignment holds a live lease until this instant.
    Busy {
        /// When that lease expires (store clock).
        until: OffsetDateTime,
    },
    /// A retry is scheduled; claim again at or after this instant.
    Backoff {
        /// Earliest next claim (store clock).
        not_before: OffsetDateTime,
    },
    /// Terminally failed (permanent failure or budget exhausted). No attempt was counted.
    Failed(Task),
    /// Cancelled. No attempt was counted.
    Cancelled(Task),
    /// No such task.
    NotFound,
}

impl Claim {
    /// `true` for [`Claim::Acquired`].
    pub fn is_acquired(&self) -> bool {
        matches!(self, Claim::Acquired(_))
    }

    /// A short, stable name of the variant (`acquired`, `completed`, `busy`,
    /// `backoff`, `failed`, `cancelled`, `not_found`): the `outcome` label
    /// of the metrics, and a field for logs.
    ///
    /// ```
    /// assert_eq!(taskfence::Claim::NotFound.label(), "not_found");
    /// ```
    pub fn label(&self) -> &'static str {
        match self {
            Claim::Acquired(_) => "acquired",
            Claim::Completed(_) => "completed",
            Claim::Busy { .. } => "busy",
            Claim::Backoff { .. } => "backoff",
            Claim::Failed(_) => "failed",
            Claim::Cancelled(_) => "cancelled",
            Claim::NotFound => "not_found",
        }
    }
}

/// One assignment's right to work on a task: the fencing token (assignment
/// version) and the lease expiry. [`complete`](TaskStore::complete),
/// [`fail`](TaskStore::fail) and [`release`](TaskStore::release) consume it.
///
/// The expiry here is a *hint* for the worker (when to renew, when to give up):
/// the store decides with its own clock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use std::time::Duration;
/// use taskfence::*;
/// let store = MemoryStore::new();
/// let task = store.submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]))).await?.into_task();
/// let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await? else { panic!() };
/// assert_eq!(lease.task_id(), task.id);
/// assert_eq!(lease.version(), 1);
/// assert_eq!(lease.attempt(), 1);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    task: Task,
    attempt_id: AttemptId,
    worker: String,
    expires_at: OffsetDateTime,
}

impl Lease {
    /// Builds a lease ([`backend::new_lease`](crate::backend::new_lease)).
    pub(crate) fn new(task: Task, attempt_id: AttemptId, worker: String, expires_at: OffsetDateTime) -> Self {
        Self {
            task,
            attempt_id,
            worker,
            expires_at,
        }
    }

    /// The task as it was when claimed (payload, policy, attempts).
    pub fn task(&self) -> &Task {
        &self.task
    }
    /// The task, for a store that builds the completed task from it without a copy.
    #[cfg(feature = "postgres")]
    pub(crate) fn into_task(self) -> Task {
        self.task
    }
    /// The task's id.
    pub fn task_id(&self) -> TaskId {
        self.task.id
    }
    /// The assignment version: the fencing token this lease writes with.
    pub fn version(&self) -> u64 {
        self.task.version
    }
    /// The attempt number (1-based); every claim is one attempt, so it equals the version.
    pub fn attempt(&self) -> u32 {
        self.task.attempts()
    }
    /// This attempt's id, for tracing.
    pub fn attempt_id(&self) -> AttemptId {
        self.attempt_id
    }
    /// The worker that holds it.
    pub fn worker(&self) -> &str {
        &self.worker
    }
    /// When the lease expires, as last reported by the store.
    pub fn expires_at(&self) -> OffsetDateTime {
        self.expires_at
    }
    /// Records a new expiry after a successful renewal ([`backend::renewed`](crate::backend::renewed)).
    pub(crate) fn set_expires_at(&mut self, at: OffsetDateTime) {
        self.expires_at = at;
    }
}

/// Why a fenced write was refused. Nothing was written.
///
/// ```
/// use taskfence::{Rejection, Status};
/// let r = Rejection::Superseded { current_version: 3 };
/// assert_eq!(r.to_string(), "superseded by assignment version 3");
/// assert_eq!(Rejection::NotRunning(Status::Cancelled).to_string(), "task is cancelled, not running");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The task already has its saved response (here it is).
    #[error("task already completed")]
    AlreadyCompleted(Box<Task>),
    /// A newer assignment has claimed the task since this lease was granted.
    #[error("superseded by assignment version {current_version}")]
    Superseded {
        /// The task's current assignment version.
        current_version: u64,
    },
    /// This assignment is still current but its lease has expired (store clock).
    #[error("lease expired")]
    LeaseExpired,
    /// The task is not running (cancelled, failed, released or retrying).
    #[error("task is {0}, not running")]
    NotRunning(Status),
    /// A [reopening](TaskStore::reopen) of a task that is still pending or
    /// running: only a failed or cancelled task can be reopened.
    #[error("task is {0}: only a failed or cancelled task can be reopened")]
    NotTerminal(Status),
    /// A [reopening](TaskStore::reopen) of a task whose request key names
    /// newer work now (its dedup record expired and a new submission took
    /// the key): reopening would give one key two live tasks. Only a store
    /// whose dedup records expire apart from the task (DynamoDB) answers it;
    /// in PostgreSQL and memory the key stays with its task until a purge.
    #[error("the request key now names task {current}: this task cannot be reopened")]
    KeyReused {
        /// The task the key names now.
        current: TaskId,
    },
}

impl Rejection {
    /// A short, stable name of the variant (`already_completed`,
    /// `superseded`, `lease_expired`, `not_running`, `not_terminal`,
    /// `key_reused`): the `reason` label of the metrics, and a field for logs.
    ///
    /// ```
    /// assert_eq!(taskfence::Rejection::LeaseExpired.label(), "lease_expired");
    /// ```
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::AlreadyCompleted(_) => "already_completed",
            Rejection::Superseded { .. } => "superseded",
            Rejection::LeaseExpired => "lease_expired",
            Rejection::NotRunning(_) => "not_running",
            Rejection::NotTerminal(_) => "not_terminal",
            Rejection::KeyReused { .. } => "key_reused",
        }
    }
}

/// The outcome of a fenced write: accepted, or rejected with the reason.
///
/// ```
/// use taskfence::{Fenced, Rejection};
/// let ok: Fenced<u8> = Fenced::Accepted(1);
/// assert_eq!(ok.accepted(), Some(1));
/// let no: Fenced<u8> = Fenced::Rejected(Rejection::LeaseExpired);
/// assert_eq!(no.rejection(), Some(&Rejection::LeaseExpired));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a rejected write must be handled: the worker no longer holds the task"]
pub enum Fenced<T> {
    /// The write happened.
    Accepted(T),
    /// The write was refused; nothing changed.
    Rejected(Rejection),
}

impl<T> Fenced<T> {
    /// `true` for [`Fenced::Accepted`].
    pub fn is_accepted(&self) -> bool {
        matches!(self, Fenced::Accepted(_))
    }
    /// The accepted value, if any.
    pub fn accepted(self) -> Option<T> {
        match self {
            Fenced::Accepted(v) => Some(v),
            Fenced::Rejected(_) => None,
        }
    }
    /// The rejection, if any.
    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            Fenced::Accepted(_) => None,
            Fenced::Rejected(r) => Some(r),
        }
    }
    /// Converts into a standard `Result`.
    pub fn into_result(self) -> std::result::Result<T, Rejection> {
        match self {
            Fenced::Accepted(v) => Ok(v),
            Fenced::Rejected(r) => Err(r),
        }
    }
    /// Maps the accepted value; a rejection stays as it is.
    ///
    /// ```
    /// use taskfence::Fenced;
    /// let saved: Fenced<u32> = Fenced::Accepted(2);
    /// assert_eq!(saved.map(|n| n * 10).accepted(), Some(20));
    /// ```
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Fenced<U> {
        match self {
            Fenced::Accepted(v) => Fenced::Accepted(f(v)),
            Fenced::Rejected(r) => Fenced::Rejected(r),
        }
    }
}

/// What an accepted [`TaskStore::fail`] led to.
///
/// ```
/// # fn f(r: taskfence::Retry) {
/// match r {
///     taskfence::Retry::Scheduled { not_before, attempts_left } => {}
///     taskfence::Retry::Exhausted(task) => {}
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retry {
    /// Another attempt may claim the task at or after `not_before`.
    Scheduled {
        /// Earliest next claim (store clock).
        not_before: OffsetDateTime,
        /// Claims still allowed.
        attempts_left: u32,
    },
    /// No retry: the task is terminally `Failed` (permanent failure, ambiguous
    /// with [`OnAmbiguous::Stop`](crate::policy::OnAmbiguous::Stop), attempts or deadline exhausted).
    Exhausted(Box<Task>),
}

/// How an attempt ended.
///
/// ```
/// assert_eq!(taskfence::store::AttemptOutcome::Expired.as_str(), "expired");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptOutcome {
    /// Still holding (or last held) the lease; no outcome reported.
    Running,
    /// Its response was saved.
    Completed,
    /// It reported a failure of this kind.
    Failed(FailureKind),
    /// It gave the task back.
    Released,
    /// Its lease expired without a report; the task was taken over or its budget ran out.
    Expired,
    /// The task was cancelled while it ran.
    Cancelled,
    /// It still held the lease when an earlier attempt's answer was saved
    /// (only under [`AcceptanceRule::FirstValidAnswer`](crate::policy::AcceptanceRule::FirstValidAnswer)).
    Overtaken,
}

impl AttemptOutcome {
    /// The lowercase name used in storage and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Running => "running",
            AttemptOutcome::Completed => "completed",
            AttemptOutcome::Failed(FailureKind::Retryable) => "failed_retryable",
            AttemptOutcome::Failed(FailureKind::Permanent) => "failed_permanent",
            AttemptOutcome::Failed(FailureKind::Ambiguous) => "failed_ambiguous",
            AttemptOutcome::Released => "released",
            AttemptOutcome::Expired => "expired",
            AttemptOutcome::Cancelled => "cancelled",
            AttemptOutcome::Overtaken => "overtaken",
        }
    }

    /// Parses [`as_str`](Self::as_str)'s output.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => AttemptOutcome::Running,
            "completed" => AttemptOutcome::Completed,
            "failed_retryable" => AttemptOutcome::Failed(FailureKind::Retryable),
            "failed_permanent" => AttemptOutcome::Failed(FailureKind::Permanent),
            "failed_ambiguous" => AttemptOutcome::Failed(FailureKind::Ambiguous),
            "released" => AttemptOutcome::Released,
            "expired" => AttemptOutcome::Expired,
            "cancelled" => AttemptOutcome::Cancelled,
            "overtaken" => AttemptOutcome::Overtaken,
            _ => return None,
        })
    }
}

/// One claim of a task, as [`TaskStore::attempts`] reports it.
///
/// ```
/// # fn f(a: taskfence::store::Attempt) {
/// println!("attempt {} by {}: {:?}", a.number, a.worker, a.outcome);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Attempt {
    /// The attempt's id.
    pub id: AttemptId,
    /// The task.
    pub task_id: TaskId,
    /// 1-based attempt number, equal to the assignment version it held.
    pub number: u32,
    /// The worker that claimed it.
    pub worker: String,
    /// When it was claimed (store clock).
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339"))]
    pub started_at: OffsetDateTime,
    /// When it ended, if it has.
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339::option"))]
    pub finished_at: Option<OffsetDateTime>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The provider operation id it recorded, if any.
    pub operation_id: Option<String>,
    /// The failure message it reported, if any.
    pub error: Option<String>,
}

impl Attempt {
    /// An attempt as its claim starts it: running, nothing recorded yet (a
    /// backend's record; it sets the other fields as the attempt goes on).
    ///
    /// ```
    /// use taskfence::store::{Attempt, AttemptOutcome};
    /// use taskfence::task::AttemptId;
    /// let a = Attempt::started(AttemptId::new(), taskfence::TaskId::new(), 1, "w", time::OffsetDateTime::now_utc());
    /// assert_eq!(a.outcome, AttemptOutcome::Running);
    /// ```
    pub fn started(
        id: AttemptId,
        task_id: TaskId,
        number: u32,
        worker: impl Into<String>,
        started_at: OffsetDateTime,
    ) -> Self {
        Self {
            id,
            task_id,
            number,
            worker: worker.into(),
            started_at,
            finished_at: None,
            outcome: AttemptOutcome::Running,
            operation_id: None,
            error: None,
        }
    }
}
