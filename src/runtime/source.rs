//! Where a [`Consumer`](super::Consumer)'s work comes from: the [`Source`]
//! trait, and [`StoreQueue`], the store itself as the queue.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use super::Disposition;
use crate::error::Result;
use crate::intercept::{Intercept, Intercepted};
use crate::store::{ClaimNext, ClaimRequest, Lease, Submitted, TaskStore};
use crate::task::{NewTask, TaskId};

/// One piece of work a [`Source`] hands the consumer.
///
/// ```
/// use taskfence::runtime::Delivery;
/// let message: Delivery<&str> = Delivery::Task(taskfence::TaskId::new(), "receipt-handle-1");
/// assert!(matches!(message, Delivery::Task(_, "receipt-handle-1")));
/// ```
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // moved once, from a fetch to its run
pub enum Delivery<R> {
    /// A task the source already claimed (the store as the queue).
    Leased(Lease, R),
    /// A task id from a broker message: the consumer claims it.
    Task(TaskId, R),
}

/// A source of work for a [`Consumer`](super::Consumer): the store itself
/// ([`StoreQueue`]), or a broker (an SQS queue, a Kafka topic) whose
/// messages name task ids. `R` is the source's receipt for a delivery (a
/// message's receipt handle, a record's partition and offset).
///
/// `fetch` should return within a few seconds even when there is nothing to
/// fetch (an empty answer makes the consumer wait a little and ask again):
/// a stop lets an in-flight fetch finish within the grace, and drops it
/// after that or on a second stop request (what it took is left to its own
/// timer: a message's visibility, a lease). The consumer calls
/// [`settle`](Self::settle) once per delivery with what became of it, after
/// the store durably says so.
///
/// ```
/// use async_trait::async_trait;
/// use taskfence::runtime::{Delivery, Disposition, Source};
/// use taskfence::{ClaimRequest, Result, TaskId};
///
/// /// A fixed list of task ids, as a test's broker.
/// struct Ids(std::sync::Mutex<Vec<TaskId>>);
///
/// #[async_trait]
/// impl Source for Ids {
///     type Receipt = ();
///     async fn fetch(&self, max: usize, _claim: &ClaimRequest) -> Result<Vec<Delivery<()>>> {
///         let mut ids = self.0.lock().unwrap();
///         let n = ids.len().min(max);
///         Ok(ids.drain(..n).map(|id| Delivery::Task(id, ())).collect())
///     }
/// }
/// ```
#[async_trait]
pub trait Source: Send + Sync + 'static {
    /// The source's handle on one delivery.
    type Receipt: Send + Sync + 'static;

    /// Up to `max` deliveries (`claim` is who asks, for how long: what a
    /// source that claims on its own uses). Empty when there is nothing now.
    async fn fetch(&self, max: usize, claim: &ClaimRequest) -> Result<Vec<Delivery<Self::Receipt>>>;

    /// What became of a delivery: delete the message ([`Disposition::Ack`]),
    /// show it again after a delay ([`Disposition::RetryAfter`]), or leave it
    /// to its own timer ([`Disposition::Leave`]). The default does nothing.
    async fn settle(&self, receipt: Self::Receipt, disposition: Disposition) -> Result<()> {
        let _ = (receipt, disposition);
        Ok(())
    }

    /// The leases of these deliveries were renewed for another `lease_duration`: a
    /// broker extends its own message timer (SQS visibility). The default does
    /// nothing.
    async fn renewed(&self, receipts: Vec<&Self::Receipt>, lease_duration: Duration) {
        let _ = (receipts, lease_duration);
    }

    /// What wakes the consumer before its idle wait is over (new work in
    /// this process), if anything.
    fn wake(&self) -> Option<Wake> {
        None
    }

    /// Whether a fetch that returns fewer deliveries than asked for took all
    /// the source had. The consumer then waits
    /// [`idle_min`](super::ConsumerConfig::idle_min) before it asks again,
    /// instead of asking at once only to find nothing: under a trickle of
    /// work, one fetch (one round trip) per look instead of two. False by
    /// default, since a broker may answer short while more waits (an SQS
    /// receive returns at most ten messages, sampled from its servers).
    ///
    /// ```
    /// use taskfence::runtime::{Source, StoreQueue};
    /// # let store: std::sync::Arc<dyn taskfence::TaskStore> = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// assert!(StoreQueue::new(store).short_fetch_drains());
    /// ```
    fn short_fetch_drains(&self) -> bool {
        false
    }
}

/// Wakes a consumer waiting for work. Cheap to clone.
///
/// ```
/// let wake = taskfence::runtime::Wake::default();
/// wake.wake(); // the next idle wait returns at once
/// ```
#[derive(Debug, Clone, Default)]
pub struct Wake(Arc<Notify>);

impl Wake {
    /// Ends a waiting consumer's idle wait now (or its next one, if none waits).
    pub fn wake(&self) {
        self.0.notify_one();
    }

    pub(crate) async fn woken(&self) {
        self.0.notified().await;
    }
}

/// The store as the queue: [`claim_next`](TaskStore::claim_next) on each
/// fetch, optionally restricted to some operations and scopes. Submissions
/// through [`submitter`](Self::submitter) wake this process's consumers at
/// once; other processes' are found by the consumer's polling.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use taskfence::runtime::{Delivery, Source, StoreQueue};
/// use taskfence::*;
/// let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
/// let queue = StoreQueue::new(store).operation("chat.reply");
/// let submit = queue.submitter();
/// submit.submit(NewTask::new(RequestKey::new("u", "chat.reply", "k"), InputHash::of(["x"])).without_handoff()).await?;
/// let got = queue.fetch(8, &ClaimRequest::new("w", Duration::from_secs(30))).await?;
/// assert!(matches!(got[..], [Delivery::Leased(..)]));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct StoreQueue {
    store: Arc<dyn TaskStore>,
    operations: Vec<String>,
    scopes: Vec<String>,
    wake: Wake,
}

impl std::fmt::Debug for StoreQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreQueue")
            .field("operations", &self.operations)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

impl StoreQueue {
    /// Every due task of `store`.
    pub fn new(store: Arc<dyn TaskStore>) -> Self {
        Self {
            store,
            operations: Vec::new(),
            scopes: Vec::new(),
            wake: Wake::default(),
        }
    }

    /// Only tasks of this operation (call once per operation).
    ///
    /// ```
    /// # let store: std::sync::Arc<dyn taskfence::TaskStore> = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// let queue = taskfence::runtime::StoreQueue::new(store).operation("doc.index");
    /// ```
    pub fn operation(mut self, operation: impl Into<String>) -> Self {
        self.operations.push(operation.into());
        self
    }

    /// Only tasks of this scope (call once per scope).
    ///
    /// ```
    /// # let store: std::sync::Arc<dyn taskfence::TaskStore> = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// let queue = taskfence::runtime::StoreQueue::new(store).scope("tenant-7");
    /// ```
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scopes.push(scope.into());
        self
    }

    /// The store, for submitting: every task it creates wakes this queue's
    /// consumer at once, so a task submitted in this process starts without
    /// waiting for the next poll.
    ///
    /// ```
    /// # let store: std::sync::Arc<dyn taskfence::TaskStore> = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// let queue = taskfence::runtime::StoreQueue::new(store);
    /// let submit: std::sync::Arc<dyn taskfence::TaskStore> = queue.submitter();
    /// ```
    pub fn submitter(&self) -> Arc<dyn TaskStore> {
        Arc::new(Intercepted::new(
            Arc::clone(&self.store),
            WakeOnSubmit(self.wake.clone()),
        ))
    }

    /// The queue's wake-up, for work that arrives another way (a `LISTEN`
    /// notification, a message on another channel).
    ///
    /// ```
    /// # let store: std::sync::Arc<dyn taskfence::TaskStore> = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// let queue = taskfence::runtime::StoreQueue::new(store);
    /// queue.waker().wake();
    /// ```
    pub fn waker(&self) -> Wake {
        self.wake.clone()
    }

    /// Wakes this queue's consumer on every `NOTIFY` of `store`'s
    /// submissions (a store built with
    /// [`notify_on_submit`](crate::postgres::PgStoreBuilder::notify_on_submit)),
    /// so a task submitted by another process starts at once instead of at
    /// the next poll. The listener holds one connection of the store's pool
    /// and reconnects on its own; after a reconnection (notifications may
    /// have been missed) it wakes the consumer once, and polling covers the
    /// rest. Only notifications of this queue's operations wake it. Abort
    /// the handle to stop listening.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> taskfence::Result<()> {
    /// # let pool: sqlx::PgPool = todo!();
    /// use std::sync::Arc;
    /// let store = taskfence::PgStore::builder(pool).notify_on_submit().build()?;
    /// let queue = taskfence::runtime::StoreQueue::new(Arc::new(store.clone())).operation("chat.reply");
    /// let listening = queue.wake_on_notify(&store);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn wake_on_notify(&self, store: &crate::PgStore) -> tokio::task::JoinHandle<()> {
        let wake = self.wake.clone();
        let operations = self.operations.clone();
        let pool = store.pool().clone();
        let Some(channel) = store.notify_channel().map(str::to_owned) else {
            tracing::warn!("the store does not notify its submissions: nothing to listen to");
            return tokio::spawn(async {});
        };
        tokio::spawn(async move {
            loop {
                if let Err(error) = listen(&pool, &channel, &operations, &wake).await {
                    tracing::warn!(%error, "listening for submissions failed; polling meanwhile");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        })
    }

    /// The store the queue claims from.
    ///
    /// ```
    /// # let store: std::sync::Arc<dyn taskfence::TaskStore> = std::sync::Arc::new(taskfence::MemoryStore::new());
    /// let queue = taskfence::runtime::StoreQueue::new(store);
    /// let _store = queue.store();
    /// ```
    pub fn store(&self) -> &Arc<dyn TaskStore> {
        &self.store
    }
}

#[async_trait]
impl Source for StoreQueue {
    type Receipt = ();

    async fn fetch(&self, max: usize, claim: &ClaimRequest) -> Result<Vec<Delivery<()>>> {
        let mut next = ClaimNext::new(claim.worker.clone(), claim.lease_duration, max);
        next.operations.clone_from(&self.operations);
        next.scopes.clone_from(&self.scopes);
        let leases = self.store.claim_next(next).await?;
        Ok(leases
            .into_iter()
            .map(|lease| Delivery::Leased(lease, ()))
            .collect())
    }

    fn wake(&self) -> Option<Wake> {
        Some(self.wake.clone())
    }

    /// `claim_next` takes every due task up to its limit.
    fn short_fetch_drains(&self) -> bool {
        true
    }
}

/// Listens on `channel` and wakes `wake` for each notification of one of
/// `operations` (any, when empty), and once after each reconnection.
#[cfg(feature = "postgres")]
async fn listen(
    pool: &sqlx::PgPool,
    channel: &str,
    operations: &[String],
    wake: &Wake,
) -> std::result::Result<(), sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    // Anything submitted before the LISTEN took effect.
    wake.wake();
    loop {
        match listener.try_recv().await? {
            Some(n) if operations.is_empty() || operations.iter().any(|o| o == n.payload()) => wake.wake(),
            Some(_) => {}
            // The connection was lost and is back: what was notified meanwhile is gone.
            None => wake.wake(),
        }
    }
}

/// Wakes the queue's consumer after each submission that created a task.
#[derive(Debug)]
struct WakeOnSubmit(Wake);

#[async_trait]
impl Intercept for WakeOnSubmit {
    async fn submit(&self, inner: &dyn TaskStore, task: NewTask) -> Result<Submitted> {
        let submitted = inner.submit(task).await?;
        if submitted.is_created() {
            self.0.wake();
        }
        Ok(submitted)
    }
}
