//! [`WorkContext`]: what the work function gets — the task, its lease, the
//! lease-lost signal — and the fenced writes it may make under the lease.

use std::sync::Arc;

use tokio::sync::watch;

use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::Result;
use crate::store::{Fenced, Lease, TaskStore};
use crate::task::Task;

/// What the work function gets: the task, its lease, the lease-lost signal,
/// and a way to record the provider's operation id.
///
/// ```
/// use taskfence::{runtime::WorkContext, Failure, Response};
/// async fn work(ctx: WorkContext) -> Result<Response, Failure> {
///     tokio::select! {
///         // the provider call
///         answer = async { Ok(Response::from("…")) } => answer,
///         // another worker owns the task now: stop paying for this call
///         _ = ctx.lease_lost() => Err(Failure::retryable("lease lost")),
///     }
/// }
/// ```
#[derive(Clone)]
pub struct WorkContext {
    pub(super) store: Arc<dyn TaskStore>,
    pub(super) lease: Lease,
    pub(super) lost: watch::Receiver<bool>,
}

impl std::fmt::Debug for WorkContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkContext")
            .field("lease", &self.lease)
            .field("lease_lost", &self.is_lease_lost())
            .finish_non_exhaustive()
    }
}

impl WorkContext {
    /// The task as claimed: payload, policy, attempts.
    ///
    /// ```
    /// # fn f(ctx: taskfence::runtime::WorkContext) {
    /// let input = &ctx.task().payload;
    /// # }
    /// ```
    pub fn task(&self) -> &Task {
        self.lease.task()
    }

    /// The lease as granted (its expiry is the first one; renewals move it on
    /// in the store).
    ///
    /// ```
    /// # fn f(ctx: taskfence::runtime::WorkContext) {
    /// println!("attempt {} of task {}", ctx.lease().attempt(), ctx.lease().task_id());
    /// # }
    /// ```
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Resolves once the lease is lost. Race the provider call against it.
    ///
    /// ```
    /// # async fn f(ctx: taskfence::runtime::WorkContext) {
    /// ctx.lease_lost().await;
    /// assert!(ctx.is_lease_lost());
    /// # }
    /// ```
    pub async fn lease_lost(&self) {
        let mut lost = self.lost.clone();
        // An error means the runtime dropped the sender: this work is abandoned too.
        let _ = lost.wait_for(|lost| *lost).await;
    }

    /// `true` once the lease is lost (check it between steps of a long job).
    ///
    /// ```
    /// # fn f(ctx: taskfence::runtime::WorkContext) {
    /// if ctx.is_lease_lost() { return; }
    /// # }
    /// ```
    pub fn is_lease_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Durably records the provider's operation id for this attempt, before the
    /// call when the provider lets you choose it (an idempotency key), right
    /// after otherwise, so a later attempt can look the operation up instead of
    /// paying for it twice. Fenced like every write of the lease.
    ///
    /// ```
    /// # async fn f(ctx: taskfence::runtime::WorkContext) -> taskfence::Result<()> {
    /// let op_id = format!("{}-{}", ctx.task().id, ctx.lease().attempt());
    /// if ctx.record_operation(&op_id).await?.is_accepted() {
    ///     // call the provider with `op_id` as its idempotency key
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn record_operation(&self, operation_id: &str) -> Result<Fenced<()>> {
        self.store.record_operation(&self.lease, operation_id).await
    }

    /// Records the intent to cause external effect `name` under this
    /// lease: [`TaskStore::begin_effect`].
    /// Call the provider with the key it hands out, then
    /// [`finish_effect`](Self::finish_effect).
    ///
    /// ```
    /// # async fn f(ctx: taskfence::runtime::WorkContext) -> taskfence::Result<()> {
    /// use taskfence::effect::{EffectOutcome, EffectStart};
    /// match ctx.begin_effect("notify-user").await?.into_result() {
    ///     Ok(EffectStart::Call { key, .. }) => {
    ///         // POST the webhook with `Idempotency-Key: {key}`, then:
    ///         ctx.finish_effect("notify-user", EffectOutcome::done_without_reference()).await?;
    ///     }
    ///     Ok(EffectStart::Done(_)) => { /* an earlier attempt sent it */ }
    ///     Ok(EffectStart::Stop(effect)) => { /* return Err(effect.ambiguous_failure()) from the work */ }
    ///     Ok(_) => {}
    ///     Err(rejection) => { /* the lease is gone: stop working */ }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn begin_effect(&self, name: &str) -> Result<Fenced<EffectStart>> {
        self.store.begin_effect(&self.lease, name).await
    }

    /// Records the outcome of effect `name`, begun by this attempt:
    /// [`TaskStore::finish_effect`].
    ///
    /// ```
    /// # async fn f(ctx: taskfence::runtime::WorkContext) -> taskfence::Result<()> {
    /// use taskfence::effect::EffectOutcome;
    /// ctx.finish_effect("charge-card", EffectOutcome::done("ch_123")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn finish_effect(&self, name: &str, outcome: EffectOutcome) -> Result<Fenced<Effect>> {
        self.store.finish_effect(&self.lease, name, outcome).await
    }
}
