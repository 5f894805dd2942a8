//! [`Intercepted`]: a [`TaskStore`] that passes every call through to another
//! store, except the calls an [`Intercept`] chooses to handle itself.
//!
//! Why: wrapping a store is how an application adds behaviour around the
//! contract without a backend of its own — writing its reply rows in the
//! completion's transaction, moving a consumer position with it, counting
//! calls — and how a test injects a fault (stall a renewal, lose a reply,
//! accept what the real store would refuse). Implement only the methods you
//! change; every other one forwards, so a method added to [`TaskStore`] later
//! forwards too instead of breaking (or silently skipping) every wrapper.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::time::Duration;
//! use taskfence::intercept::{Intercept, Intercepted};
//! use taskfence::*;
//!
//! /// Counts completions; everything else passes through untouched.
//! #[derive(Default)]
//! struct CountCompletions(AtomicU64);
//!
//! #[async_trait::async_trait]
//! impl Intercept for CountCompletions {
//!     async fn complete(&self, inner: &dyn TaskStore, lease: Lease, response: Response) -> Result<Fenced<Task>> {
//!         self.0.fetch_add(1, Ordering::Relaxed);
//!         inner.complete(lease, response).await
//!     }
//! }
//!
//! let store = Intercepted::new(Arc::new(MemoryStore::new()), CountCompletions::default());
//! let task = store
//!     .submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"])))
//!     .await?
//!     .into_task();
//! let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await? else {
//!     unreachable!()
//! };
//! store.complete(lease, Response::from("hi")).await?;
//! assert_eq!(store.interceptor().0.load(Ordering::Relaxed), 1);
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::policy::Failure;
use crate::store::{
    Attempt, Claim, ClaimRequest, Fenced, Lease, Result, Retry, RetryRequest, Submitted, TaskStore,
    claim_one_by_one, complete_one_by_one,
};
use crate::task::{NewTask, RequestKey, Response, Task, TaskId};

/// The calls an [`Intercepted`] store may handle itself. Every method has a
/// default that forwards to `inner`, the wrapped store; override the ones to
/// change and call `inner` (or not) from them.
///
/// ```
/// use taskfence::intercept::Intercept;
///
/// /// Forwards everything: a wrapper that changes nothing.
/// struct PassThrough;
/// impl Intercept for PassThrough {}
/// ```
#[async_trait]
#[allow(missing_docs)] // each method is the TaskStore method of the same name
pub trait Intercept: Send + Sync {
    async fn submit(&self, inner: &dyn TaskStore, task: NewTask) -> Result<Submitted> {
        inner.submit(task).await
    }
    async fn get(&self, inner: &dyn TaskStore, id: TaskId) -> Result<Option<Task>> {
        inner.get(id).await
    }
    async fn find(&self, inner: &dyn TaskStore, key: &RequestKey) -> Result<Option<Task>> {
        inner.find(key).await
    }
    async fn claim(&self, inner: &dyn TaskStore, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        inner.claim(id, request).await
    }
    async fn renew(
        &self,
        inner: &dyn TaskStore,
        lease: &mut Lease,
        extend_by: Duration,
    ) -> Result<Fenced<()>> {
        inner.renew(lease, extend_by).await
    }
    async fn complete(
        &self,
        inner: &dyn TaskStore,
        lease: Lease,
        response: Response,
    ) -> Result<Fenced<Task>> {
        inner.complete(lease, response).await
    }
    async fn fail(&self, inner: &dyn TaskStore, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        inner.fail(lease, failure).await
    }
    async fn release(&self, inner: &dyn TaskStore, lease: Lease) -> Result<Fenced<()>> {
        inner.release(lease).await
    }
    async fn cancel(&self, inner: &dyn TaskStore, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        inner.cancel(id, reason).await
    }
    async fn record_operation(
        &self,
        inner: &dyn TaskStore,
        lease: &Lease,
        operation_id: &str,
    ) -> Result<Fenced<()>> {
        inner.record_operation(lease, operation_id).await
    }
    async fn attempts(&self, inner: &dyn TaskStore, id: TaskId) -> Result<Vec<Attempt>> {
        inner.attempts(id).await
    }
    async fn retry(&self, inner: &dyn TaskStore, id: TaskId, request: RetryRequest) -> Result<Fenced<Task>> {
        inner.retry(id, request).await
    }
    async fn due(&self, inner: &dyn TaskStore, limit: usize) -> Result<Vec<TaskId>> {
        inner.due(limit).await
    }
    async fn purge_expired(&self, inner: &dyn TaskStore, limit: usize) -> Result<u64> {
        inner.purge_expired(limit).await
    }
    /// By default one [`claim`](Self::claim) per task, so a wrapper that
    /// changes `claim` changes batches too; override it to batch natively.
    async fn claim_many(
        &self,
        inner: &dyn TaskStore,
        ids: &[TaskId],
        request: ClaimRequest,
    ) -> Result<Vec<Claim>> {
        claim_one_by_one(ids, request, |id, request| self.claim(inner, id, request)).await
    }
    /// By default one [`complete`](Self::complete) per lease, so a wrapper
    /// that writes its own rows on completion does so for batches too.
    async fn complete_many(
        &self,
        inner: &dyn TaskStore,
        completions: Vec<(Lease, Response)>,
    ) -> Result<Vec<Result<Fenced<Task>>>> {
        complete_one_by_one(completions, |lease, response| {
            self.complete(inner, lease, response)
        })
        .await
    }
}

/// A store that forwards to `inner` through an [`Intercept`]. Cheap to share
/// as `Arc<dyn TaskStore>`.
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
#[derive(Clone)]
pub struct Intercepted<I> {
    inner: Arc<dyn TaskStore>,
    interceptor: I,
}

impl<I> Intercepted<I> {
    /// Wraps `inner`; `interceptor` sees every call first.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # struct PassThrough;
    /// # impl taskfence::intercept::Intercept for PassThrough {}
    /// let store = taskfence::intercept::Intercepted::new(Arc::new(taskfence::MemoryStore::new()), PassThrough);
    /// ```
    pub fn new(inner: Arc<dyn TaskStore>, interceptor: I) -> Self {
        Self { inner, interceptor }
    }

    /// The wrapped store.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # struct PassThrough;
    /// # impl taskfence::intercept::Intercept for PassThrough {}
    /// # let store = taskfence::intercept::Intercepted::new(Arc::new(taskfence::MemoryStore::new()), PassThrough);
    /// let inner: &Arc<dyn taskfence::TaskStore> = store.inner();
    /// ```
    pub fn inner(&self) -> &Arc<dyn TaskStore> {
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

impl<I: std::fmt::Debug> std::fmt::Debug for Intercepted<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intercepted")
            .field("interceptor", &self.interceptor)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<I: Intercept> TaskStore for Intercepted<I> {
    async fn submit(&self, task: NewTask) -> Result<Submitted> {
        self.interceptor.submit(&*self.inner, task).await
    }
    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        self.interceptor.get(&*self.inner, id).await
    }
    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        self.interceptor.find(&*self.inner, key).await
    }
    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        self.interceptor.claim(&*self.inner, id, request).await
    }
    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        self.interceptor.renew(&*self.inner, lease, extend_by).await
    }
    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        self.interceptor.complete(&*self.inner, lease, response).await
    }
    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        self.interceptor.fail(&*self.inner, lease, failure).await
    }
    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        self.interceptor.release(&*self.inner, lease).await
    }
    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        self.interceptor.cancel(&*self.inner, id, reason).await
    }
    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        self.interceptor
            .record_operation(&*self.inner, lease, operation_id)
            .await
    }
    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        self.interceptor.attempts(&*self.inner, id).await
    }
    async fn retry(&self, id: TaskId, request: RetryRequest) -> Result<Fenced<Task>> {
        self.interceptor.retry(&*self.inner, id, request).await
    }
    async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
        self.interceptor.due(&*self.inner, limit).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        self.interceptor.purge_expired(&*self.inner, limit).await
    }
    async fn claim_many(&self, ids: &[TaskId], request: ClaimRequest) -> Result<Vec<Claim>> {
        self.interceptor.claim_many(&*self.inner, ids, request).await
    }
    async fn complete_many(&self, completions: Vec<(Lease, Response)>) -> Result<Vec<Result<Fenced<Task>>>> {
        self.interceptor.complete_many(&*self.inner, completions).await
    }
}
