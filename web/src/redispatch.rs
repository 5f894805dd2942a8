//! [`Redispatch`]: how the dashboard's redispatch action hands tasks off
//! again. A store with an outbox (PostgreSQL, DynamoDB) writes new
//! handoffs; a store without one (memory) has nothing to write, so the
//! application that owns the queue may plug in its own publisher.

use async_trait::async_trait;
use taskfence::TaskId;

/// Hands tasks off to the queue again: the dashboard's redispatch action on a
/// stranded task (pending, never claimed: its message was lost).
///
/// Publishing twice is harmless — every copy names the same task, and a
/// claim decides who works on it — so an implementation need not check
/// whether a task was published already.
///
/// With the `postgres` feature (default), [`PgStore`](taskfence::PgStore)
/// implements it: each id gets a new outbox row that the dispatcher
/// publishes; with `dynamodb`, `DynamoStore` does the same with handoff items. Without a `Redispatch`, the dashboard lists the ids to publish
/// and offers no action.
///
/// ```
/// use async_trait::async_trait;
/// use taskfence::TaskId;
/// use taskfence_web::Redispatch;
///
/// /// Publishes ids straight to the application's queue.
/// struct ToMyQueue;
///
/// #[async_trait]
/// impl Redispatch for ToMyQueue {
///     async fn redispatch(&self, ids: &[TaskId]) -> taskfence::Result<u64> {
///         for id in ids {
///             println!("publish {id}"); // the application's send_message
///         }
///         Ok(ids.len() as u64)
///     }
/// }
/// ```
#[async_trait]
pub trait Redispatch: Send + Sync {
    /// Hands `ids` off again; how many handoffs were written (or messages sent).
    async fn redispatch(&self, ids: &[TaskId]) -> taskfence::Result<u64>;
}

#[cfg(feature = "postgres")]
#[async_trait]
impl Redispatch for taskfence::PgStore {
    async fn redispatch(&self, ids: &[TaskId]) -> taskfence::Result<u64> {
        taskfence::PgStore::redispatch(self, ids).await
    }
}

#[cfg(feature = "sqlite")]
#[async_trait]
impl Redispatch for taskfence::SqliteStore {
    async fn redispatch(&self, ids: &[TaskId]) -> taskfence::Result<u64> {
        taskfence::SqliteStore::redispatch(self, ids).await
    }
}

#[cfg(feature = "dynamodb")]
#[async_trait]
impl Redispatch for taskfence::DynamoStore {
    async fn redispatch(&self, ids: &[TaskId]) -> taskfence::Result<u64> {
        taskfence::DynamoStore::redispatch(self, ids).await
    }
}

#[async_trait]
impl<R: Redispatch + ?Sized> Redispatch for std::sync::Arc<R> {
    async fn redispatch(&self, ids: &[TaskId]) -> taskfence::Result<u64> {
        (**self).redispatch(ids).await
    }
}
