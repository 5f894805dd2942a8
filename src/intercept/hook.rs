//! [`Intercept`]: the hooks an [`Intercepted`] store calls, each forwarding
//! to the wrapped store unless overridden.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{claim_one_by_one, complete_one_by_one, entry, renew_one_by_one};
use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::Result;
use crate::inspect::{CappedCounts, Counts, Inspect, Page, QueueDepth, Story, TaskQuery, TaskSummary};
use crate::policy::Failure;
use crate::store::{
    Attempt, Claim, ClaimNext, ClaimRequest, Fenced, Lease, ReopenRequest, Retry, Submitted, TaskStore,
};
use crate::task::{NewTask, RequestKey, Response, Task, TaskId};
use crate::throttle::{BucketState, KeySlots, RateBucket};

#[cfg(doc)]
use super::Intercepted;
use super::{Call, Outcome};

/// A call's future, as [`Intercept::around`] receives it.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// The calls an [`Intercepted`] store may handle itself, and the hook around
/// every call. Every method has a default: the operations forward to
/// `inner`, the wrapped store; [`around`](Self::around) just runs the call.
///
/// ```
/// use taskfence::intercept::Intercept;
///
/// /// Forwards everything: a wrapper that changes nothing.
/// struct PassThrough;
/// impl Intercept for PassThrough {}
/// ```
#[async_trait]
pub trait Intercept: Send + Sync {
    /// Runs around every operation, once its hook (below) was chosen: `call`
    /// says which operation and what it names, `run` performs it. The answer
    /// (or error) it returns is the caller's. The default runs the call.
    ///
    /// ```
    /// use taskfence::intercept::{Call, Intercept, Outcome, Pending};
    ///
    /// /// Logs every call's outcome.
    /// struct Log;
    /// #[async_trait::async_trait]
    /// impl Intercept for Log {
    ///     async fn around<'a, T: Outcome + Send + 'a>(&'a self, call: Call, run: Pending<'a, T>) -> taskfence::Result<T> {
    ///         let answer = run.await;
    ///         if let Ok(answer) = &answer {
    ///             println!("{} -> {}", call.operation, answer.summary().0);
    ///         }
    ///         answer
    ///     }
    /// }
    /// ```
    async fn around<'a, T: Outcome + Send + 'a>(&'a self, call: Call, run: Pending<'a, T>) -> Result<T> {
        let _ = call;
        run.await
    }

    /// [`TaskStore::submit`]; forwards to `inner` unless overridden.
    async fn submit(&self, inner: &dyn TaskStore, task: NewTask) -> Result<Submitted> {
        inner.submit(task).await
    }
    /// [`TaskStore::get`]; forwards to `inner` unless overridden.
    async fn get(&self, inner: &dyn TaskStore, id: TaskId) -> Result<Option<Task>> {
        inner.get(id).await
    }
    /// [`TaskStore::find`]; forwards to `inner` unless overridden.
    async fn find(&self, inner: &dyn TaskStore, key: &RequestKey) -> Result<Option<Task>> {
        inner.find(key).await
    }
    /// [`TaskStore::claim`]; forwards to `inner` unless overridden.
    async fn claim(&self, inner: &dyn TaskStore, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        inner.claim(id, request).await
    }
    /// [`TaskStore::renew`]; forwards to `inner` unless overridden.
    async fn renew(
        &self,
        inner: &dyn TaskStore,
        lease: &mut Lease,
        extend_by: Duration,
    ) -> Result<Fenced<()>> {
        inner.renew(lease, extend_by).await
    }
    /// [`TaskStore::complete`]; forwards to `inner` unless overridden.
    async fn complete(
        &self,
        inner: &dyn TaskStore,
        lease: Lease,
        response: Response,
    ) -> Result<Fenced<Task>> {
        inner.complete(lease, response).await
    }
    /// [`TaskStore::fail`]; forwards to `inner` unless overridden.
    async fn fail(&self, inner: &dyn TaskStore, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        inner.fail(lease, failure).await
    }
    /// [`TaskStore::release`]; forwards to `inner` unless overridden.
    async fn release(&self, inner: &dyn TaskStore, lease: Lease) -> Result<Fenced<()>> {
        inner.release(lease).await
    }
    /// [`TaskStore::release_unstarted`]; forwards to `inner` unless overridden.
    async fn release_unstarted(&self, inner: &dyn TaskStore, lease: Lease) -> Result<Fenced<()>> {
        inner.release_unstarted(lease).await
    }
    /// [`TaskStore::cancel`]; forwards to `inner` unless overridden.
    async fn cancel(&self, inner: &dyn TaskStore, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        inner.cancel(id, reason).await
    }
    /// [`TaskStore::record_operation`]; forwards to `inner` unless overridden.
    async fn record_operation(
        &self,
        inner: &dyn TaskStore,
        lease: &Lease,
        operation_id: &str,
    ) -> Result<Fenced<()>> {
        inner.record_operation(lease, operation_id).await
    }
    /// [`TaskStore::attempts`]; forwards to `inner` unless overridden.
    async fn attempts(&self, inner: &dyn TaskStore, id: TaskId) -> Result<Vec<Attempt>> {
        inner.attempts(id).await
    }
    /// [`TaskStore::begin_effect`]; forwards to `inner` unless overridden.
    async fn begin_effect(
        &self,
        inner: &dyn TaskStore,
        lease: &Lease,
        name: &str,
    ) -> Result<Fenced<EffectStart>> {
        inner.begin_effect(lease, name).await
    }
    /// [`TaskStore::finish_effect`]; forwards to `inner` unless overridden.
    async fn finish_effect(
        &self,
        inner: &dyn TaskStore,
        lease: &Lease,
        name: &str,
        outcome: EffectOutcome,
    ) -> Result<Fenced<Effect>> {
        inner.finish_effect(lease, name, outcome).await
    }
    /// [`TaskStore::effects`]; forwards to `inner` unless overridden.
    async fn effects(&self, inner: &dyn TaskStore, id: TaskId) -> Result<Vec<Effect>> {
        inner.effects(id).await
    }
    /// [`TaskStore::reopen`]; forwards to `inner` unless overridden.
    async fn reopen(
        &self,
        inner: &dyn TaskStore,
        id: TaskId,
        request: ReopenRequest,
    ) -> Result<Fenced<Task>> {
        inner.reopen(id, request).await
    }
    /// [`TaskStore::due`]; forwards to `inner` unless overridden.
    async fn due(&self, inner: &dyn TaskStore, limit: usize) -> Result<Vec<TaskId>> {
        inner.due(limit).await
    }
    /// [`TaskStore::purge_expired`]; forwards to `inner` unless overridden.
    async fn purge_expired(&self, inner: &dyn TaskStore, limit: usize) -> Result<u64> {
        inner.purge_expired(limit).await
    }
    /// By default one [`claim`](Self::claim) per task, so a wrapper that
    /// changes `claim` changes batches too; override it to keep the wrapped
    /// store's native batch (`inner.claim_many`).
    async fn claim_many(
        &self,
        inner: &dyn TaskStore,
        ids: &[TaskId],
        request: ClaimRequest,
    ) -> Result<Vec<Claim>> {
        entry::claim_many(ids, &request)?;
        claim_one_by_one(ids, request, |id, request| self.claim(inner, id, request)).await
    }
    /// By default one [`complete`](Self::complete) per lease, so a wrapper
    /// that writes its own rows on completion does so for batches too;
    /// override it to keep the wrapped store's native batch.
    async fn complete_many(
        &self,
        inner: &dyn TaskStore,
        completions: Vec<(Lease, Response)>,
    ) -> Result<Vec<Result<Fenced<Task>>>> {
        entry::complete_many(&completions)?;
        complete_one_by_one(completions, |lease, response| {
            self.complete(inner, lease, response)
        })
        .await
    }
    /// [`TaskStore::claim_next`]; forwards to `inner` unless overridden.
    async fn claim_next(&self, inner: &dyn TaskStore, request: ClaimNext) -> Result<Vec<Lease>> {
        inner.claim_next(request).await
    }
    /// By default one [`renew`](Self::renew) per lease, so a wrapper that
    /// changes `renew` changes batches too; override it to keep the wrapped
    /// store's native batch.
    async fn renew_many(
        &self,
        inner: &dyn TaskStore,
        leases: &mut [Lease],
        extend_by: Duration,
    ) -> Result<Vec<Fenced<()>>> {
        entry::renew_many(leases, extend_by)?;
        renew_one_by_one(leases, extend_by, |lease, extend_by| {
            self.renew(inner, lease, extend_by)
        })
        .await
    }
    /// [`TaskStore::define_bucket`]; forwards to `inner` unless overridden.
    async fn define_bucket(&self, inner: &dyn TaskStore, bucket: RateBucket) -> Result<()> {
        inner.define_bucket(bucket).await
    }
    /// [`TaskStore::drain_bucket`]; forwards to `inner` unless overridden.
    async fn drain_bucket(
        &self,
        inner: &dyn TaskStore,
        name: &str,
        retry_after: Duration,
    ) -> Result<Option<BucketState>> {
        inner.drain_bucket(name, retry_after).await
    }
    /// [`Inspect::list`]; forwards to `inner` unless overridden.
    async fn list(&self, inner: &dyn Inspect, query: &TaskQuery) -> Result<Page> {
        inner.list(query).await
    }
    /// [`Inspect::counts`]; forwards to `inner` unless overridden.
    async fn counts(&self, inner: &dyn Inspect, scope: Option<&str>) -> Result<Counts> {
        inner.counts(scope).await
    }
    /// [`Inspect::counts_up_to`]; forwards to `inner` unless overridden.
    async fn counts_up_to(&self, inner: &dyn Inspect, scope: Option<&str>, cap: u64) -> Result<CappedCounts> {
        inner.counts_up_to(scope, cap).await
    }
    /// [`Inspect::story`]; forwards to `inner` unless overridden.
    async fn story(&self, inner: &dyn Inspect, id: TaskId) -> Result<Option<Story>> {
        inner.story(id).await
    }
    /// [`Inspect::stranded`]; forwards to `inner` unless overridden.
    async fn stranded(
        &self,
        inner: &dyn Inspect,
        older_than: Duration,
        limit: usize,
    ) -> Result<Vec<TaskSummary>> {
        inner.stranded(older_than, limit).await
    }
    /// [`Inspect::buckets`]; forwards to `inner` unless overridden.
    async fn buckets(&self, inner: &dyn Inspect) -> Result<Vec<BucketState>> {
        inner.buckets().await
    }
    /// [`Inspect::concurrency`]; forwards to `inner` unless overridden.
    async fn concurrency(&self, inner: &dyn Inspect, key: &str) -> Result<KeySlots> {
        inner.concurrency(key).await
    }
    /// [`Inspect::depth`]; forwards to `inner` unless overridden.
    async fn depth(&self, inner: &dyn Inspect) -> Result<Vec<QueueDepth>> {
        inner.depth().await
    }
}
