//! Faults injected for real, so the template can be watched surviving them:
//! a worker killed mid-flight ([`KillSwitch`]) and a worker that stalls past
//! its lease and comes back ([`Stalls`], [`StallingStore`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::config::interceptors::BeforeSerializationInterceptorContextRef;
use aws_sdk_sqs::config::{ConfigBag, Intercept as SqsIntercept};
use taskfence::intercept::{Call, Intercept, Intercepted, Outcome, Pending};
use taskfence::{
    Claim, ClaimRequest, Error, Failure, Fenced, Lease, Rejection, Response, Result, Retry, Task, TaskId,
    TaskStore,
};
use tokio::sync::Notify;
use tokio::time::Instant;

use taskfence_sqs::SqsQueue;

use crate::BoxError;

/// Kills one worker the hard way: once pulled, every store and SQS call of
/// that worker fails, as if its process were gone (nothing more is saved,
/// deleted or made visible), and the supervisor ([`Fleet`](crate::sim::Fleet))
/// ends it. The simulated provider pulls it.
#[derive(Debug, Clone, Default)]
pub struct KillSwitch(Arc<(AtomicBool, Notify)>);

impl KillSwitch {
    /// A switch not yet pulled.
    pub fn new() -> Self {
        Self::default()
    }
    /// Pulls the switch.
    pub fn pull(&self) {
        self.0.0.store(true, Ordering::SeqCst);
        self.0.1.notify_one();
    }
    /// `true` once pulled.
    pub fn is_pulled(&self) -> bool {
        self.0.0.load(Ordering::SeqCst)
    }
    /// Resolves once the switch is pulled.
    pub async fn pulled(&self) {
        self.0.1.notified().await;
    }
    /// `queue` through a client whose calls fail once the switch is pulled.
    pub fn queue(&self, queue: &SqsQueue) -> SqsQueue {
        let config = queue
            .client()
            .config()
            .to_builder()
            .interceptor(self.clone())
            .build();
        SqsQueue::new(aws_sdk_sqs::Client::from_conf(config), queue.url())
    }
}

/// The killed worker's store: every call fails. The batches stay the
/// wrapped store's own (one request, not one per task).
#[async_trait]
impl Intercept for KillSwitch {
    async fn around<'a, T: Outcome + Send + 'a>(&'a self, call: Call, run: Pending<'a, T>) -> Result<T> {
        if self.is_pulled() {
            return Err(Error::Storage(format!("killed before {}", call.operation).into()));
        }
        run.await
    }
    async fn claim_many(
        &self,
        inner: &dyn TaskStore,
        ids: &[TaskId],
        request: ClaimRequest,
    ) -> Result<Vec<Claim>> {
        inner.claim_many(ids, request).await
    }
    async fn renew_many(
        &self,
        inner: &dyn TaskStore,
        leases: &mut [Lease],
        extend_by: Duration,
    ) -> Result<Vec<Fenced<()>>> {
        inner.renew_many(leases, extend_by).await
    }
    async fn complete_many(
        &self,
        inner: &dyn TaskStore,
        completions: Vec<(Lease, Response)>,
    ) -> Result<Vec<Result<Fenced<Task>>>> {
        inner.complete_many(completions).await
    }
}

/// The killed worker's SQS client: every call fails.
impl SqsIntercept for KillSwitch {
    fn name(&self) -> &'static str {
        "KillSwitch"
    }
    fn read_before_execution(
        &self,
        _context: &BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut ConfigBag,
    ) -> std::result::Result<(), BoxError> {
        if self.is_pulled() {
            return Err("killed".into());
        }
        Ok(())
    }
}

/// Tasks whose worker is stalled: a stop-the-world pause, a VM freeze, a
/// network partition to the database. Until the stall ends, every store call
/// for the task waits (see [`StallingStore`]), then goes through as if the
/// worker had just woken up; its lease is not renewed meanwhile.
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

    /// `true` while `task` is stalled.
    fn stalled(&self, task: TaskId) -> bool {
        self.0
            .lock()
            .unwrap()
            .get(&task)
            .is_some_and(|until| *until > Instant::now())
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
    /// A stalled task's renewal does not reach the store before its lease
    /// has run out: it is answered as expired (so its message is no longer
    /// extended and comes back for another worker). The others renew side by
    /// side, one request each: moto's DynamoDB serves the tests one request
    /// at a time, and a batch renewed one lease after another would wait a
    /// full turn of that queue per lease.
    async fn renew_many(
        &self,
        inner: &dyn TaskStore,
        leases: &mut [Lease],
        extend_by: Duration,
    ) -> Result<Vec<Fenced<()>>> {
        let mut renewals: Vec<_> = leases
            .iter_mut()
            .map(|lease| {
                Box::pin(async move {
                    if self.stalled(lease.task_id()) {
                        return Ok(Fenced::Rejected(Rejection::LeaseExpired));
                    }
                    inner.renew(lease, extend_by).await
                })
            })
            .collect();
        let mut answers: Vec<Option<Result<Fenced<()>>>> = renewals.iter().map(|_| None).collect();
        std::future::poll_fn(|cx| {
            let mut waiting = false;
            for (renewal, answer) in renewals.iter_mut().zip(&mut answers) {
                if answer.is_none() {
                    match renewal.as_mut().poll(cx) {
                        Poll::Ready(done) => *answer = Some(done),
                        Poll::Pending => waiting = true,
                    }
                }
            }
            if waiting { Poll::Pending } else { Poll::Ready(()) }
        })
        .await;
        answers
            .into_iter()
            .map(|answer| answer.expect("every renewal answered"))
            .collect()
    }
    /// A batch of completions waits out the stall of any of its tasks, then
    /// goes to the real store in one request.
    async fn complete_many(
        &self,
        inner: &dyn TaskStore,
        completions: Vec<(Lease, Response)>,
    ) -> Result<Vec<Result<Fenced<Task>>>> {
        for (lease, _) in &completions {
            self.wait(lease.task_id()).await;
        }
        inner.complete_many(completions).await
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
