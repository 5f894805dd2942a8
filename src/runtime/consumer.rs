//! [`Consumer`]: the loop every worker service needs, in the library —
//! fetch, run the work function under a concurrency limit, renew the held
//! leases in batches, group-commit the completions, stop gracefully.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tracing::Instrument;

use super::commit::Committer;
use super::disposition::{rejected, retry_at, settled, terminal_ack};
use super::held::{Held, renew_loop};
use super::source::{Delivery, Source, StoreQueue};
use super::stop::{Phase, Stop, reached};
use super::{AckReason, Disposition, LeaveReason, RetryReason, WorkContext};
use crate::clock::{Clock, SystemClock};
use crate::error::{InvalidInput, Result};
use crate::limits;
use crate::policy::Failure;
use crate::store::{ClaimRequest, Fenced, Lease, Retry, TaskStore};
use crate::task::{Response, TaskId};

/// How a [`Consumer`] fetches, works, renews, commits and stops.
///
/// ```
/// use std::time::Duration;
/// use taskfence::runtime::ConsumerConfig;
/// let config = ConsumerConfig::new("worker-1", Duration::from_secs(30)).concurrency(32);
/// assert_eq!((config.prefetch, config.fetch), (32, 64), "as many again held ready, fetched at once");
/// assert!(config.validate().is_ok());
/// assert!(ConsumerConfig::new("worker-1", Duration::from_secs(30)).concurrency(0).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerConfig {
    /// Recorded with every attempt.
    pub worker_id: String,
    /// Lease length asked for at claim and at every renewal (store clock).
    pub lease: Duration,
    /// How many work functions run at once. Default 16.
    pub concurrency: usize,
    /// How many tasks beyond those running the consumer holds ready (leased,
    /// renewed, started as soon as a work function returns), so the next
    /// fetch overlaps the work and the commits. Defaults to `concurrency`;
    /// 0 fetches only for free slots. On a stop, tasks not started yet are
    /// released at once.
    pub prefetch: usize,
    /// The most deliveries one fetch asks for. Defaults to
    /// `concurrency + prefetch`.
    pub fetch: usize,
    /// How often the held leases are renewed, all in one request. Defaults
    /// to a third of the lease.
    pub renew_every: Duration,
    /// The most completions saved by one batched write. Default 64.
    pub commit_batch: usize,
    /// How long a batch of completions waits for more while other work
    /// functions still run (a batch never waits when none do). Default 2 ms.
    pub commit_window: Duration,
    /// The first wait after a fetch found nothing; each empty fetch doubles
    /// it up to [`idle_max`](Self::idle_max). A submission through
    /// [`StoreQueue::submitter`] ends the wait at once. Default 50 ms.
    pub idle_min: Duration,
    /// The longest wait between empty fetches. Default 1 s.
    pub idle_max: Duration,
    /// On a stop, how long running work (and a fetch under way) may take
    /// to finish before its lease is released, counted from the stop
    /// request. Default 30 s.
    pub grace: Duration,
    /// After the grace (or on a second stop request), how long releasing
    /// the remaining leases and saving the last completions may take before
    /// the consumer returns regardless: a slow store or broker never holds
    /// the process past `grace + release_deadline`. Default 5 s.
    pub release_deadline: Duration,
    /// After a lease is lost, how long its work function may take to notice
    /// [`WorkContext::lease_lost`] before it is dropped. Default 5 s.
    pub lost_grace: Duration,
    /// The shortest [`Disposition::RetryAfter`] delay a broker source is
    /// told. Default 1 s.
    pub min_retry_delay: Duration,
}

impl ConsumerConfig {
    /// A consumer `worker_id` holding leases of `lease`, with the defaults.
    pub fn new(worker_id: impl Into<String>, lease: Duration) -> Self {
        Self {
            worker_id: worker_id.into(),
            lease,
            concurrency: 16,
            prefetch: 16,
            fetch: 32,
            renew_every: lease / 3,
            commit_batch: 64,
            commit_window: Duration::from_millis(2),
            idle_min: Duration::from_millis(50),
            idle_max: Duration::from_secs(1),
            grace: Duration::from_secs(30),
            release_deadline: Duration::from_secs(5),
            lost_grace: Duration::from_secs(5),
            min_retry_delay: Duration::from_secs(1),
        }
    }

    /// Sets `concurrency`, and `prefetch` to the same (`fetch` to twice it).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self.prefetch = n;
        self.fetch = n.saturating_mul(2);
        self
    }

    /// Sets `prefetch` (and `fetch` to `concurrency + prefetch`).
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self.fetch = self.concurrency.saturating_add(n);
        self
    }

    /// Sets `fetch`.
    pub fn fetch(mut self, n: usize) -> Self {
        self.fetch = n;
        self
    }

    /// Sets `renew_every`.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = every;
        self
    }

    /// Sets `commit_batch` and `commit_window`.
    pub fn commit(mut self, batch: usize, window: Duration) -> Self {
        self.commit_batch = batch;
        self.commit_window = window;
        self
    }

    /// Sets `idle_min` and `idle_max`.
    pub fn idle(mut self, min: Duration, max: Duration) -> Self {
        self.idle_min = min;
        self.idle_max = max;
        self
    }

    /// Sets `grace` and `release_deadline`.
    pub fn stop_after(mut self, grace: Duration, release_deadline: Duration) -> Self {
        self.grace = grace;
        self.release_deadline = release_deadline;
        self
    }

    /// Sets `lost_grace`.
    pub fn lost_grace(mut self, grace: Duration) -> Self {
        self.lost_grace = grace;
        self
    }

    /// Sets `min_retry_delay`.
    pub fn min_retry_delay(mut self, delay: Duration) -> Self {
        self.min_retry_delay = delay;
        self
    }

    /// Checks the worker id and lease as a claim would, the counts against
    /// [`limits::MAX_BATCH`], and that renewals come before the lease runs out.
    pub fn validate(&self) -> std::result::Result<(), InvalidInput> {
        ClaimRequest::new(self.worker_id.clone(), self.lease).validate()?;
        if self.prefetch > limits::MAX_BATCH {
            return Err(InvalidInput::OutOfRange {
                field: "prefetch",
                value: self.prefetch.to_string(),
                min: "0".into(),
                max: limits::MAX_BATCH.to_string(),
            });
        }
        for (field, n) in [
            ("concurrency", self.concurrency),
            ("fetch", self.fetch),
            ("commit_batch", self.commit_batch),
        ] {
            if n == 0 || n > limits::MAX_BATCH {
                return Err(InvalidInput::OutOfRange {
                    field,
                    value: n.to_string(),
                    min: "1".into(),
                    max: limits::MAX_BATCH.to_string(),
                });
            }
        }
        limits::check_duration("renew_every", self.renew_every, self.lease)?;
        if self.renew_every >= self.lease {
            return Err(InvalidInput::Inconsistent(
                "renew_every must be shorter than the lease",
            ));
        }
        limits::check_duration("idle_min", self.idle_min, self.idle_max)?;
        Ok(())
    }

    fn claim(&self) -> ClaimRequest {
        ClaimRequest::new(self.worker_id.clone(), self.lease)
    }
}

/// What a [`Consumer`] did, counted when it stopped.
///
/// ```
/// # fn f(stopped: taskfence::runtime::Stopped) {
/// println!("{} completed, {} released at the stop", stopped.completed, stopped.released);
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stopped {
    /// Responses this consumer saved.
    pub completed: u64,
    /// Failures it reported (a panicking work function's included).
    pub failed: u64,
    /// Leases it gave back at the stop.
    pub released: u64,
    /// Leases it lost while the work ran (taken over, cancelled, expired).
    pub lost: u64,
    /// Deliveries settled without a saved response or a release: done,
    /// busy or backing off when claimed, or settled by a failure or a lost
    /// lease.
    pub skipped: u64,
}

#[derive(Default)]
struct Counts {
    completed: AtomicU64,
    failed: AtomicU64,
    released: AtomicU64,
    lost: AtomicU64,
    skipped: AtomicU64,
}

impl Counts {
    fn add(&self, disposition: &Disposition) {
        let counter = match disposition {
            Disposition::Ack(AckReason::Completed) => &self.completed,
            Disposition::RetryAfter {
                reason: RetryReason::Released,
                ..
            } => &self.released,
            _ => &self.skipped,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn stopped(&self) -> Stopped {
        Stopped {
            completed: self.completed.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
        }
    }
}

/// Runs a work function on the tasks a [`Source`] delivers: the store
/// itself ([`StoreQueue`]) or a broker. It owns the loop a worker service
/// would otherwise write:
///
/// - **Fetch** up to the free slots of the concurrency limit; when nothing
///   comes, wait (doubling from [`idle_min`](ConsumerConfig::idle_min) to
///   [`idle_max`](ConsumerConfig::idle_max)), woken at once by a submission
///   in this process. A broker's task ids are claimed together
///   ([`claim_many`](TaskStore::claim_many)); a delivery that needs no work
///   (done, busy, backing off) is settled without calling the work function.
/// - **Work**: each task's work function runs as its own tokio task with a
///   [`WorkContext`]. A panic is a retryable failure that counts against the
///   budget, never a lost task; a [`Failure`] goes to the task's policy (its
///   [`retry_after`](Failure::retry_after) included).
/// - **Renew** every held lease each [`renew_every`](ConsumerConfig::renew_every)
///   in one request ([`renew_many`](TaskStore::renew_many)); a work function
///   whose lease is lost is told ([`WorkContext::lease_lost`]) and dropped
///   after [`lost_grace`](ConsumerConfig::lost_grace).
/// - **Commit** responses in groups ([`complete_many`](TaskStore::complete_many)):
///   each completion still fenced on its own, each delivery settled only
///   once its own completion is durable.
/// - **Stop** on [`Stop`]: no more fetching, running work finishes within
///   the [`grace`](ConsumerConfig::grace), what remains is released so
///   another process takes it at once; a second request releases at once.
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
        let running = Arc::new(AtomicUsize::new(0));
        let (committer, commit_loop) = Committer::start(
            Arc::clone(&self.store),
            config.commit_batch,
            config.commit_window,
            Arc::clone(&running),
        );
        let held = Arc::new(Held::new());
        // In a set, so dropping `run` (aborted, say) stops the renewals too:
        // a consumer that is gone must not keep its leases alive.
        let mut renewals = JoinSet::new();
        renewals.spawn(renew_loop(
            Arc::clone(&self.store),
            Arc::clone(&self.source),
            Arc::clone(&held),
            Arc::clone(&self.clock),
            config.renew_every,
            config.lease,
        ));
        let shared = Arc::new(Shared {
            working: Arc::new(Semaphore::new(config.concurrency)),
            store: Arc::clone(&self.store),
            source: Arc::clone(&self.source),
            config: Arc::clone(&config),
            clock: Arc::clone(&self.clock),
            held,
            running,
            committer,
            counts: Counts::default(),
            stop: self.stop.clone(),
            work: Arc::new(work),
        });

        let mut runs = JoinSet::new();
        fetch_loop(&shared, &mut runs).await;

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
        let deadline = Instant::now() + config.release_deadline;
        while let Ok(Some(_)) = tokio::time::timeout_at(deadline, runs.join_next()).await {}
        runs.abort_all();
        renewals.abort_all();
        let counts = shared.counts.stopped();
        drop(shared); // the committer's last handle: its loop ends after the queued batch
        if tokio::time::timeout_at(deadline, commit_loop).await.is_err() {
            tracing::warn!("the last completions were not saved before the release deadline");
        }
        tracing::info!(?counts, "consumer stopped");
        Ok(counts)
    }
}

/// What every run of a consumer shares.
struct Shared<S: Source, F> {
    /// A slot per work function running (the concurrency limit).
    working: Arc<Semaphore>,
    store: Arc<dyn TaskStore>,
    source: Arc<S>,
    config: Arc<ConsumerConfig>,
    clock: Arc<dyn Clock>,
    held: Arc<Held<S::Receipt>>,
    /// Work functions running now (what the committer waits for).
    running: Arc<AtomicUsize>,
    committer: Committer,
    counts: Counts,
    stop: Stop,
    work: Arc<F>,
}

impl<S: Source, F> Shared<S, F> {
    fn retry_at(&self, at: time::OffsetDateTime, reason: RetryReason) -> Disposition {
        retry_at(&*self.clock, self.config.min_retry_delay, at, reason)
    }

    /// Tells the source, within the release deadline.
    async fn settle(&self, receipt: S::Receipt, disposition: Disposition) {
        self.counts.add(&disposition);
        match tokio::time::timeout(
            self.config.release_deadline,
            self.source.settle(receipt, disposition),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "settling a delivery failed"),
            Err(_) => tracing::warn!("settling a delivery timed out"),
        }
    }
}

/// Fetches and starts work until a stop is requested.
async fn fetch_loop<S, F, Fut>(shared: &Arc<Shared<S, F>>, runs: &mut JoinSet<()>)
where
    S: Source,
    S::Receipt: Clone,
    F: Fn(WorkContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<Response, Failure>> + Send + 'static,
{
    let config = &shared.config;
    let claim = config.claim();
    // A slot per task held: running, or ready to run.
    let slots = Arc::new(Semaphore::new(config.concurrency + config.prefetch));
    let wake = shared.source.wake();
    let mut phase = shared.stop.watch();
    let mut idle = config.idle_min;
    loop {
        while runs.try_join_next().is_some() {}
        let first = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => permit.expect("the semaphore is never closed"),
            () = reached(&mut phase, Phase::Draining) => return,
        };
        let mut permits = vec![first];
        while permits.len() < config.fetch {
            match Arc::clone(&slots).try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        // While work runs, slots come back one by one: wait a moment for
        // half of them rather than fetching a task at a time.
        let refill = ((config.concurrency + config.prefetch) / 2).clamp(1, config.fetch);
        if permits.len() < refill
            && let Ok(Ok(more)) = tokio::time::timeout(
                REFILL_WAIT,
                Arc::clone(&slots)
                    .acquire_many_owned(u32::try_from(refill - permits.len()).unwrap_or(u32::MAX)),
            )
            .await
        {
            permits.extend(split(more));
        }
        if shared.stop.phase() >= Phase::Draining {
            return;
        }
        // A fetch under way when a stop comes may finish within the grace;
        // past it (or on a second request) it is dropped, so a slow source
        // never holds the stop: what it took then waits for its own timer
        // (a lease, a message's visibility).
        let fetched = tokio::select! {
            fetched = shared.source.fetch(permits.len(), &claim) => fetched,
            () = reached(&mut phase, Phase::Now) => return,
            () = shared.stop.grace_over(config.grace) => return,
        };
        let deliveries = match fetched {
            Ok(deliveries) if !deliveries.is_empty() => deliveries,
            Ok(_) => Vec::new(),
            Err(error) => {
                tracing::warn!(%error, "fetch failed");
                Vec::new()
            }
        };
        if deliveries.is_empty() {
            drop(permits);
            tokio::select! {
                () = tokio::time::sleep(idle) => {}
                () = async { match &wake { Some(wake) => wake.woken().await, None => std::future::pending().await } } => {}
                () = reached(&mut phase, Phase::Draining) => return,
            }
            idle = (idle * 2).min(config.idle_max);
            continue;
        }
        idle = config.idle_min;
        let leased = tokio::select! {
            leased = acquire(shared, deliveries) => leased,
            () = reached(&mut phase, Phase::Now) => return,
            () = shared.stop.grace_over(config.grace) => return,
        };
        if shared.stop.phase() >= Phase::Draining {
            // Fetched as the stop began: give them back untouched, together,
            // within the release deadline.
            let giving_back = leased
                .into_iter()
                .map(|(lease, receipt)| give_back(shared, lease, receipt));
            let all = futures_util::future::join_all(giving_back);
            if tokio::time::timeout(config.release_deadline, all).await.is_err() {
                tracing::warn!("giving back a fetch timed out; its leases expire on their own");
            }
            return;
        }
        for (lease, receipt) in leased {
            let permit = permits
                .pop()
                .expect("a fetch asks for no more than the free slots");
            runs.spawn(run(Arc::clone(shared), lease, receipt, permit));
        }
    }
}

/// The leases of a fetch: the source's own, and those its task ids got in
/// one `claim_many`; every other delivery is settled here (done, busy,
/// backing off, a duplicate in the fetch, or a claim that failed).
async fn acquire<S, F>(
    shared: &Shared<S, F>,
    deliveries: Vec<Delivery<S::Receipt>>,
) -> Vec<(Lease, S::Receipt)>
where
    S: Source,
{
    let mut leased = Vec::with_capacity(deliveries.len());
    let mut ids: Vec<TaskId> = Vec::new();
    let mut receipts = Vec::new();
    for delivery in deliveries {
        match delivery {
            Delivery::Leased(lease, receipt) => leased.push((lease, receipt)),
            Delivery::Task(id, receipt) if ids.contains(&id) => {
                // The same task twice in one fetch: the first delivery stands for both.
                shared
                    .settle(receipt, Disposition::Ack(AckReason::AlreadyCompleted))
                    .await;
            }
            Delivery::Task(id, receipt) => {
                ids.push(id);
                receipts.push(receipt);
            }
        }
    }
    if ids.is_empty() {
        return leased;
    }
    match shared.store.claim_many(&ids, shared.config.claim()).await {
        Ok(claims) => {
            for (claim, receipt) in claims.into_iter().zip(receipts) {
                match settled(claim, |at, reason| shared.retry_at(at, reason)) {
                    Err(lease) => leased.push((lease, receipt)),
                    Ok(disposition) => shared.settle(receipt, disposition).await,
                }
            }
        }
        Err(error) => {
            tracing::warn!(%error, "claiming a fetch failed; its messages come back on their own");
            for receipt in receipts {
                shared
                    .settle(receipt, Disposition::Leave(LeaveReason::StoreFailed))
                    .await;
            }
        }
    }
    leased
}

/// Releases a lease this consumer will not work on, and tells the source.
async fn give_back<S: Source, F>(shared: &Shared<S, F>, lease: Lease, receipt: S::Receipt) {
    if let Err(error) = shared.store.release(lease).await {
        tracing::warn!(%error, "releasing a lease failed; it expires on its own");
    }
    let released = Disposition::RetryAfter {
        delay: Duration::ZERO,
        reason: RetryReason::Released,
    };
    shared.settle(receipt, released).await;
}

/// How one task's work ended.
enum Ended {
    /// The work function returned, or panicked.
    Returned(std::result::Result<std::result::Result<Response, Failure>, JoinError>),
    /// The lease was lost while it ran.
    Lost,
    /// The consumer is stopping at once.
    Stopping,
}

/// How long a fetch waits for half the slots to come back while work runs.
const REFILL_WAIT: Duration = Duration::from_millis(2);

/// One permit of several as one permit each.
fn split(mut permits: OwnedSemaphorePermit) -> Vec<OwnedSemaphorePermit> {
    let mut out = Vec::with_capacity(permits.num_permits());
    while permits.num_permits() > 1 {
        out.push(permits.split(1).expect("more than one permit is held"));
    }
    out.push(permits);
    out
}

/// One task: held ready until a work slot is free, its work under the held
/// lease (the slot of the concurrency limit held while the work function
/// runs), then the durable outcome, then the source is told.
async fn run<S, F, Fut>(
    shared: Arc<Shared<S, F>>,
    lease: Lease,
    receipt: S::Receipt,
    permit: OwnedSemaphorePermit,
) where
    S: Source,
    S::Receipt: Clone,
    F: Fn(WorkContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<Response, Failure>> + Send + 'static,
{
    let held_slot = permit;
    let id = lease.task_id();
    let lost = shared.held.insert(lease.clone(), receipt);
    // Whatever ends this run, a panic in a source's code included, the lease
    // is no longer renewed from here on: at worst it expires.
    let _let_go = LetGo(&shared.held, id);
    // Ready: wait for a work slot; a stop gives back what has not started.
    let mut phase = shared.stop.watch();
    let slot = tokio::select! {
        slot = Arc::clone(&shared.working).acquire_owned() => slot.expect("the semaphore is never closed"),
        () = reached(&mut phase, Phase::Draining) => {
            let Some(receipt) = shared.held.remove(id) else { return };
            return give_back(&shared, lease, receipt).await;
        }
    };
    shared.running.fetch_add(1, Ordering::AcqRel);
    // The work and its outcome in the task's `process` span (see `crate::trace`).
    let span = crate::trace::process_span(&lease);
    let ctx = WorkContext {
        store: Arc::clone(&shared.store),
        lease: lease.clone(),
        lost: lost.clone(),
    };
    // The work function is called inside the spawned task, so a panic in
    // the call itself (before it returns its future) is caught there too.
    let work_fn = Arc::clone(&shared.work);
    let mut work = tokio::spawn(async move { work_fn(ctx).await }.instrument(span.clone()));
    // A run dropped with its consumer takes its work function with it.
    let _work_ends_with_the_run = AbortOnDrop(work.abort_handle());
    let ended = tokio::select! {
        returned = &mut work => Ended::Returned(returned),
        () = lost_signal(lost) => {
            if tokio::time::timeout(shared.config.lost_grace, &mut work).await.is_err() {
                tracing::warn!(task_id = %id, "work ignored the lease-lost signal; dropped after the grace");
            }
            Ended::Lost
        }
        () = reached(&mut phase, Phase::Now) => Ended::Stopping,
    };
    work.abort();
    shared.running.fetch_sub(1, Ordering::AcqRel);
    // The work is over: its slots go to the next tasks while the outcome is
    // saved (the lease stays held, and renewed, until then).
    drop((slot, held_slot));
    let disposition = outcome(&shared, lease, ended, &span)
        .instrument(span.clone())
        .await;
    let Some(disposition) = disposition else { return };
    let Some(receipt) = shared.held.remove(id) else {
        return;
    };
    shared.settle(receipt, disposition).await;
}

/// What became of a task's work: the store told (the response saved, the
/// failure reported) and `span` marked; `None` when the run gave the task
/// back (a stop) and the source is told nothing more.
async fn outcome<S, F, Fut>(
    shared: &Arc<Shared<S, F>>,
    lease: Lease,
    ended: Ended,
    span: &tracing::Span,
) -> Option<Disposition>
where
    S: Source,
    S::Receipt: Clone,
    F: Fn(WorkContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<Response, Failure>> + Send + 'static,
{
    let id = lease.task_id();
    Some(match ended {
        Ended::Stopping => {
            crate::trace::record_error(span, "stopped");
            let receipt = shared.held.remove(id)?;
            give_back(shared, lease, receipt).await;
            return None;
        }
        Ended::Lost => {
            crate::trace::record_error(span, "lease_lost");
            shared.counts.lost.fetch_add(1, Ordering::Relaxed);
            match shared.held.lost(id).flatten() {
                Some(rejection) => terminal_ack(&rejection)
                    .unwrap_or(Disposition::Leave(LeaveReason::LeaseLost(Some(rejection)))),
                None => Disposition::Leave(LeaveReason::LeaseLost(None)),
            }
        }
        Ended::Returned(Ok(Ok(response))) => match shared.committer.complete(lease, response).await {
            Ok(Fenced::Accepted(_)) => {
                crate::trace::record_ok(span);
                Disposition::Ack(AckReason::Completed)
            }
            Ok(Fenced::Rejected(rejection)) => {
                crate::trace::record_error(span, "refused");
                rejected(rejection)
            }
            Err(error) => {
                crate::trace::record_error(span, "store_error");
                tracing::warn!(task_id = %id, %error, "saving the response failed; the next delivery decides");
                Disposition::Leave(LeaveReason::StoreFailed)
            }
        },
        Ended::Returned(Ok(Err(failure))) => {
            crate::trace::record_error(span, failure.kind.as_str());
            report(shared, lease, failure).await
        }
        Ended::Returned(Err(join)) => {
            crate::trace::record_error(span, "panic");
            let failure = if join.is_panic() {
                panic_failure(join.into_panic())
            } else {
                Failure::retryable("the work function was cancelled")
            };
            tracing::error!(task_id = %id, message = %failure.message, "work function panicked");
            report(shared, lease, failure).await
        }
    })
}

/// Stops holding a task's lease when dropped (a no-op when the run already did).
struct LetGo<'h, R: Clone>(&'h Held<R>, TaskId);

impl<R: Clone> Drop for LetGo<'_, R> {
    fn drop(&mut self) {
        self.0.remove(self.1);
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resolves once the lease is lost.
async fn lost_signal(mut lost: watch::Receiver<bool>) {
    if lost.wait_for(|lost| *lost).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Reports a failure to the task's policy.
async fn report<S: Source, F>(shared: &Shared<S, F>, lease: Lease, mut failure: Failure) -> Disposition {
    shared.counts.failed.fetch_add(1, Ordering::Relaxed);
    if failure.validate().is_err() {
        failure.message = fit(&failure.message);
    }
    let id = lease.task_id();
    match shared.store.fail(lease, failure).await {
        Ok(Fenced::Accepted(Retry::Scheduled {
            not_before,
            attempts_left,
        })) => shared.retry_at(not_before, RetryReason::Scheduled { attempts_left }),
        Ok(Fenced::Accepted(Retry::Exhausted(_))) => Disposition::Ack(AckReason::Failed),
        Ok(Fenced::Rejected(rejection)) => rejected(rejection),
        Err(error) => {
            tracing::warn!(task_id = %id, %error, "reporting the failure failed; the next delivery decides");
            Disposition::Leave(LeaveReason::StoreFailed)
        }
    }
}

/// `message` within the failure message's limits: control characters but
/// newlines and tabs replaced, cut at a character boundary.
fn fit(message: &str) -> String {
    let mut out: String = message
        .chars()
        .map(|c| {
            if c.is_control() && !matches!(c, '\n' | '\t') {
                ' '
            } else {
                c
            }
        })
        .collect();
    if out.len() > limits::MAX_MESSAGE_LEN {
        let mut end = limits::MAX_MESSAGE_LEN;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

/// A panic of the work function as the retryable failure it counts as
/// (the message kept within the limit).
pub(super) fn panic_failure(payload: Box<dyn std::any::Any + Send>) -> Failure {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic".into());
    Failure::retryable(fit(&format!("the work function panicked: {text}")))
}
