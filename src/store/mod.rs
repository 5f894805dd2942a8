//! The [`TaskStore`] contract and its typed outcomes.
//!
//! Every backend keeps the guarantees listed in the crate documentation; the
//! [conformance suite](crate::testing) checks them.
//!
//! | module | what it holds |
//! | --- | --- |
//! | this one | the [`TaskStore`] trait |
//! | `request` | what a caller asks: [`ClaimRequest`], [`ClaimNext`], [`ReopenRequest`] |
//! | `outcome` | what the store answers: [`Submitted`], [`Claim`], [`Fenced`], [`Rejection`], [`Retry`] |
//! | `history` | what the store records of a task's past: [`Attempt`], [`AttemptOutcome`], [`Reopening`] |
//!
//! [`Lease`] is defined with the task values beneath this contract and
//! re-exported here.

mod history;
mod outcome;
mod request;

use std::time::Duration;

use async_trait::async_trait;

use crate::effect::{Effect, EffectOutcome, EffectStart};
#[cfg(doc)]
use crate::error::InvalidInput;
use crate::error::Result;
pub use crate::lease::Lease;
#[cfg(doc)]
use crate::limits;
use crate::policy::Failure;
use crate::task::{NewTask, RequestKey, Response, Task, TaskId};
use crate::throttle::{BucketState, RateBucket};
pub use history::{Attempt, AttemptOutcome, Reopening};
pub use outcome::{Claim, Fenced, Rejection, Retry, Submitted};
pub use request::{ClaimNext, ClaimRequest, ReopenRequest};

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
    /// and increments the assignment version (a claim given back with
    /// [`release_unstarted`](Self::release_unstarted) is refunded).
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

    /// Gives the task back now, after its work began (graceful shutdown of
    /// running work): pending and due at once (`due` and `claim_next` find
    /// it). The attempt stays counted ([`AttemptOutcome::Released`]).
    async fn release(&self, lease: Lease) -> Result<Fenced<()>>;

    /// Gives the task back now, its work never begun (a prefetched claim at
    /// a stop, a claim a worker took but cannot run): pending and due at
    /// once, as [`release`](Self::release), and the claim refunded to the
    /// retry budget in the same fenced write: the assignment version still
    /// rose (an old lease stays fenced), but
    /// [`attempts_in_budget`](Task::attempts_in_budget) is as it was before
    /// the claim. The attempt journal records it as
    /// [`AttemptOutcome::ReturnedUnstarted`].
    ///
    /// Fenced like `release`: a lease that is not current (expired,
    /// superseded, released already) writes nothing and refunds nothing. A
    /// claim whose work began, or whose lease was lost while held (a
    /// crash), always counts: call [`release`](Self::release) once the
    /// work function was called.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use std::time::Duration;
    /// use taskfence::*;
    /// let store = MemoryStore::new();
    /// let once = RetryPolicy::default().max_attempts(1);
    /// let task = store.submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"])).policy(once)).await?.into_task();
    /// let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await? else { unreachable!() };
    /// assert!(store.release_unstarted(lease).await?.is_accepted());
    ///
    /// let task = store.get(task.id).await?.unwrap();
    /// assert_eq!((task.version, task.attempts_in_budget(), task.attempts_left()), (1, 0, 1));
    /// assert!(store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await?.is_acquired());
    /// # Ok(()) }
    /// ```
    async fn release_unstarted(&self, lease: Lease) -> Result<Fenced<()>>;

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

    /// Defines the rate bucket `bucket.name()`, or changes its rate and
    /// burst: tasks naming it ([`NewTask::rate_bucket`]) then take a token
    /// on each claim. Redefining a bucket keeps its schedule, so a change
    /// never hands out a fresh burst. Bad input is a typed error and
    /// writes nothing. A store that does not decide limits answers
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use std::time::Duration;
    /// use taskfence::throttle::{RateBucket, Throttled};
    /// use taskfence::*;
    /// let store = MemoryStore::new();
    /// store.define_bucket(RateBucket::per_minute("openai-key-1", 500).burst(1)).await?;
    /// for k in ["a", "b"] {
    ///     let new = NewTask::new(RequestKey::new("u", "op", k), InputHash::of([k])).rate_bucket("openai-key-1");
    ///     store.submit(new).await?;
    /// }
    /// let taken = store.claim_next(ClaimNext::new("w", Duration::from_secs(30), 10)).await?;
    /// assert_eq!(taken.len(), 1, "one token: the second waits 120 ms for the next");
    /// # Ok(()) }
    /// ```
    async fn define_bucket(&self, bucket: RateBucket) -> Result<()>;

    /// Empties the bucket named `name` for `retry_after` (a provider's
    /// `429` with `Retry-After`): no claim by any worker takes a token from
    /// it before then, and afterwards tokens come at the steady pace. One
    /// worker's `429` thus stops all of them, instead of each burning an
    /// attempt to learn it. Answers the bucket after the drain, or `None`
    /// when no bucket has that name. A drain never shortens an earlier one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use std::time::Duration;
    /// use taskfence::throttle::RateBucket;
    /// use taskfence::*;
    /// let store = MemoryStore::new();
    /// store.define_bucket(RateBucket::per_second("search-api", 10).burst(10)).await?;
    /// let drained = store.drain_bucket("search-api", Duration::from_secs(30)).await?.unwrap();
    /// assert_eq!(drained.available(time::OffsetDateTime::now_utc()), 0);
    /// assert!(store.drain_bucket("no-such-bucket", Duration::from_secs(1)).await?.is_none());
    /// # Ok(()) }
    /// ```
    async fn drain_bucket(&self, name: &str, retry_after: Duration) -> Result<Option<BucketState>>;
}
