//! [`HandlerLease`]: the lease of one run of the handler, kept alive from
//! the claim until the response is saved.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use taskfence::{Fenced, Lease, TaskStore};

/// The lease of a running handler. Renewed while [`renewing`](Self::renewing)
/// work runs (the handler, then the read of its response body), so a retry
/// gets `409` until the response is saved. Dropped while still held (the
/// request was dropped), it releases the task in the background, so a retry
/// need not wait for the lease to run out.
pub(super) struct HandlerLease<S: TaskStore + ?Sized + 'static> {
    store: Arc<S>,
    lease: Option<Lease>,
    /// The length of each renewal.
    length: Duration,
}

impl<S: TaskStore + ?Sized + 'static> HandlerLease<S> {
    pub(super) fn new(store: Arc<S>, lease: Lease, length: Duration) -> Self {
        Self {
            store,
            lease: Some(lease),
            length,
        }
    }

    /// Runs `work` to its end, renewing the lease every third of its length
    /// meanwhile.
    pub(super) async fn renewing<F: Future>(&mut self, work: F) -> F::Output {
        let every = self.length / 3;
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                output = &mut work => return output,
                () = tokio::time::sleep(every) => self.renew().await,
            }
        }
    }

    async fn renew(&mut self) {
        let Some(lease) = self.lease.as_mut() else {
            return;
        };
        match self.store.renew(lease, self.length).await {
            Ok(Fenced::Accepted(())) => {}
            // Keep running: the save will be refused if the lease is really gone.
            Ok(Fenced::Rejected(rejection)) => {
                tracing::warn!(task_id = %lease.task_id(), %rejection, "idempotency layer: lease renewal refused");
            }
            Err(error) => {
                tracing::warn!(task_id = %lease.task_id(), %error, "idempotency layer: lease renewal failed");
            }
        }
    }

    /// Gives the task back for a retry, now.
    pub(super) async fn release(&mut self, why: &str) {
        if let Some(lease) = self.lease.take() {
            let task_id = lease.task_id();
            tracing::debug!(%task_id, why, "idempotency layer: releasing the key for a retry");
            if let Err(error) = self.store.release(lease).await {
                tracing::warn!(%task_id, %error, "idempotency layer: release failed; the key is free when its lease expires");
            }
        }
    }

    /// The lease, to finish the task with (save or fail): no longer released
    /// on drop.
    pub(super) fn take(&mut self) -> Option<Lease> {
        self.lease.take()
    }
}

impl<S: TaskStore + ?Sized + 'static> Drop for HandlerLease<S> {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let store = Arc::clone(&self.store);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = store.release(lease).await;
            });
        }
    }
}
