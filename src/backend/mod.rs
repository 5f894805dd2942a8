//! For implementing a store: the trait a storage backend implements and the
//! decisions every backend shares. An application never needs this module.
//!
//! **Stability.** What is here serves backend authors and may change in a
//! minor release; the application API (the crate root, [`TaskStore`],
//! [`Inspect`]) does not.
//!
//! A backend implements [`Backend`] (and [`InspectBackend`] for the
//! operator's queries, [`OutboxBackend`] for a transactional outbox) on
//! input that is already valid; it is then a [`TaskStore`] (and an
//! [`Inspect`], an [`Outbox`](crate::dispatch::Outbox)): every call enters through one
//! implementation that checks the input against the documented
//! [`limits`](crate::limits) (a typed error, nothing written) and opens the
//! operation's `DEBUG` span named `taskfence`, so a backend can forget
//! neither. The [conformance suite](crate::testing) checks the rest.
//!
//! | item | what it is for |
//! | --- | --- |
//! | [`Backend`], [`InspectBackend`] | the operations, on validated input |
//! | [`OutboxBackend`] | a transactional outbox: take handoffs, mark them published, write new ones; the dispatcher loop is [`Outbox`](crate::dispatch::Outbox)'s |
//! | [`rules`] | every decision (claim, fence, accept, fail, release, cancel, reopen) as a pure function of a task and an instant |
//! | [`Plan`], [`jitter_unit`] | a failed attempt's retry plan and its jitter draw |
//! | [`new_task`], [`new_lease`], [`renewed`] | the task and lease values a backend hands back |
//! | [`claim_one_by_one`], [`complete_one_by_one`], [`renew_one_by_one`] | batches made of single operations |
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
//! use taskfence::backend::Backend;
//! use taskfence::{MemoryStore, TaskStore};
//!
//! // Every backend is a TaskStore through this module's blanket implementation.
//! fn store_of<B: Backend + 'static>(backend: B) -> std::sync::Arc<dyn TaskStore> {
//!     std::sync::Arc::new(backend)
//! }
//! let store = store_of(MemoryStore::new());
//! assert!(store.get(taskfence::TaskId::new()).await?.is_none());
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use tracing::Instrument;

use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::{Error, Result};
use crate::inspect::{CappedCounts, Counts, Inspect, Page, QueueDepth, Story, TaskQuery, TaskSummary};
use crate::policy::Failure;
pub use crate::policy::plan::Plan;
use crate::store::{
    Attempt, Claim, ClaimNext, ClaimRequest, Fenced, Lease, ReopenRequest, Retry, Submitted, TaskStore,
};
use crate::task::{AttemptId, NewTask, RequestKey, Response, Status, Task, TaskId};
use crate::throttle::{BucketState, KeySlots, RateBucket};

pub(crate) mod entry;
mod outbox;
pub mod rules;

pub use outbox::OutboxBackend;

/// The operations of a storage backend, each called with input that
/// already passed the checks of [`limits`](crate::limits): implement this,
/// and the type is a [`TaskStore`].
///
/// Each method has the contract of the [`TaskStore`] method of the same
/// name (read it there). The batch methods have defaults made of single
/// operations; override them to decide a batch in one request.
///
/// ```
/// use taskfence::backend::Backend;
/// fn assert_backend<B: Backend>() {}
/// assert_backend::<taskfence::MemoryStore>();
/// ```
#[async_trait]
pub trait Backend: Send + Sync {
    /// [`TaskStore::submit`], on validated input.
    async fn submit(&self, task: NewTask) -> Result<Submitted>;
    /// [`TaskStore::get`], on validated input.
    async fn get(&self, id: TaskId) -> Result<Option<Task>>;
    /// [`TaskStore::find`], on validated input.
    async fn find(&self, key: &RequestKey) -> Result<Option<Task>>;
    /// [`TaskStore::claim`], on validated input.
    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim>;
    /// [`TaskStore::renew`], on validated input.
    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>>;
    /// [`TaskStore::complete`], on validated input.
    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>>;
    /// [`TaskStore::fail`], on validated input.
    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>>;
    /// [`TaskStore::release`], on validated input: decide with
    /// [`rules::release`] and [`rules::Work::Started`].
    async fn release(&self, lease: Lease) -> Result<Fenced<()>>;
    /// [`TaskStore::release_unstarted`], on validated input: decide with
    /// [`rules::release`] and [`rules::Work::NotStarted`] (the refund in the
    /// same fenced write as the release).
    async fn release_unstarted(&self, lease: Lease) -> Result<Fenced<()>>;
    /// [`TaskStore::cancel`], on validated input.
    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>>;
    /// [`TaskStore::record_operation`], on validated input.
    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>>;
    /// [`TaskStore::attempts`], on validated input.
    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>>;
    /// [`TaskStore::begin_effect`], on validated input: decide with
    /// [`rules::begin_effect`] under the fence.
    async fn begin_effect(&self, lease: &Lease, name: &str) -> Result<Fenced<EffectStart>>;
    /// [`TaskStore::finish_effect`], on validated input: decide with
    /// [`rules::finish_effect`] under the fence.
    async fn finish_effect(
        &self,
        lease: &Lease,
        name: &str,
        outcome: EffectOutcome,
    ) -> Result<Fenced<Effect>>;
    /// [`TaskStore::effects`], on validated input.
    async fn effects(&self, id: TaskId) -> Result<Vec<Effect>>;
    /// [`TaskStore::reopen`], on validated input.
    async fn reopen(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>>;
    /// [`TaskStore::due`], on validated input.
    async fn due(&self, limit: usize) -> Result<Vec<TaskId>>;
    /// [`TaskStore::purge_expired`], on validated input.
    async fn purge_expired(&self, limit: usize) -> Result<u64>;

    /// Called with valid submissions, at least one; answers one per
    /// submission, in order, as [`TaskStore::submit_many`] says (a key
    /// reused with other inputs is that entry's
    /// [`Error::KeyConflict`]). By default one [`submit`](Self::submit) per
    /// task, in order ([`submit_one_by_one`]).
    async fn submit_many(&self, tasks: Vec<NewTask>) -> Result<Vec<Result<Submitted>>> {
        submit_one_by_one(tasks, |task| self.submit(task)).await
    }

    /// Called with distinct ids, at least one. By default one
    /// [`claim`](Self::claim) per id, in order.
    async fn claim_many(&self, ids: &[TaskId], request: ClaimRequest) -> Result<Vec<Claim>> {
        claim_one_by_one(ids, request, |id, request| self.claim(id, request)).await
    }

    /// Called with leases of distinct tasks, at least one. By default one
    /// [`complete`](Self::complete) per lease, in order.
    async fn complete_many(&self, completions: Vec<(Lease, Response)>) -> Result<Vec<Result<Fenced<Task>>>> {
        complete_one_by_one(completions, |lease, response| self.complete(lease, response)).await
    }

    /// Called with a valid request. No default: handing each due task to
    /// one caller is the backend's own (a row lock skipped, a conditional
    /// write); [`rules::due_since`] and [`rules::wanted`] say which tasks are
    /// candidates and in what order, [`rules::claim`] decides each.
    async fn claim_next(&self, request: ClaimNext) -> Result<Vec<Lease>>;

    /// Called with leases of distinct tasks, at least one. By default one
    /// [`renew`](Self::renew) per lease, in order.
    async fn renew_many(&self, leases: &mut [Lease], extend_by: Duration) -> Result<Vec<Fenced<()>>> {
        renew_one_by_one(leases, extend_by, |lease, extend_by| self.renew(lease, extend_by)).await
    }

    /// Whether the backend stores concurrency keys and rate buckets and
    /// decides them in its claims ([`rules::admit`], [`rules::take_token`],
    /// [`rules::fair_order`]). `false` by default: a submission naming a
    /// limit is then refused with [`Error::Unsupported`] before the backend
    /// sees it, so no backend can ignore a limit by accident.
    fn decides_limits(&self) -> bool {
        false
    }

    /// [`TaskStore::define_bucket`], on validated input. By default
    /// [`Error::Unsupported`].
    async fn define_bucket(&self, bucket: RateBucket) -> Result<()> {
        let _ = bucket;
        Err(Error::Unsupported { what: "rate buckets" })
    }

    /// [`TaskStore::drain_bucket`], on validated input: decide with
    /// [`rules::drain`]. By default [`Error::Unsupported`].
    async fn drain_bucket(&self, name: &str, retry_after: Duration) -> Result<Option<BucketState>> {
        let _ = (name, retry_after);
        Err(Error::Unsupported { what: "rate buckets" })
    }
}

/// The operator's queries of a storage backend, on validated input:
/// implement this (beside [`Backend`]) and the type is an [`Inspect`].
///
/// ```
/// use taskfence::backend::InspectBackend;
/// fn assert_inspect<B: InspectBackend>() {}
/// assert_inspect::<taskfence::MemoryStore>();
/// ```
#[async_trait]
pub trait InspectBackend: Backend {
    /// [`Inspect::list`], on validated input.
    async fn list(&self, query: &TaskQuery) -> Result<Page>;
    /// [`Inspect::counts`], on validated input.
    async fn counts(&self, scope: Option<&str>) -> Result<Counts>;
    /// [`Inspect::counts_up_to`], on validated input.
    async fn counts_up_to(&self, scope: Option<&str>, cap: u64) -> Result<CappedCounts>;
    /// [`Inspect::story`], on validated input.
    async fn story(&self, id: TaskId) -> Result<Option<Story>>;
    /// [`Inspect::stranded`], on validated input.
    async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<TaskSummary>>;
    /// [`Inspect::buckets`]. By default none: a backend that does not
    /// [decide limits](Backend::decides_limits) cannot define one.
    async fn buckets(&self) -> Result<Vec<BucketState>> {
        Ok(Vec::new())
    }
    /// [`Inspect::depth`]. By default [`depth_from_listings`] on the local
    /// clock: a backend with a clock of its own answers on it (a database
    /// server's in one read, a configured clock through `depth_from_listings`).
    async fn depth(&self) -> Result<Vec<QueueDepth>> {
        depth_from_listings(self, OffsetDateTime::now_utc()).await
    }
    /// [`Inspect::concurrency`], on validated input. By default no slot in
    /// use and none waiting: a backend that does not decide limits refuses
    /// every task that names a key.
    async fn concurrency(&self, key: &str) -> Result<KeySlots> {
        Ok(KeySlots {
            key: key.to_owned(),
            running: Vec::new(),
            waiting: 0,
        })
    }
}

#[async_trait]
impl<B: Backend + ?Sized> TaskStore for B {
    async fn submit(&self, mut task: NewTask) -> Result<Submitted> {
        let span = entry::submit(&mut task)?;
        limits_decided(self, &task)?;
        Backend::submit(self, task).instrument(span).await
    }

    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        Backend::get(self, id).instrument(entry::get(id)).await
    }

    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        let span = entry::find(key)?;
        Backend::find(self, key).instrument(span).await
    }

    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        let span = entry::claim(id, &request)?;
        Backend::claim(self, id, request).instrument(span).await
    }

    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        let span = entry::renew(lease, extend_by)?;
        Backend::renew(self, lease, extend_by).instrument(span).await
    }

    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        let span = entry::complete(&lease, &response)?;
        Backend::complete(self, lease, response).instrument(span).await
    }

    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        let span = entry::fail(&lease, &failure)?;
        Backend::fail(self, lease, failure).instrument(span).await
    }

    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        let span = entry::release(&lease);
        Backend::release(self, lease).instrument(span).await
    }

    async fn release_unstarted(&self, lease: Lease) -> Result<Fenced<()>> {
        let span = entry::release_unstarted(&lease);
        Backend::release_unstarted(self, lease).instrument(span).await
    }

    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        let span = entry::cancel(id, reason)?;
        Backend::cancel(self, id, reason).instrument(span).await
    }

    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        let span = entry::record_operation(lease, operation_id)?;
        Backend::record_operation(self, lease, operation_id)
            .instrument(span)
            .await
    }

    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        Backend::attempts(self, id).instrument(entry::attempts(id)).await
    }

    async fn begin_effect(&self, lease: &Lease, name: &str) -> Result<Fenced<EffectStart>> {
        let span = entry::begin_effect(lease, name)?;
        Backend::begin_effect(self, lease, name).instrument(span).await
    }

    async fn finish_effect(
        &self,
        lease: &Lease,
        name: &str,
        outcome: EffectOutcome,
    ) -> Result<Fenced<Effect>> {
        let span = entry::finish_effect(lease, name, &outcome)?;
        Backend::finish_effect(self, lease, name, outcome)
            .instrument(span)
            .await
    }

    async fn effects(&self, id: TaskId) -> Result<Vec<Effect>> {
        Backend::effects(self, id).instrument(entry::effects(id)).await
    }

    async fn reopen(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>> {
        let span = entry::reopen(id, &request)?;
        Backend::reopen(self, id, request).instrument(span).await
    }

    async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
        let span = entry::due(limit)?;
        Backend::due(self, limit).instrument(span).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        let span = entry::purge_expired(limit)?;
        Backend::purge_expired(self, limit).instrument(span).await
    }

    async fn submit_many(&self, tasks: Vec<NewTask>) -> Result<Vec<Result<Submitted>>> {
        let span = entry::submit_many(&tasks)?;
        // Each submission checked alone: a refused one is its own answer,
        // and the backend decides the rest.
        let mut refused = Vec::with_capacity(tasks.len());
        let mut valid = Vec::with_capacity(tasks.len());
        for mut task in tasks {
            match entry::submission(&mut task)
                .map_err(Error::from)
                .and_then(|()| limits_decided(self, &task))
            {
                Ok(()) => {
                    refused.push(None);
                    valid.push(task);
                }
                Err(refusal) => refused.push(Some(refusal)),
            }
        }
        let decided = if valid.is_empty() {
            Vec::new()
        } else {
            Backend::submit_many(self, valid).instrument(span).await?
        };
        let mut decided = decided.into_iter();
        refused
            .into_iter()
            .map(|refusal| match refusal {
                Some(refusal) => Ok(Err(refusal)),
                None => decided
                    .next()
                    .ok_or_else(|| Error::storage(MissingAnswers("submit_many"))),
            })
            .collect()
    }

    async fn claim_many(&self, ids: &[TaskId], request: ClaimRequest) -> Result<Vec<Claim>> {
        let span = entry::claim_many(ids, &request)?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        Backend::claim_many(self, ids, request).instrument(span).await
    }

    async fn complete_many(&self, completions: Vec<(Lease, Response)>) -> Result<Vec<Result<Fenced<Task>>>> {
        let span = entry::complete_many(&completions)?;
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        Backend::complete_many(self, completions).instrument(span).await
    }

    async fn claim_next(&self, request: ClaimNext) -> Result<Vec<Lease>> {
        let span = entry::claim_next(&request)?;
        Backend::claim_next(self, request).instrument(span).await
    }

    async fn renew_many(&self, leases: &mut [Lease], extend_by: Duration) -> Result<Vec<Fenced<()>>> {
        let span = entry::renew_many(leases, extend_by)?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        Backend::renew_many(self, leases, extend_by)
            .instrument(span)
            .await
    }

    async fn define_bucket(&self, bucket: RateBucket) -> Result<()> {
        let span = entry::define_bucket(&bucket)?;
        Backend::define_bucket(self, bucket).instrument(span).await
    }

    async fn drain_bucket(&self, name: &str, retry_after: Duration) -> Result<Option<BucketState>> {
        let span = entry::drain_bucket(name, retry_after)?;
        Backend::drain_bucket(self, name, retry_after)
            .instrument(span)
            .await
    }
}

/// [`QueueDepth::tally`] at `now` of every page of pending and then of
/// running tasks ([`InspectBackend::list`] by status): a backend whose status
/// listing reads an index reads the backlog only. Pages are separate reads: a
/// task changing status meanwhile may be counted twice or not at all.
///
/// ```no_run
/// # async fn f(store: &taskfence::MemoryStore) -> taskfence::Result<()> {
/// let queues = taskfence::backend::depth_from_listings(store, time::OffsetDateTime::now_utc()).await?;
/// # Ok(()) }
/// ```
pub async fn depth_from_listings<B: InspectBackend + ?Sized>(
    backend: &B,
    now: OffsetDateTime,
) -> Result<Vec<QueueDepth>> {
    let mut live = Vec::new();
    for status in [Status::Pending, Status::Running] {
        let mut query = TaskQuery::new().status(status).limit(crate::limits::MAX_PAGE);
        loop {
            let page = backend.list(&query).await?;
            live.extend(page.tasks);
            match page.next {
                Some(cursor) => query = query.after(cursor),
                None => break,
            }
        }
    }
    Ok(QueueDepth::tally(&live, now))
}

#[async_trait]
impl<B: InspectBackend + ?Sized> Inspect for B {
    async fn list(&self, query: &TaskQuery) -> Result<Page> {
        let span = entry::list(query)?;
        InspectBackend::list(self, query).instrument(span).await
    }

    async fn counts(&self, scope: Option<&str>) -> Result<Counts> {
        let span = entry::counts(scope)?;
        InspectBackend::counts(self, scope).instrument(span).await
    }

    async fn counts_up_to(&self, scope: Option<&str>, cap: u64) -> Result<CappedCounts> {
        let span = entry::counts_up_to(scope, cap)?;
        InspectBackend::counts_up_to(self, scope, cap)
            .instrument(span)
            .await
    }

    async fn story(&self, id: TaskId) -> Result<Option<Story>> {
        InspectBackend::story(self, id).instrument(entry::story(id)).await
    }

    async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<TaskSummary>> {
        let span = entry::stranded(older_than, limit)?;
        InspectBackend::stranded(self, older_than, limit)
            .instrument(span)
            .await
    }

    async fn buckets(&self) -> Result<Vec<BucketState>> {
        InspectBackend::buckets(self)
            .instrument(entry::span("buckets", None))
            .await
    }

    async fn concurrency(&self, key: &str) -> Result<KeySlots> {
        let span = entry::concurrency(key)?;
        InspectBackend::concurrency(self, key).instrument(span).await
    }

    async fn depth(&self) -> Result<Vec<QueueDepth>> {
        InspectBackend::depth(self)
            .instrument(entry::span("depth", None))
            .await
    }
}

/// A backend's batch answered fewer items than it was given.
#[derive(Debug, thiserror::Error)]
#[error("{0}: the backend answered fewer items than it was given")]
struct MissingAnswers(&'static str);

/// One submission's answer within a batch: its own refusal (bad input, a
/// key reused with other inputs, limits the store does not decide) is its
/// entry; any other error ends the batch.
pub(crate) fn submission_answer(answer: Result<Submitted>) -> Result<Result<Submitted>> {
    match answer {
        Err(refused @ (Error::InvalidInput(_) | Error::KeyConflict { .. } | Error::Unsupported { .. })) => {
            Ok(Err(refused))
        }
        Err(other) => Err(other),
        Ok(submitted) => Ok(Ok(submitted)),
    }
}

/// A batch of submissions made of single submits, in order; each one's
/// refusal (bad input, a key conflict, an unsupported limit) is its own item (the default of
/// [`Backend::submit_many`] and [`TaskStore::submit_many`]).
///
/// ```
/// # async fn f(store: &dyn taskfence::TaskStore, batch: Vec<taskfence::NewTask>) -> taskfence::Result<()> {
/// let answers = taskfence::backend::submit_one_by_one(batch, |task| store.submit(task)).await?;
/// # Ok(()) }
/// ```
pub async fn submit_one_by_one<F, Fut>(tasks: Vec<NewTask>, mut submit: F) -> Result<Vec<Result<Submitted>>>
where
    F: FnMut(NewTask) -> Fut,
    Fut: Future<Output = Result<Submitted>>,
{
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(submission_answer(submit(task).await)?);
    }
    Ok(out)
}

/// Refuses a submission naming limits on a backend that does not decide
/// them: no store may ignore a limit.
fn limits_decided<B: Backend + ?Sized>(backend: &B, task: &NewTask) -> Result<()> {
    if task.limits.is_none() || backend.decides_limits() {
        return Ok(());
    }
    Err(Error::Unsupported {
        what: "concurrency keys and rate buckets",
    })
}

/// A batch of claims made of single claims, in order (the default of
/// [`Backend::claim_many`], and of wrappers that change `claim`).
///
/// ```
/// # async fn f(store: &dyn taskfence::TaskStore, ids: &[taskfence::TaskId]) -> taskfence::Result<()> {
/// let request = taskfence::ClaimRequest::new("w", std::time::Duration::from_secs(30));
/// let claims = taskfence::backend::claim_one_by_one(ids, request, |id, r| store.claim(id, r)).await?;
/// # Ok(()) }
/// ```
pub async fn claim_one_by_one<F, Fut>(
    ids: &[TaskId],
    request: ClaimRequest,
    mut claim: F,
) -> Result<Vec<Claim>>
where
    F: FnMut(TaskId, ClaimRequest) -> Fut,
    Fut: Future<Output = Result<Claim>>,
{
    let mut claims = Vec::with_capacity(ids.len());
    for &id in ids {
        claims.push(claim(id, request.clone()).await?);
    }
    Ok(claims)
}

/// A batch of completions made of single completions, in order; a task that
/// is gone is that item's `Err(Error::NotFound)` (the default of
/// [`Backend::complete_many`], and of wrappers that change `complete`).
///
/// ```
/// # async fn f(store: &dyn taskfence::TaskStore, batch: Vec<(taskfence::Lease, taskfence::Response)>) -> taskfence::Result<()> {
/// let saved = taskfence::backend::complete_one_by_one(batch, |l, r| store.complete(l, r)).await?;
/// # Ok(()) }
/// ```
pub async fn complete_one_by_one<F, Fut>(
    completions: Vec<(Lease, Response)>,
    mut complete: F,
) -> Result<Vec<Result<Fenced<Task>>>>
where
    F: FnMut(Lease, Response) -> Fut,
    Fut: Future<Output = Result<Fenced<Task>>>,
{
    let mut out = Vec::with_capacity(completions.len());
    for (lease, response) in completions {
        match complete(lease, response).await {
            Err(Error::NotFound(id)) => out.push(Err(Error::NotFound(id))),
            Err(e) => return Err(e),
            Ok(fenced) => out.push(Ok(fenced)),
        }
    }
    Ok(out)
}

/// A batch of renewals made of single renewals, in order (the default of
/// [`Backend::renew_many`], and of wrappers that change `renew`).
///
/// ```
/// # async fn f(store: &dyn taskfence::TaskStore, leases: &mut [taskfence::Lease]) -> taskfence::Result<()> {
/// let extend = std::time::Duration::from_secs(30);
/// let renewed = taskfence::backend::renew_one_by_one(leases, extend, |l, d| store.renew(l, d)).await?;
/// # Ok(()) }
/// ```
pub async fn renew_one_by_one<'l, F, Fut>(
    leases: &'l mut [Lease],
    extend_by: Duration,
    mut renew: F,
) -> Result<Vec<Fenced<()>>>
where
    F: FnMut(&'l mut Lease, Duration) -> Fut,
    Fut: Future<Output = Result<Fenced<()>>>,
{
    let mut out = Vec::with_capacity(leases.len());
    for lease in leases {
        out.push(renew(lease, extend_by).await?);
    }
    Ok(out)
}

/// A task as `new` is stored when submitted: pending, never claimed, its
/// retry budget starting at `created_at`, kept until `expires_at`. Every
/// backend builds its new tasks with this, so they agree on what one is.
///
/// ```
/// use taskfence::{InputHash, NewTask, RequestKey, Status, TaskId};
/// let now = time::OffsetDateTime::now_utc();
/// let new = NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]));
/// let task = taskfence::backend::new_task(TaskId::new(), new, now, now + NewTask::DEFAULT_RETENTION);
/// assert_eq!((task.status, task.version), (Status::Pending, 0));
/// ```
pub fn new_task(id: TaskId, new: NewTask, created_at: OffsetDateTime, expires_at: OffsetDateTime) -> Task {
    Task::submitted(id, new, created_at, expires_at)
}

/// The lease a successful claim hands back: `task` as the claim left it
/// (status `Running`, version incremented), the attempt, the worker and the
/// lease's expiry on the store's clock.
///
/// ```
/// # fn f(task: taskfence::Task) {
/// let until = task.lease_until.expect("a running task has a lease");
/// let lease = taskfence::backend::new_lease(task, taskfence::task::AttemptId::new(), "w".into(), until);
/// # }
/// ```
pub fn new_lease(task: Task, attempt_id: AttemptId, worker: String, expires_at: OffsetDateTime) -> Lease {
    Lease::new(task, attempt_id, worker, expires_at)
}

/// Records a renewal's new expiry in the caller's lease.
///
/// ```
/// # fn f(lease: &mut taskfence::Lease) {
/// taskfence::backend::renewed(lease, time::OffsetDateTime::now_utc());
/// # }
/// ```
pub fn renewed(lease: &mut Lease, expires_at: OffsetDateTime) {
    lease.set_expires_at(expires_at);
}

/// A jitter draw in `[0, 1)` derived from an attempt id, so backends need no
/// random number generator and a replay of the same attempt computes the same
/// delay.
///
/// The draw is a hash of the whole id, not its "random" bits: ids made in the
/// same millisecond by one process carry a counter where UUID v7 leaves room
/// for randomness, so reading those bits would give attempts that fail
/// together (a batch hitting one 429) nearly the same delay. Hashing spreads
/// back-to-back ids uniformly over the range.
///
/// ```
/// use taskfence::backend::jitter_unit;
/// let u = jitter_unit(taskfence::task::AttemptId::new());
/// assert!((0.0..1.0).contains(&u));
/// ```
pub fn jitter_unit(attempt: AttemptId) -> f64 {
    let digest = Sha256::digest(attempt.as_uuid().as_bytes());
    let word = u64::from_be_bytes(digest[..8].try_into().expect("a SHA-256 digest has 32 bytes"));
    // 53 bits: exactly representable in an f64, so the result stays below 1.
    (word >> 11) as f64 / (1u64 << 53) as f64
}
