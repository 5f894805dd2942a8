//! The dispatcher: publishes the handoffs that `submit` wrote to PostgreSQL's
//! outbox in the same transaction as the task, so an accepted request can
//! never be lost between the database and the queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use taskfence::{PgStore, TaskId};
use tokio::sync::watch;

use crate::queue::{BoxError, SqsQueue};

/// Moves pending handoffs from the outbox to the queue.
///
/// Each round claims up to `batch` handoffs with `FOR UPDATE SKIP LOCKED` (so
/// several dispatchers share the outbox), sends one message per task, and
/// marks them published in the same transaction. A crash after sending and
/// before the commit sends them again next round: the queue sees duplicates,
/// every copy names the same task, and the claim makes them harmless.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    store: PgStore,
    queue: SqsQueue,
    batch: usize,
    sent: Arc<AtomicU64>,
}

impl Dispatcher {
    /// A dispatcher from `store`'s outbox to `queue`, `batch` handoffs per round.
    pub fn new(store: PgStore, queue: SqsQueue, batch: usize) -> Self {
        Self {
            store,
            queue,
            batch,
            sent: Arc::default(),
        }
    }

    /// Messages sent so far (duplicates included).
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// One round; returns the tasks published and marked.
    pub async fn round(&self) -> Result<Vec<TaskId>, BoxError> {
        self.round_observed(|_| {}).await
    }

    /// One round that calls `after_send(n)` once the round's `n`-th message
    /// is sent (before the round commits): a hook for tests that kill the
    /// dispatcher between sending and marking.
    pub async fn round_observed(
        &self,
        after_send: impl Fn(usize) + Send + Sync,
    ) -> Result<Vec<TaskId>, BoxError> {
        let in_round = AtomicU64::new(0);
        let (in_round, after_send) = (&in_round, &after_send);
        let round = self
            .store
            .dispatch(self.batch, |task_id| {
                let queue = self.queue.clone();
                let sent = Arc::clone(&self.sent);
                async move {
                    queue.publish(task_id).await?;
                    sent.fetch_add(1, Ordering::Relaxed);
                    after_send(in_round.fetch_add(1, Ordering::Relaxed) as usize + 1);
                    Ok::<(), BoxError>(())
                }
            })
            .await?;
        if let Some((task_id, error)) = round.failed {
            // That handoff stays pending; the next round retries it.
            tracing::warn!(%task_id, %error, "publishing a handoff failed");
        }
        Ok(round.published)
    }

    /// Runs rounds until `shutdown` turns true, waiting `idle` after a round
    /// that found nothing to publish.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>, idle: Duration) {
        while !*shutdown.borrow() {
            let wait = match self.round().await {
                Ok(published) if !published.is_empty() => Duration::ZERO,
                Ok(_) => idle,
                Err(error) => {
                    tracing::warn!(%error, "dispatch round failed");
                    idle
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.wait_for(|stop| *stop) => break,
            }
        }
    }
}
