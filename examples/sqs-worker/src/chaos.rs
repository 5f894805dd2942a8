//! Faults injected for real, so the template can be watched surviving them:
//! a worker killed mid-flight ([`KillSwitch`]) and a worker that stalls past
//! its lease and comes back ([`Stalls`], [`StallingStore`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use taskfence::{
    Attempt, Claim, ClaimRequest, Failure, Fenced, Lease, NewTask, RequestKey, Response, Result, Retry,
    Submitted, Task, TaskId, TaskStore,
};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Kills one worker the hard way. The supervisor ([`Fleet`](crate::Fleet))
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
/// then reach the real store. Wrap one worker's store in it.
#[derive(Clone)]
pub struct StallingStore {
    inner: Arc<dyn TaskStore>,
    stalls: Stalls,
}

impl StallingStore {
    /// `inner`, delayed by `stalls`.
    pub fn new(inner: Arc<dyn TaskStore>, stalls: Stalls) -> Self {
        Self { inner, stalls }
    }
}

#[async_trait]
impl TaskStore for StallingStore {
    async fn submit(&self, task: NewTask) -> Result<Submitted> {
        self.inner.submit(task).await
    }
    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        self.stalls.wait(id).await;
        self.inner.get(id).await
    }
    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        self.inner.find(key).await
    }
    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        self.stalls.wait(id).await;
        self.inner.claim(id, request).await
    }
    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        self.stalls.wait(lease.task_id()).await;
        self.inner.renew(lease, extend_by).await
    }
    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        self.stalls.wait(lease.task_id()).await;
        self.inner.complete(lease, response).await
    }
    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        self.stalls.wait(lease.task_id()).await;
        self.inner.fail(lease, failure).await
    }
    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        self.stalls.wait(lease.task_id()).await;
        self.inner.release(lease).await
    }
    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        self.stalls.wait(id).await;
        self.inner.cancel(id, reason).await
    }
    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        self.stalls.wait(lease.task_id()).await;
        self.inner.record_operation(lease, operation_id).await
    }
    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        self.inner.attempts(id).await
    }
    async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
        self.inner.due(limit).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        self.inner.purge_expired(limit).await
    }
}
