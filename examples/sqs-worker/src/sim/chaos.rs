//! Faults injected for real, so the template can be watched surviving them:
//! a worker killed mid-flight ([`KillSwitch`]) and a worker that stalls past
//! its lease and comes back ([`Stalls`], [`StallingStore`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use taskfence::intercept::{Intercept, Intercepted};
use taskfence::{
    Claim, ClaimRequest, Failure, Fenced, Lease, Response, Result, Retry, Task, TaskId, TaskStore,
};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Kills one worker the hard way. The supervisor ([`Fleet`](crate::sim::Fleet))
/// waits on it; the simulated provider pulls it.
#[derive(Debug, Clone, Default)]
pub struct KillSwitch(Arc<Notify>);

impl KillSwitch {
    /// A switch not yet pulled.
    pub fn new() -> Self {
        Self::default()
    }
    /// Pulls the switch.
    pub fn pull(&self) {
        self.0.notify_one();
    }
    /// Resolves once the switch is pulled.
    pub async fn pulled(&self) {
        self.0.notified().await;
    }
}

/// Tasks whose worker is stalled: a stop-the-world pause, a VM freeze, a
/// network partition to the database. Until the stall ends, every store call
/// for the task waits (see [`StallingStore`]), then goes through as if the
/// worker had just woken up.
#[derive(Debug, Clone, Default)]
pub struct Stalls(Arc<Mutex<HashMap<TaskId, Instant>>>);

impl Stalls {
    /// No stalls yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stalls the worker handling `task` for `duration` from now.
    pub fn stall(&self, task: TaskId, duration: Duration) {
        self.0.lock().unwrap().insert(task, Instant::now() + duration);
    }

    /// Waits out a stall of `task`, if there is one.
    async fn wait(&self, task: TaskId) {
        let until = self.0.lock().unwrap().get(&task).copied();
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
            self.0.lock().unwrap().remove(&task);
        }
    }
}

/// A [`TaskStore`] whose calls for a stalled task wait until the stall ends,
/// then reach the real store. Wrap one worker's store in it:
/// `StallingStore::new(store, stalls)`.
pub type StallingStore = Intercepted<dyn TaskStore, Stalls>;

/// The stall is an [`Intercept`]: only the calls a stalled worker would make
/// for the task wait; submit, find and the scans forward untouched.
#[async_trait]
impl Intercept for Stalls {
    async fn get(&self, inner: &dyn TaskStore, id: TaskId) -> Result<Option<Task>> {
        self.wait(id).await;
        inner.get(id).await
    }
    async fn claim(&self, inner: &dyn TaskStore, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        self.wait(id).await;
        inner.claim(id, request).await
    }
    /// A batch waits out the stall of any of its tasks (the worker is stuck
    /// in that call), then goes to the real store in one request.
    async fn claim_many(
        &self,
        inner: &dyn TaskStore,
        ids: &[TaskId],
        request: ClaimRequest,
    ) -> Result<Vec<Claim>> {
        for &id in ids {
            self.wait(id).await;
        }
        inner.claim_many(ids, request).await
    }
    async fn renew(
        &self,
        inner: &dyn TaskStore,
        lease: &mut Lease,
        extend_by: Duration,
    ) -> Result<Fenced<()>> {
        self.wait(lease.task_id()).await;
        inner.renew(lease, extend_by).await
    }
    async fn complete(
        &self,
        inner: &dyn TaskStore,
        lease: Lease,
        response: Response,
    ) -> Result<Fenced<Task>> {
        self.wait(lease.task_id()).await;
        inner.complete(lease, response).await
    }
    async fn fail(&self, inner: &dyn TaskStore, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        self.wait(lease.task_id()).await;
        inner.fail(lease, failure).await
    }
    async fn release(&self, inner: &dyn TaskStore, lease: Lease) -> Result<Fenced<()>> {
        self.wait(lease.task_id()).await;
        inner.release(lease).await
    }
    async fn cancel(&self, inner: &dyn TaskStore, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        self.wait(id).await;
        inner.cancel(id, reason).await
    }
    async fn record_operation(
        &self,
        inner: &dyn TaskStore,
        lease: &Lease,
        operation_id: &str,
    ) -> Result<Fenced<()>> {
        self.wait(lease.task_id()).await;
        inner.record_operation(lease, operation_id).await
    }
}
