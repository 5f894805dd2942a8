//! [`Consumer`]: the loop every worker service needs, in the library —
//! fetch, run the work function under a concurrency limit, renew the held
//! leases in batches, group-commit the completions, stop gracefully.
//!
//! | module | what it holds |
//! | --- | --- |
//! | this one | [`Consumer`]: its setup and its run, start to stop |
//! | `config` | [`ConsumerConfig`] |
//! | `stopped` | [`Stopped`], and the counters it is read from |
//! | `shared` | what every task's run shares, and telling the source |
//! | `fetch` | the fetch loop: free slots, deliveries, their claims |
//! | `task` | one task's run: work under the held lease, then its outcome |

mod config;
mod fetch;
mod shared;
mod stopped;
mod task;

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::clock::{Clock, SystemClock};
use crate::error::{InvalidInput, Result};
use crate::policy::Failure;
use crate::runtime::WorkContext;
use crate::runtime::commit::Committer;
use crate::runtime::held::{HeldLeases, renew_loop};
use crate::runtime::source::{Source, StoreQueue};
use crate::runtime::stop::{Phase, Stop, reached};
use crate::store::TaskStore;
use crate::task::Response;
pub use config::ConsumerConfig;
use fetch::fetch_loop;
use shared::Shared;
pub use stopped::Stopped;
use stopped::Tally;

/// Runs a work function on the tasks a [`Source`] delivers: the store
/// itself ([`StoreQueue`]) or a broker. It owns the loop a worker service
/// would otherwise write:
///
/// - **Fetch** up to the free slots of the concurrency limit; when nothing
///   comes, wait (doubling from [`idle_min`](ConsumerConfig::idle_min) to
///   [`idle_max`](ConsumerConfig::idle_max)), woken at once by a submission
///   in this process; after a short fetch that drained the store, wait
///   `idle_min` too rather than asking again at once. A broker's task ids are claimed together
///   ([`claim_many`](TaskStore::claim_many)); a delivery that needs no work
///   (done, busy, backing off) is settled without calling the work function.
/// - **Work**: each task's work function runs as its own tokio task with a
///   [`WorkContext`]. A panic is a retryable failure that counts against the
///   budget, never a lost task; a [`Failure`] goes to the task's policy (its
///   [`retry_after`](Failure::retry_after) included).
/// - **Hold** only what it will run: at most [`prefetch`](ConsumerConfig::prefetch)
///   tasks beyond those running (a quarter of the concurrency by default),
///   claimed on the short [`ready_lease`](ConsumerConfig::ready_lease), so a
///   crash delays a task nobody started by that much only.
/// - **Renew** the held leases in batched requests
///   ([`renew_many`](TaskStore::renew_many)): running work's every
///   [`renew_every`](ConsumerConfig::renew_every) to the full lease, ready
///   tasks' every round to the ready lease; a started task's lease is
///   lengthened by the next round, with the others. A work function whose
///   lease is lost is told ([`WorkContext::lease_lost`]) and dropped after
///   [`lost_grace`](ConsumerConfig::lost_grace).
/// - **Commit** responses in groups ([`complete_many`](TaskStore::complete_many)):
///   each completion still fenced on its own, each delivery settled only
///   once its own completion is durable.
/// - **Stop** on [`Stop`]: no more fetching, running work finishes within
///   the [`grace`](ConsumerConfig::grace), what remains is released so
///   another process takes it at once; a second request releases at once.
///   Tasks held ready are given back unstarted at once
///   ([`release_unstarted`](TaskStore::release_unstarted)): a deploy spends
///   no retry budget on work that never ran.
///   The whole stop is bounded by `grace + release_deadline`.
///
/// ```
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)] async fn main() -> taskfence::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use taskfence::runtime::{ConsumerConfig, StoreQueue};
/// use taskfence::*;
///
/// let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
/// let queue = StoreQueue::new(store.clone());
/// let submit = queue.submitter();
/// let consumer = queue.consumer(ConsumerConfig::new("worker-1", Duration::from_secs(30)))?;
/// let stop = consumer.stop().clone();
/// let running = tokio::spawn(consumer.run(|ctx| async move {
///     Ok(Response::from(format!("reply to {}", ctx.task().key.key)))
/// }));
///
/// let task = submit
///     .submit(NewTask::new(RequestKey::new("u", "chat.reply", "k1"), InputHash::of(["hi"])).without_handoff())
///     .await?
///     .into_task();
/// while store.get(task.id).await?.unwrap().status != Status::Completed {
///     tokio::time::sleep(Duration::from_millis(5)).await;
/// }
/// stop.request();
/// let stopped = running.await.expect("the consumer task")?;
/// assert_eq!(stopped.completed, 1);
/// # Ok(()) }
/// ```
pub struct Consumer<S: Source> {
    store: Arc<dyn TaskStore>,
    source: Arc<S>,
    config: Arc<ConsumerConfig>,
    stop: Stop,
    clock: Arc<dyn Clock>,
}

impl<S: Source> std::fmt::Debug for Consumer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("config", &self.config)
            .field("stop", &self.stop)
            .finish_non_exhaustive()
    }
}

impl StoreQueue {
    /// A consumer of this queue, on its store.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # let store: Arc<dyn taskfence::TaskStore> = Arc::new(taskfence::MemoryStore::new());
    /// use taskfence::runtime::{ConsumerConfig, StoreQueue};
    /// let consumer = StoreQueue::new(store).consumer(ConsumerConfig::new("w", Duration::from_secs(30)))?;
    /// # Ok::<(), taskfence::error::InvalidInput>(())
    /// ```
    pub fn consumer(self, config: ConsumerConfig) -> std::result::Result<Consumer<StoreQueue>, InvalidInput> {
        Consumer::new(Arc::clone(self.store()), self, config)
    }
}

impl<S: Source> Consumer<S> {
    /// A consumer of `source` whose tasks live in `store`, after checking `config`.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # let store: Arc<dyn taskfence::TaskStore> = Arc::new(taskfence::MemoryStore::new());
    /// use taskfence::runtime::{Consumer, ConsumerConfig, StoreQueue};
    /// let consumer = Consumer::new(store.clone(), StoreQueue::new(store), ConsumerConfig::new("w", Duration::from_secs(30)))?;
    /// # Ok::<(), taskfence::error::InvalidInput>(())
    /// ```
    pub fn new(
        store: Arc<dyn TaskStore>,
        source: S,
        config: ConsumerConfig,
    ) -> std::result::Result<Self, InvalidInput> {
        config.validate()?;
        Ok(Self {
            store,
            source: Arc::new(source),
            config: Arc::new(config),
            stop: Stop::new(),
            clock: Arc::new(SystemClock),
        })
    }

    /// Uses `clock` (the worker's) to turn the store's instants into
    /// redelivery delays and to notice a lease outliving an unreachable store.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # let store: Arc<dyn taskfence::TaskStore> = Arc::new(taskfence::MemoryStore::new());
    /// # let consumer = taskfence::runtime::StoreQueue::new(store).consumer(taskfence::runtime::ConsumerConfig::new("w", Duration::from_secs(30)))?;
    /// let consumer = consumer.with_clock(taskfence::clock::ManualClock::default());
    /// # Ok::<(), taskfence::error::InvalidInput>(())
    /// ```
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Answers to `stop`, a switch made before the consumer (signal handlers
    /// installed first, one switch for several consumers).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # let store: Arc<dyn taskfence::TaskStore> = Arc::new(taskfence::MemoryStore::new());
    /// # let consumer = taskfence::runtime::StoreQueue::new(store).consumer(taskfence::runtime::ConsumerConfig::new("w", Duration::from_secs(30)))?;
    /// let stop = taskfence::runtime::Stop::new();
    /// let consumer = consumer.with_stop(stop.clone());
    /// stop.request();
    /// assert!(consumer.stop().is_requested());
    /// # Ok::<(), taskfence::error::InvalidInput>(())
    /// ```
    pub fn with_stop(mut self, stop: Stop) -> Self {
        self.stop = stop;
        self
    }

    /// The stop switch: clone it before [`run`](Self::run) takes the consumer.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # let store: Arc<dyn taskfence::TaskStore> = Arc::new(taskfence::MemoryStore::new());
    /// # let consumer = taskfence::runtime::StoreQueue::new(store).consumer(taskfence::runtime::ConsumerConfig::new("w", Duration::from_secs(30)))?;
    /// let stop = consumer.stop().clone();
    /// # Ok::<(), taskfence::error::InvalidInput>(())
    /// ```
    pub fn stop(&self) -> &Stop {
        &self.stop
    }

    /// The source.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # let store: Arc<dyn taskfence::TaskStore> = Arc::new(taskfence::MemoryStore::new());
    /// # let consumer = taskfence::runtime::StoreQueue::new(store).consumer(taskfence::runtime::ConsumerConfig::new("w", Duration::from_secs(30)))?;
    /// let _submit = consumer.source().submitter();
    /// # Ok::<(), taskfence::error::InvalidInput>(())
    /// ```
    pub fn source(&self) -> &S {
        &self.source
    }

    /// [`run`](Self::run) in a task of its own, its end logged under `name`:
    /// `INFO "{name} stopped"` with the [`Stopped`] summary, or `ERROR "the
    /// {name} could not start"`. What a service does with each consumer it
    /// runs beside its server, all of them stopped by one [`Stop`]; the handle
    /// is awaited with theirs at the end.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), taskfence::error::InvalidInput> {
    /// # use std::{sync::Arc, time::Duration};
    /// use taskfence::runtime::{ConsumerConfig, StoreQueue};
    /// use taskfence::{Response, TaskStore};
    ///
    /// let store: Arc<dyn TaskStore> = Arc::new(taskfence::MemoryStore::new());
    /// let consumer = StoreQueue::new(store).consumer(ConsumerConfig::new("w", Duration::from_secs(30)))?;
    /// let stop = consumer.stop().clone();
    /// let running = consumer.spawn("reply worker", |_ctx| async { Ok(Response::from("done")) });
    /// stop.drain();
    /// running.await.expect("the consumer's task ends");
    /// # Ok(())
    /// # }
    /// ```
    pub fn spawn<F, Fut>(self, name: &'static str, work: F) -> tokio::task::JoinHandle<()>
    where
        S: Send + Sync + 'static,
        S::Receipt: Clone + Send + Sync,
        F: Fn(WorkContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Response, Failure>> + Send + 'static,
    {
        tokio::spawn(async move {
            match self.run(work).await {
                Ok(stopped) => tracing::info!(?stopped, "{name} stopped"),
                Err(error) => tracing::error!(%error, "the {name} could not start"),
            }
        })
    }

    /// Runs until stopped (see [`stop`](Self::stop)); returns what it did.
    /// `work` gets each task it acquired and returns the response to save or
    /// a [`Failure`]. An `Err` is only for a consumer that could not start.
    pub async fn run<F, Fut>(self, work: F) -> Result<Stopped>
    where
        F: Fn(WorkContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Response, Failure>> + Send + 'static,
        S::Receipt: Clone,
    {
        let config = Arc::clone(&self.config);
        let (committer, commit_loop) =
            Committer::start(Arc::clone(&self.store), config.commit_batch, config.commit_window);
        let held = Arc::new(HeldLeases::new());
        // In a set, so dropping `run` (aborted, say) stops the renewals too:
        // a consumer that is gone must not keep its leases alive.
        let mut renewals = JoinSet::new();
        renewals.spawn(renew_loop(
            Arc::clone(&self.store),
            Arc::clone(&self.source),
            Arc::clone(&held),
            Arc::clone(&self.clock),
            config.renewals(),
        ));
        let shared = Arc::new(Shared {
            working: Arc::new(Semaphore::new(config.concurrency)),
            store: Arc::clone(&self.store),
            source: Arc::clone(&self.source),
            config: Arc::clone(&config),
            clock: Arc::clone(&self.clock),
            held,
            committer,
            tally: Tally::default(),
            stop: self.stop.clone(),
            work: Arc::new(work),
        });

        let mut runs = JoinSet::new();
        let releasing = fetch_loop(&shared, &mut runs).await;

        // Draining: running work may finish within the grace.
        let mut phase = self.stop.watch();
        loop {
            tokio::select! {
                joined = runs.join_next() => if joined.is_none() { break },
                () = self.stop.grace_over(config.grace) => break,
                () = reached(&mut phase, Phase::Now) => break,
            }
        }
        // Then every run still going releases its lease, and the last
        // completions are saved, within the release deadline.
        self.stop.now();
        // Kept from where the fetch loop set it, if a fetch under way past
        // the grace began the releasing.
        let deadline = releasing.unwrap_or_else(|| Instant::now() + config.release_deadline);
        while let Ok(Some(_)) = tokio::time::timeout_at(deadline, runs.join_next()).await {}
        runs.abort_all();
        renewals.abort_all();
        let counts = shared.tally.stopped();
        drop(shared); // the committer's last handle: its loop ends after the queued batch
        if tokio::time::timeout_at(deadline, commit_loop).await.is_err() {
            tracing::warn!("the last completions were not saved before the release deadline");
        }
        tracing::info!(?counts, "consumer stopped");
        Ok(counts)
    }
}
