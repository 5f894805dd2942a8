//! [`Intercepted`]: the wrapper, forwarding each [`TaskStore`] and
//! [`Inspect`] call through its [`Intercept`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::Result;
use crate::inspect::{CappedCounts, Counts, Inspect, Page, QueueDepth, Story, TaskQuery, TaskSummary};
use crate::policy::Failure;
use crate::store::{
    Attempt, Claim, ClaimNext, ClaimRequest, Fenced, Lease, ReopenRequest, Retry, Submitted, TaskStore,
};
use crate::task::{NewTask, RequestKey, Response, Task, TaskId};
use crate::throttle::{BucketState, KeySlots, RateBucket};

use super::{Call, Inner, InnerInspect, Intercept};

/// A store that forwards to `inner` through an [`Intercept`]. Cheap to
/// clone (an `Arc` and the interceptor); share it as `Arc<dyn TaskStore>`.
///
/// ```
/// use std::sync::Arc;
/// use taskfence::intercept::{Intercept, Intercepted};
/// use taskfence::{MemoryStore, TaskStore};
///
/// struct PassThrough;
/// impl Intercept for PassThrough {}
///
/// let store: Arc<dyn TaskStore> = Arc::new(Intercepted::new(Arc::new(MemoryStore::new()), PassThrough));
/// ```
pub struct Intercepted<S: ?Sized, I> {
    inner: Arc<S>,
    interceptor: I,
}

impl<S: ?Sized, I> Intercepted<S, I> {
    /// Wraps `inner`; `interceptor` sees every call first.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # struct PassThrough;
    /// # impl taskfence::intercept::Intercept for PassThrough {}
    /// let store = taskfence::intercept::Intercepted::new(Arc::new(taskfence::MemoryStore::new()), PassThrough);
    /// ```
    pub fn new(inner: Arc<S>, interceptor: I) -> Self {
        Self { inner, interceptor }
    }

    /// The wrapped store, with its own type: calls made on it directly are
    /// not intercepted.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # struct PassThrough;
    /// # impl taskfence::intercept::Intercept for PassThrough {}
    /// # let store = taskfence::intercept::Intercepted::new(Arc::new(taskfence::MemoryStore::new()), PassThrough);
    /// let inner: &Arc<taskfence::MemoryStore> = store.inner();
    /// assert_eq!(inner.record_count(), 0);
    /// ```
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// The interceptor (to read what it counted, or to arm a fault).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # struct PassThrough;
    /// # impl taskfence::intercept::Intercept for PassThrough {}
    /// # let store = taskfence::intercept::Intercepted::new(Arc::new(taskfence::MemoryStore::new()), PassThrough);
    /// let _: &PassThrough = store.interceptor();
    /// ```
    pub fn interceptor(&self) -> &I {
        &self.interceptor
    }
}

impl<S: ?Sized, I: Clone> Clone for Intercepted<S, I> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            interceptor: self.interceptor.clone(),
        }
    }
}

impl<S: ?Sized, I: std::fmt::Debug> std::fmt::Debug for Intercepted<S, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intercepted")
            .field("interceptor", &self.interceptor)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<S: Inner + ?Sized, I: Intercept> TaskStore for Intercepted<S, I> {
    async fn submit(&self, task: NewTask) -> Result<Submitted> {
        let hooks = &self.interceptor;
        let call = Call::new("submit").key(&task.key);
        hooks
            .around(call, Box::pin(hooks.submit(self.inner.store(), task)))
            .await
    }
    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        let hooks = &self.interceptor;
        let run = hooks.get(self.inner.store(), id);
        hooks.around(Call::new("get").task(id), Box::pin(run)).await
    }
    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        let hooks = &self.interceptor;
        let run = hooks.find(self.inner.store(), key);
        hooks.around(Call::new("find").key(key), Box::pin(run)).await
    }
    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        let hooks = &self.interceptor;
        let run = hooks.claim(self.inner.store(), id, request);
        hooks.around(Call::new("claim").task(id), Box::pin(run)).await
    }
    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        let hooks = &self.interceptor;
        let call = Call::new("renew").lease(lease);
        hooks
            .around(call, Box::pin(hooks.renew(self.inner.store(), lease, extend_by)))
            .await
    }
    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        let hooks = &self.interceptor;
        let call = Call::new("complete").lease(&lease);
        hooks
            .around(
                call,
                Box::pin(hooks.complete(self.inner.store(), lease, response)),
            )
            .await
    }
    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        let hooks = &self.interceptor;
        let call = Call::new("fail").lease(&lease);
        hooks
            .around(call, Box::pin(hooks.fail(self.inner.store(), lease, failure)))
            .await
    }
    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        let hooks = &self.interceptor;
        let call = Call::new("release").lease(&lease);
        hooks
            .around(call, Box::pin(hooks.release(self.inner.store(), lease)))
            .await
    }
    async fn release_unstarted(&self, lease: Lease) -> Result<Fenced<()>> {
        let hooks = &self.interceptor;
        let call = Call::new("release_unstarted").lease(&lease);
        hooks
            .around(call, Box::pin(hooks.release_unstarted(self.inner.store(), lease)))
            .await
    }
    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        let hooks = &self.interceptor;
        let run = hooks.cancel(self.inner.store(), id, reason);
        hooks.around(Call::new("cancel").task(id), Box::pin(run)).await
    }
    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        let hooks = &self.interceptor;
        let run = hooks.record_operation(self.inner.store(), lease, operation_id);
        hooks
            .around(Call::new("record_operation").lease(lease), Box::pin(run))
            .await
    }
    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        let hooks = &self.interceptor;
        let run = hooks.attempts(self.inner.store(), id);
        hooks.around(Call::new("attempts").task(id), Box::pin(run)).await
    }
    async fn begin_effect(&self, lease: &Lease, name: &str) -> Result<Fenced<EffectStart>> {
        let hooks = &self.interceptor;
        let run = hooks.begin_effect(self.inner.store(), lease, name);
        hooks
            .around(Call::new("begin_effect").lease(lease), Box::pin(run))
            .await
    }
    async fn finish_effect(
        &self,
        lease: &Lease,
        name: &str,
        outcome: EffectOutcome,
    ) -> Result<Fenced<Effect>> {
        let hooks = &self.interceptor;
        let run = hooks.finish_effect(self.inner.store(), lease, name, outcome);
        hooks
            .around(Call::new("finish_effect").lease(lease), Box::pin(run))
            .await
    }
    async fn effects(&self, id: TaskId) -> Result<Vec<Effect>> {
        let hooks = &self.interceptor;
        let run = hooks.effects(self.inner.store(), id);
        hooks.around(Call::new("effects").task(id), Box::pin(run)).await
    }
    async fn reopen(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>> {
        let hooks = &self.interceptor;
        let run = hooks.reopen(self.inner.store(), id, request);
        hooks.around(Call::new("reopen").task(id), Box::pin(run)).await
    }
    async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
        let hooks = &self.interceptor;
        let run = hooks.due(self.inner.store(), limit);
        hooks.around(Call::new("due"), Box::pin(run)).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        let hooks = &self.interceptor;
        let run = hooks.purge_expired(self.inner.store(), limit);
        hooks.around(Call::new("purge_expired"), Box::pin(run)).await
    }
    async fn claim_many(&self, ids: &[TaskId], request: ClaimRequest) -> Result<Vec<Claim>> {
        let hooks = &self.interceptor;
        let run = hooks.claim_many(self.inner.store(), ids, request);
        hooks
            .around(Call::new("claim_many").batch(ids.len()), Box::pin(run))
            .await
    }
    async fn complete_many(&self, completions: Vec<(Lease, Response)>) -> Result<Vec<Result<Fenced<Task>>>> {
        let hooks = &self.interceptor;
        let n = completions.len();
        let run = hooks.complete_many(self.inner.store(), completions);
        hooks
            .around(Call::new("complete_many").batch(n), Box::pin(run))
            .await
    }
    async fn claim_next(&self, request: ClaimNext) -> Result<Vec<Lease>> {
        let hooks = &self.interceptor;
        let call = Call::new("claim_next").batch(request.limit);
        let run = hooks.claim_next(self.inner.store(), request);
        hooks.around(call, Box::pin(run)).await
    }
    async fn renew_many(&self, leases: &mut [Lease], extend_by: Duration) -> Result<Vec<Fenced<()>>> {
        let hooks = &self.interceptor;
        let call = Call::new("renew_many").batch(leases.len());
        let run = hooks.renew_many(self.inner.store(), leases, extend_by);
        hooks.around(call, Box::pin(run)).await
    }
    async fn define_bucket(&self, bucket: RateBucket) -> Result<()> {
        let hooks = &self.interceptor;
        let run = hooks.define_bucket(self.inner.store(), bucket);
        hooks.around(Call::new("define_bucket"), Box::pin(run)).await
    }
    async fn drain_bucket(&self, name: &str, retry_after: Duration) -> Result<Option<BucketState>> {
        let hooks = &self.interceptor;
        let run = hooks.drain_bucket(self.inner.store(), name, retry_after);
        hooks.around(Call::new("drain_bucket"), Box::pin(run)).await
    }
}

#[async_trait]
impl<S: InnerInspect + ?Sized, I: Intercept> Inspect for Intercepted<S, I> {
    async fn list(&self, query: &TaskQuery) -> Result<Page> {
        let hooks = &self.interceptor;
        let run = hooks.list(self.inner.inspector(), query);
        let call = Call::new("list").scope(query.scope.as_deref());
        hooks.around(call, Box::pin(run)).await
    }
    async fn counts(&self, scope: Option<&str>) -> Result<Counts> {
        let hooks = &self.interceptor;
        let run = hooks.counts(self.inner.inspector(), scope);
        hooks
            .around(Call::new("counts").scope(scope), Box::pin(run))
            .await
    }
    async fn counts_up_to(&self, scope: Option<&str>, cap: u64) -> Result<CappedCounts> {
        let hooks = &self.interceptor;
        let run = hooks.counts_up_to(self.inner.inspector(), scope, cap);
        hooks
            .around(Call::new("counts_up_to").scope(scope), Box::pin(run))
            .await
    }
    async fn story(&self, id: TaskId) -> Result<Option<Story>> {
        let hooks = &self.interceptor;
        let run = hooks.story(self.inner.inspector(), id);
        hooks.around(Call::new("story").task(id), Box::pin(run)).await
    }
    async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<TaskSummary>> {
        let hooks = &self.interceptor;
        let run = hooks.stranded(self.inner.inspector(), older_than, limit);
        hooks.around(Call::new("stranded"), Box::pin(run)).await
    }
    async fn buckets(&self) -> Result<Vec<BucketState>> {
        let hooks = &self.interceptor;
        let run = hooks.buckets(self.inner.inspector());
        hooks.around(Call::new("buckets"), Box::pin(run)).await
    }
    async fn concurrency(&self, key: &str) -> Result<KeySlots> {
        let hooks = &self.interceptor;
        let run = hooks.concurrency(self.inner.inspector(), key);
        hooks.around(Call::new("concurrency"), Box::pin(run)).await
    }

    async fn depth(&self) -> Result<Vec<QueueDepth>> {
        let hooks = &self.interceptor;
        let run = hooks.depth(self.inner.inspector());
        hooks.around(Call::new("depth"), Box::pin(run)).await
    }
}
