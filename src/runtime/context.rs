//! [`WorkContext`]: what the work function gets — the task, its lease, the
//! lease-lost signal — and the fenced writes it may make under the lease.

use std::sync::Arc;

use tokio::sync::watch;

use crate::effect::{Effect, EffectCall, EffectKey, EffectOutcome, EffectStart};
use crate::error::Result;
use crate::policy::Failure;
use crate::store::{Fenced, Lease, TaskStore};
use crate::task::{Response, Task};

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

    /// Causes external effect `name` through the journal, once per task
    /// whatever crashes: [`begin_effect`](Self::begin_effect), then `call`
    /// with the effect's key (the same on every attempt: pass it to the
    /// provider as its idempotency key), raced against the loss of the lease,
    /// then [`finish_effect`](Self::finish_effect) with what the call came
    /// to ([`EffectCall`]). An attempt that finds the effect done does not
    /// call and answers with its reference; one that finds an earlier call
    /// with no known outcome calls again with the same key (the journal
    /// counts it in [`Effect::ambiguous`]), or — under
    /// [`OnAmbiguous::Stop`](crate::policy::OnAmbiguous::Stop) — does not
    /// call and fails with [`Effect::ambiguous_failure`].
    ///
    /// The response is the reference, or `done` when there is none.
    ///
    /// ```no_run
    /// use taskfence::effect::EffectCall;
    /// use taskfence::{Failure, Response, runtime::WorkContext};
    ///
    /// async fn notify(ctx: WorkContext) -> Result<Response, Failure> {
    ///     ctx.effect("notify-user", |key| async move {
    ///         // POST the webhook with `Idempotency-Key: {key}`; it answered 200:
    ///         EffectCall::Done(Some(format!("delivery for {key}")))
    ///     })
    ///     .await
    /// }
    /// ```
    pub async fn effect<F, Fut>(&self, name: &str, call: F) -> std::result::Result<Response, Failure>
    where
        F: FnOnce(EffectKey) -> Fut,
        Fut: Future<Output = EffectCall>,
    {
        let start = self
            .begin_effect(name)
            .await
            .map_err(|e| Failure::retryable(format!("effect journal: {e}")))?;
        let key = match start {
            Fenced::Rejected(_) => {
                return Err(Failure::retryable(format!("lease lost before effect {name}")));
            }
            Fenced::Accepted(EffectStart::Call { key, ambiguous }) => {
                if let Some(earlier) = ambiguous {
                    tracing::warn!(%key, earlier_attempt = earlier.attempt, "calling again with the same key: an earlier call has no known outcome");
                }
                key
            }
            Fenced::Accepted(EffectStart::Done(effect)) => return Ok(reference_response(effect.reference)),
            Fenced::Accepted(EffectStart::Stop(effect)) => return Err(effect.ambiguous_failure()),
        };
        let called = tokio::select! {
            called = call(key) => called,
            // Another worker may own the task now; this call's outcome stays unknown.
            () = self.lease_lost() => EffectCall::Unknown(format!("lease lost during effect {name}")),
        };
        let (outcome, result) = match called {
            EffectCall::Done(reference) => {
                let reference = reference.filter(|r| EffectOutcome::done(r.clone()).validate().is_ok());
                let outcome = match &reference {
                    Some(r) => EffectOutcome::done(r.clone()),
                    None => EffectOutcome::done_without_reference(),
                };
                (outcome, Ok(reference_response(reference)))
            }
            EffectCall::Refused(failure) => (EffectOutcome::failed(failure.message.clone()), Err(failure)),
            // Nothing recorded: the next attempt finds the intent and calls again.
            EffectCall::Unknown(message) => return Err(Failure::ambiguous(message)),
        };
        match self.finish_effect(name, outcome).await {
            Ok(Fenced::Accepted(_)) => result,
            // The intent stays without an outcome: the next attempt calls again with the same key.
            Ok(Fenced::Rejected(_)) => Err(Failure::retryable(format!(
                "lease lost before effect {name} was recorded"
            ))),
            Err(e) => Err(Failure::retryable(format!("recording effect {name}: {e}"))),
        }
    }
}

/// An effect's reference as the attempt's response, `done` without one.
fn reference_response(reference: Option<String>) -> Response {
    Response::from(reference.unwrap_or_else(|| "done".to_owned()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::watch;

    use super::WorkContext;
    use crate::effect::{EffectCall, EffectState};
    use crate::policy::{Failure, FailureKind};
    use crate::store::{Claim, ClaimRequest, TaskStore};
    use crate::task::{InputHash, NewTask, RequestKey};
    use crate::{MemoryStore, Submitted};

    /// A context on a freshly claimed task of a memory store (its lease never lost).
    async fn claimed() -> (WorkContext, watch::Sender<bool>) {
        let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
        let new = NewTask::new(RequestKey::new("u", "notify", "k"), InputHash::of(["x"]));
        let Submitted::Created(task) = store.submit(new).await.unwrap() else {
            panic!("a new key")
        };
        let request = ClaimRequest::new("w", Duration::from_secs(30));
        let Claim::Acquired(lease) = store.claim(task.id, request).await.unwrap() else {
            panic!("a pending task")
        };
        let (lost_tx, lost) = watch::channel(false);
        (WorkContext { store, lease, lost }, lost_tx)
    }

    #[tokio::test]
    async fn a_done_effect_answers_its_reference_and_is_not_called_again() {
        let (ctx, _lost) = claimed().await;
        let first = ctx
            .effect("hook", |key| async move {
                assert!(key.as_str().ends_with(":hook"), "{key}");
                EffectCall::Done(Some("d-1".to_owned()))
            })
            .await;
        assert_eq!(first.unwrap().as_str(), Some("d-1"));
        let mut called_again = false;
        let again = ctx
            .effect("hook", |_| {
                called_again = true;
                async { EffectCall::Done(Some("d-2".to_owned())) }
            })
            .await;
        assert_eq!(again.unwrap().as_str(), Some("d-1"));
        assert!(!called_again, "a done effect is not called again");
        let effects = ctx.store.effects(ctx.task().id).await.unwrap();
        assert_eq!((effects.len(), effects[0].state), (1, EffectState::Done));
    }

    #[tokio::test]
    async fn a_refusal_is_recorded_failed_and_an_unknown_outcome_records_nothing() {
        let (ctx, _lost) = claimed().await;
        let refused = ctx
            .effect("hook", |_| async {
                EffectCall::Refused(Failure::permanent("400"))
            })
            .await;
        assert_eq!(refused.unwrap_err().kind, FailureKind::Permanent);
        let effects = ctx.store.effects(ctx.task().id).await.unwrap();
        assert_eq!(
            (effects[0].state, effects[0].error.as_deref()),
            (EffectState::Failed, Some("400"))
        );

        let (ctx, _lost) = claimed().await;
        let unknown = ctx
            .effect("hook", |_| async { EffectCall::Unknown("timed out".to_owned()) })
            .await;
        assert_eq!(unknown.unwrap_err().kind, FailureKind::Ambiguous);
        let effects = ctx.store.effects(ctx.task().id).await.unwrap();
        assert_eq!(effects[0].state, EffectState::Intended, "no outcome recorded");
    }

    #[tokio::test]
    async fn a_lost_lease_mid_call_leaves_the_outcome_unknown() {
        let (ctx, lost) = claimed().await;
        let result = ctx
            .effect("hook", |_| async move {
                lost.send_replace(true);
                std::future::pending::<EffectCall>().await
            })
            .await;
        assert_eq!(result.unwrap_err().kind, FailureKind::Ambiguous);
    }
}
