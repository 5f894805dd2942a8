//! Saving a reply and hearing about it.
//!
//! - [`ReplyStore`] is the [`TaskStore`] the worker runs on: [`PgStore`] with
//!   one change. Its `complete` writes the reply into the app's `replies`
//!   table, completes the task ([`PgStore::complete_in`], fenced) and sends
//!   `pg_notify` — **one transaction**. So the reply row exists exactly when
//!   the task is completed, a refused completion writes no row, and the
//!   notification is delivered only once both are committed.
//! - [`ReplyEvents`] is the API's side: one `LISTEN` connection per process,
//!   fanned out to every long-polling request. A notification is only a hint
//!   to read the store again; a lost one (reconnect) wakes every waiter.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgListener;
use taskfence::{
    Attempt, Claim, ClaimRequest, Error, Failure, Fenced, Lease, NewTask, PgStore, RequestKey, Response,
    Result, Retry, Submitted, Task, TaskId, TaskStore,
};
use tokio::sync::{broadcast, watch};

/// [`PgStore`] whose `complete` also saves the reply and notifies, atomically.
///
/// Why a wrapper: [`taskfence::Worker`] completes through
/// [`TaskStore::complete`]. Wrapping the store keeps the whole runtime
/// (claim, lease renewal, retry budget, dispositions) and changes only what a
/// completion writes. Every other method is [`PgStore`]'s own.
#[derive(Debug, Clone)]
pub struct ReplyStore {
    inner: PgStore,
    channel: String,
}

impl ReplyStore {
    /// Wraps `inner`; saved replies are announced on `channel`.
    pub fn new(inner: PgStore, channel: impl Into<String>) -> Self {
        Self {
            inner,
            channel: channel.into(),
        }
    }
}

#[async_trait]
impl TaskStore for ReplyStore {
    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        let Some(content) = response.as_str().map(str::to_owned) else {
            return Err(Error::storage(NotText));
        };
        let (task_id, attempt) = (lease.task_id(), lease.attempt());
        let mut tx = self.inner.pool().begin().await.map_err(Error::storage)?;
        let outcome = self.inner.complete_in(&mut tx, lease, response).await?;
        if outcome.is_accepted() {
            // The task row stays locked until the commit: nothing can take the
            // task over between the fenced check and these writes.
            sqlx::query("INSERT INTO replies (task_id, content, attempt) VALUES ($1, $2, $3)")
                .bind(task_id.as_uuid())
                .bind(&content)
                .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
                .execute(&mut *tx)
                .await
                .map_err(Error::storage)?;
            // Queued by the server and delivered on COMMIT, never before.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(&self.channel)
                .bind(task_id.to_string())
                .execute(&mut *tx)
                .await
                .map_err(Error::storage)?;
            tx.commit().await.map_err(Error::storage)?;
        }
        // Rejected: dropping `tx` rolls back; complete_in wrote nothing either.
        Ok(outcome)
    }

    async fn submit(&self, task: NewTask) -> Result<Submitted> {
        self.inner.submit(task).await
    }
    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        self.inner.get(id).await
    }
    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        self.inner.find(key).await
    }
    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        self.inner.claim(id, request).await
    }
    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        self.inner.renew(lease, extend_by).await
    }
    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        self.inner.fail(lease, failure).await
    }
    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        self.inner.release(lease).await
    }
    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        self.inner.cancel(id, reason).await
    }
    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
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

/// The provider's answer was not UTF-8 text.
#[derive(Debug, thiserror::Error)]
#[error("a chat reply must be UTF-8 text")]
struct NotText;

/// What a long-poll is woken by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyEvent {
    /// The reply of this task was committed.
    Saved(TaskId),
    /// Notifications may have been missed (the LISTEN connection was lost and
    /// re-established): every waiter reads the store again.
    Resync,
}

/// One `LISTEN` connection per process, fanned out to every waiting request.
#[derive(Debug, Clone)]
pub struct ReplyEvents {
    tx: broadcast::Sender<ReplyEvent>,
}

impl ReplyEvents {
    /// Connects, `LISTEN`s on `channel` (so no notification committed after
    /// this returns is missed), and forwards notifications until `stop` turns
    /// true. Returns the fan-out and the listening task.
    pub async fn listen(
        pool: &sqlx::PgPool,
        channel: &str,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(Self, tokio::task::JoinHandle<()>), sqlx::Error> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(channel).await?;
        let (tx, _) = broadcast::channel(1024);
        let events = Self { tx: tx.clone() };
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = crate::service::stopped(&mut stop) => break,
                    received = listener.try_recv() => match received {
                        Ok(Some(n)) => match n.payload().parse::<TaskId>() {
                            Ok(id) => drop(tx.send(ReplyEvent::Saved(id))),
                            Err(_) => tracing::warn!(payload = n.payload(), "ignored a malformed notification"),
                        },
                        // The connection dropped; the next try_recv reconnects and re-LISTENs.
                        Ok(None) => drop(tx.send(ReplyEvent::Resync)),
                        Err(error) => {
                            tracing::warn!(%error, "LISTEN connection failed; retrying");
                            drop(tx.send(ReplyEvent::Resync));
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    },
                }
            }
        });
        Ok((events, task))
    }

    /// A receiver of every event from now on. Subscribe *before* reading the
    /// task, so a reply saved between the read and the wait is not missed.
    pub fn subscribe(&self) -> broadcast::Receiver<ReplyEvent> {
        self.tx.subscribe()
    }
}
