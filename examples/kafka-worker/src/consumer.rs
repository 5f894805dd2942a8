//! The reply consumer: reads handoff records, runs each task through the
//! worker runtime, and commits a partition's offset only once every record
//! before it is durably handled.
//!
//! * Auto commit is off and so is `enable.auto.offset.store`: the only
//!   commits are the ones this module issues, each one the
//!   [`OffsetTracker`]'s safe position (the lowest record still in flight).
//! * Several records of one partition run at once (bounded per partition by
//!   [`ConsumerConfig::per_partition`]), so they finish out of order; the
//!   tracker keeps the commit behind the oldest unfinished one.
//! * Records are claimed in batches: after waiting for one record, the poll
//!   loop takes every record already fetched (any partition) while its
//!   partition has a free slot, without waiting for more, and claims their
//!   tasks with one [`TaskStore::claim_many`]. Each record then runs on its
//!   own exactly as [`Worker::handle`] would (its first claim answered from
//!   the batch), renews its own lease, saves its own result and is finished
//!   (and committed past) as soon as *it* settles, not when the batch does.
//!   A second copy of a task in one batch is left out of the batch claim and
//!   claims on its own, as before.
//! * A record is finished when the store says its task is settled: saved by
//!   this attempt, completed before (a re-read: the provider is not called),
//!   or terminally failed. Busy or backing off: the consumer keeps the record
//!   and claims again after the wait. Kafka has no per-message timer to bring
//!   a record back, so giving up on it would stall the partition's commits.
//! * On revoke: commit what is committable, stop tracking; the next owner
//!   re-reads the rest from the committed offset. On (re)start: the group
//!   resumes from the committed offset, and records whose tasks are already
//!   complete are skipped by the claim.
//! * On shutdown ([`ReplyConsumer::shutdown`]): no new records; in-flight
//!   ones get [`ConsumerConfig::shutdown_grace`] to finish; the leases still
//!   held after it are given back ([`TaskStore::release`]: pending again at
//!   once, the attempt counted) and their records stay unfinished, so the
//!   final commit stops before them and the next owner re-reads them.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use taskfence::error::InvalidInput;
use taskfence::intercept::{Intercept, Intercepted};
use taskfence::offsets::OffsetTracker;
use taskfence::runtime::{AckReason, Disposition, LeaseHooks, Worker, WorkerConfig};
use taskfence::{Claim, ClaimRequest, Fenced, Lease, PgStore, Response, TaskId, TaskStore, limits};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};
use tokio::task::JoinSet;

use crate::dispatcher::task_id;
use crate::journal::{Event, Handled, Journal};
use crate::positions::{Pending, PgPositions, PositionedStore};
use crate::provider::{Provider, ProviderError, ProviderRequest};

/// Where and how a reply consumer reads.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// The consumer group: consumers in one group share the partitions.
    pub group: String,
    /// The handoff topic.
    pub topic: String,
    /// This consumer's name (Kafka `client.id`; use the worker id).
    pub name: String,
    /// Records of one partition processed at once.
    pub per_partition: usize,
    /// Wait before claiming again after the lease was lost or the store failed.
    pub retry_delay: Duration,
    /// `session.timeout.ms`: how long the group waits for a silent member.
    pub session_timeout: Duration,
    /// On shutdown, how long in-flight records may take to finish before
    /// their leases are released.
    pub shutdown_grace: Duration,
}

impl ConsumerConfig {
    /// A config with 4 records per partition, 500 ms retry delay, 10 s session
    /// timeout, 30 s shutdown grace.
    ///
    /// ```
    /// use kafka_worker::consumer::ConsumerConfig;
    /// let c = ConsumerConfig::new("127.0.0.1:9092", "reply-workers", "handoffs", "worker-a");
    /// assert_eq!(c.per_partition, 4);
    /// ```
    pub fn new(
        bootstrap: impl Into<String>,
        group: impl Into<String>,
        topic: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            bootstrap: bootstrap.into(),
            group: group.into(),
            topic: topic.into(),
            name: name.into(),
            per_partition: 4,
            retry_delay: Duration::from_millis(500),
            session_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
        }
    }

    fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap)
            .set("group.id", &self.group)
            .set("client.id", &self.name)
            // The two settings that make commits ours alone.
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", self.session_timeout.as_millis().to_string())
            .set(
                "heartbeat.interval.ms",
                (self.session_timeout.as_millis() / 5).max(100).to_string(),
            )
            // Eager protocol: a rebalance revokes everything, then assigns.
            .set("partition.assignment.strategy", "roundrobin");
        c
    }
}

/// State shared by the poll loop, the record tasks and the rebalance callbacks.
struct Shared {
    name: String,
    topic: String,
    journal: Arc<dyn Journal>,
    /// Which records are in flight per partition, and what is safe to commit.
    tracker: Arc<Mutex<OffsetTracker<i32>>>,
    /// Partitions owned now, each with a flag cleared when it is revoked.
    owned: Mutex<HashMap<i32, Arc<AtomicBool>>>,
    /// Set by [`ReplyConsumer::kill`]: a dead process runs no more code.
    dead: Arc<AtomicBool>,
    /// PostgreSQL position mode: positions live in PostgreSQL, not in the group.
    pg: Option<PgMode>,
    /// The store the worker runs on, to release leases at shutdown.
    store: Arc<dyn TaskStore>,
    /// The lease each in-flight record holds now, by `(partition, offset)`.
    held: Mutex<HashMap<(i32, i64), Lease>>,
}

struct PgMode {
    positions: Arc<PgPositions>,
    pending: Arc<Pending>,
}

impl Shared {
    /// Saves a safe position: to PostgreSQL in position mode (in the
    /// background; positions only move forward, so order does not matter),
    /// else as an asynchronous group commit. Call under the tracker lock.
    fn commit<C: Consumer<Ctx>>(&self, consumer: &C, partition: i32, position: i64) {
        self.journal.record(Event::Commit {
            consumer: self.name.clone(),
            partition,
            offset: position,
            with: None,
        });
        if let Some(pg) = &self.pg {
            let positions = Arc::clone(&pg.positions);
            let (topic, name, journal) = (self.topic.clone(), self.name.clone(), Arc::clone(&self.journal));
            tokio::spawn(async move {
                let ok = positions.save(&topic, partition, position).await;
                if let Err(error) = &ok {
                    tracing::warn!(partition, position, %error, "saving the position failed; a later one covers it");
                }
                journal.record(Event::CommitResult {
                    consumer: name,
                    partition,
                    offset: position,
                    ok: ok.is_ok(),
                });
            });
            return;
        }
        let mut tpl = TopicPartitionList::new();
        if let Err(error) = tpl
            .add_partition_offset(&self.topic, partition, Offset::Offset(position))
            .and_then(|()| consumer.commit(&tpl, CommitMode::Async))
        {
            tracing::warn!(partition, position, %error, "commit failed; a later commit covers it");
            self.commit_result(partition, position, false);
        }
    }

    fn owned(&self, partition: i32) -> Option<Arc<AtomicBool>> {
        self.owned.lock().expect("owned lock").get(&partition).cloned()
    }

    /// A record is durably handled: mark it and commit the partition's new
    /// safe position, if it moved. The commit is issued under the tracker lock,
    /// so commits of one partition go out in order.
    fn finish<C: Consumer<Ctx>>(&self, consumer: &C, partition: i32, offset: i64) {
        let mut tracker = self.tracker.lock().expect("tracker lock");
        if self.dead.load(Ordering::SeqCst) || !tracker.finish(&partition, offset) {
            return; // revoked meanwhile: the next owner re-reads it
        }
        if let Some(position) = tracker.take_commit(&partition) {
            self.commit(consumer, partition, position);
        }
    }

    fn commit_result(&self, partition: i32, offset: i64, ok: bool) {
        self.journal.record(Event::CommitResult {
            consumer: self.name.clone(),
            partition,
            offset,
            ok,
        });
    }
}

/// The rdkafka context: rebalance and commit callbacks.
struct Ctx(Arc<Shared>);

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let shared = &self.0;
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        let mut commit = TopicPartitionList::new();
        {
            let mut tracker = shared.tracker.lock().expect("tracker lock");
            if shared.dead.load(Ordering::SeqCst) {
                return;
            }
            let mut owned = shared.owned.lock().expect("owned lock");
            for element in revoked.elements_for_topic(&shared.topic) {
                let partition = element.partition();
                if let Some(flag) = owned.remove(&partition) {
                    flag.store(false, Ordering::SeqCst);
                }
                shared.journal.record(Event::Revoked {
                    consumer: shared.name.clone(),
                    partition,
                });
                if let Some(position) = tracker.revoke(&partition) {
                    shared.journal.record(Event::Commit {
                        consumer: shared.name.clone(),
                        partition,
                        offset: position,
                        with: None,
                    });
                    let _ = commit.add_partition_offset(&shared.topic, partition, Offset::Offset(position));
                }
            }
        }
        if commit.count() > 0 {
            // Synchronous: the next owner must see it.
            let ok = match &shared.pg {
                Some(pg) => block_on(async {
                    for e in commit.elements() {
                        if let Offset::Offset(o) = e.offset() {
                            pg.positions.save(&shared.topic, e.partition(), o).await?;
                        }
                    }
                    Ok::<_, taskfence::Error>(())
                })
                .map_err(|e| e.to_string()),
                None => base.commit(&commit, CommitMode::Sync).map_err(|e| e.to_string()),
            };
            if let Err(error) = &ok {
                tracing::warn!(%error, "commit on revoke failed; the next owner re-reads more");
            }
            for e in commit.elements() {
                if let Offset::Offset(o) = e.offset() {
                    shared.commit_result(e.partition(), o, ok.is_ok());
                }
            }
        }
    }

    fn post_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let shared = &self.0;
        let Rebalance::Assign(assigned) = rebalance else {
            return;
        };
        if shared.dead.load(Ordering::SeqCst) {
            return;
        }
        let partitions: Vec<i32> = assigned
            .elements_for_topic(&shared.topic)
            .iter()
            .map(|e| e.partition())
            .collect();
        // Where this assignment resumes: PostgreSQL mode seeks to the saved
        // positions (the first record when none is saved); otherwise the group's
        // committed offsets apply, read back here for the journal.
        // `None`: unknown (the read failed), so the journal makes no claim.
        let committed: Option<HashMap<i32, Option<i64>>> = match &shared.pg {
            Some(pg) => match block_on(pg.positions.load(&shared.topic, &partitions)) {
                Ok(saved) => {
                    let mut seek = TopicPartitionList::new();
                    for p in &partitions {
                        let offset = saved.get(p).map_or(Offset::Beginning, |o| Offset::Offset(*o));
                        let _ = seek.add_partition_offset(&shared.topic, *p, offset);
                    }
                    if let Err(error) = base.assign(&seek) {
                        tracing::error!(%error, "could not seek to the saved positions");
                    }
                    Some(partitions.iter().map(|p| (*p, saved.get(p).copied())).collect())
                }
                Err(error) => {
                    // The group's offsets are unused in this mode, so the
                    // partitions start at the first record: re-reads, no skips.
                    tracing::error!(%error, "could not load the saved positions");
                    None
                }
            },
            None => base
                .committed_offsets((*assigned).clone(), Duration::from_secs(10))
                .map(|tpl| {
                    tpl.elements_for_topic(&shared.topic)
                        .into_iter()
                        .map(|e| {
                            let offset = match e.offset() {
                                Offset::Offset(o) => Some(o),
                                _ => None,
                            };
                            (e.partition(), offset)
                        })
                        .collect()
                })
                .inspect_err(|error| tracing::warn!(%error, "could not read the committed offsets"))
                .ok(),
        };
        let mut owned = shared.owned.lock().expect("owned lock");
        for element in assigned.elements_for_topic(&shared.topic) {
            let partition = element.partition();
            owned.insert(partition, Arc::new(AtomicBool::new(true)));
            if let Some(committed) = &committed {
                shared.journal.record(Event::Assigned {
                    consumer: shared.name.clone(),
                    partition,
                    committed: committed.get(&partition).copied().flatten(),
                });
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(error) = &result {
            tracing::warn!(%error, "async commit failed; a later commit covers it");
        }
        for e in offsets.elements() {
            if let Offset::Offset(o) = e.offset() {
                self.0.commit_result(e.partition(), o, result.is_ok());
            }
        }
    }
}

/// A running reply consumer. Stop it with [`shutdown`](Self::shutdown)
/// (finish in-flight records, commit, leave the group) or, in a crash test,
/// [`kill`](Self::kill).
pub struct ReplyConsumer {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<ShutdownReport>,
}

impl ReplyConsumer {
    /// Subscribes to the handoff topic and starts processing, with tasks
    /// in `store` and the group's committed offsets as positions.
    pub fn spawn(
        config: ConsumerConfig,
        store: Arc<dyn TaskStore>,
        worker: WorkerConfig,
        provider: Arc<dyn Provider>,
        journal: Arc<dyn Journal>,
    ) -> Result<Self, SpawnError> {
        let tracker = Arc::new(Mutex::new(OffsetTracker::new()));
        Self::start(
            config,
            store,
            worker,
            provider,
            journal,
            tracker,
            Arc::default(),
            None,
        )
    }

    /// Like [`spawn`](Self::spawn), in **PostgreSQL position mode**: each
    /// completion saves its partition's position in the same transaction
    /// (through [`PgStore::on`]`(&mut tx).complete(…)`), and an assigned partition starts
    /// from the saved position; the group's offsets are not used. See
    /// [`positions`](crate::positions) for what that protects and what not.
    ///
    /// The rebalance callbacks wait for PostgreSQL with `block_in_place`, so
    /// this needs tokio's multi-thread runtime.
    pub fn spawn_with_positions(
        config: ConsumerConfig,
        worker: WorkerConfig,
        store: Arc<PgStore>,
        positions: Arc<PgPositions>,
        provider: Arc<dyn Provider>,
        journal: Arc<dyn Journal>,
    ) -> Result<Self, SpawnError> {
        let tracker = Arc::new(Mutex::new(OffsetTracker::new()));
        let dead = Arc::new(AtomicBool::new(false));
        let pending = Arc::new(Pending::new(
            config.topic.clone(),
            config.name.clone(),
            Arc::clone(&tracker),
            Arc::clone(&dead),
            Arc::clone(&journal),
        ));
        let positioned = PositionedStore::wrap(store, Arc::clone(&positions), Arc::clone(&pending));
        let pg = PgMode { positions, pending };
        Self::start(
            config,
            Arc::new(positioned),
            worker,
            provider,
            journal,
            tracker,
            dead,
            Some(pg),
        )
    }

    #[allow(clippy::too_many_arguments)] // private: the two public constructors name them
    fn start(
        config: ConsumerConfig,
        store: Arc<dyn TaskStore>,
        worker: WorkerConfig,
        provider: Arc<dyn Provider>,
        journal: Arc<dyn Journal>,
        tracker: Arc<Mutex<OffsetTracker<i32>>>,
        dead: Arc<AtomicBool>,
        pg: Option<PgMode>,
    ) -> Result<Self, SpawnError> {
        let worker = Worker::new(Arc::clone(&store), worker)?;
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            topic: config.topic.clone(),
            journal,
            tracker,
            owned: Mutex::new(HashMap::new()),
            dead,
            pg,
            store,
            held: Mutex::new(HashMap::new()),
        });
        let consumer: StreamConsumer<Ctx> = config
            .client_config()
            .create_with_context(Ctx(Arc::clone(&shared)))?;
        consumer.subscribe(&[&config.topic])?;
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(poll_loop(
            Arc::new(consumer),
            Arc::clone(&shared),
            config,
            worker,
            provider,
            stopped,
        ));
        Ok(Self { shared, stop, task })
    }

    /// Partitions this consumer owns now.
    pub fn assigned(&self) -> Vec<i32> {
        let mut p: Vec<i32> = self
            .shared
            .owned
            .lock()
            .expect("owned lock")
            .keys()
            .copied()
            .collect();
        p.sort_unstable();
        p
    }

    /// Graceful stop: no new records; in-flight ones get
    /// [`ConsumerConfig::shutdown_grace`] to finish and commit; the leases
    /// still held then are released and their records left unfinished; then
    /// the consumer leaves the group (revoking commits the safe positions).
    pub async fn shutdown(self) -> ShutdownReport {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_else(|error| {
            tracing::warn!(%error, "consumer task ended abnormally");
            ShutdownReport::default()
        })
    }

    /// Simulates a crash (`kill -9`): from now on this consumer runs none of
    /// its own code: no commit, no revoke handling, in-flight records and their
    /// leases abandoned mid-call. What it committed before stays; everything
    /// after is re-read by the next owner. (Destroying the librdkafka client
    /// still sends LeaveGroup, so the group rebalances at once instead of after
    /// `session.timeout.ms`; the offsets involved are the same.)
    pub fn kill(self) {
        {
            let _tracker = self.shared.tracker.lock().expect("tracker lock");
            self.shared.dead.store(true, Ordering::SeqCst);
        }
        self.shared.journal.record(Event::Killed {
            consumer: self.shared.name.clone(),
        });
        self.task.abort();
    }
}

impl std::fmt::Debug for ReplyConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyConsumer")
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

async fn poll_loop(
    consumer: Arc<StreamConsumer<Ctx>>,
    shared: Arc<Shared>,
    config: ConsumerConfig,
    worker: Worker,
    provider: Arc<dyn Provider>,
    mut stop: watch::Receiver<bool>,
) -> ShutdownReport {
    let mut records = JoinSet::new();
    let mut slots: HashMap<i32, Arc<Semaphore>> = HashMap::new();
    let mut slot = |partition: i32| {
        Arc::clone(
            slots
                .entry(partition)
                .or_insert_with(|| Arc::new(Semaphore::new(config.per_partition.max(1)))),
        )
    };
    // A record read while gathering whose partition had no free slot: it
    // opens the next batch.
    let mut carried: Option<Incoming> = None;
    loop {
        // The first record of a batch: wait for it, then for a slot of its
        // partition (bounded concurrency per partition).
        let first = match carried.take() {
            Some(record) => record,
            None => {
                let message = tokio::select! {
                    _ = stop.wait_for(|stop| *stop) => break,
                    m = consumer.recv() => m,
                };
                match message {
                    Ok(m) => shared.received(&m),
                    Err(error) => {
                        tracing::warn!(%error, "receive failed");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                }
            }
        };
        // Callbacks only run inside `recv`, so the assignment cannot change
        // while this waits for a slot.
        let Some(owned) = shared.owned(first.partition) else {
            continue; // a record of a partition revoked meanwhile
        };
        let permit = tokio::select! {
            // Every slot held by a long call must not delay the shutdown: this
            // record was not started, so the next owner reads it.
            _ = stop.wait_for(|stop| *stop) => break,
            permit = slot(first.partition).acquire_owned() => permit.expect("semaphore never closed"),
        };
        let mut batch = vec![shared.start(first, owned, permit)];
        // Then every record already fetched, from any partition, while its
        // partition has a free slot: no waiting for more. Each is tracked as
        // soon as it is taken, so a revoke inside a later `recv` sees it.
        while batch.len() < limits::MAX_BATCH {
            let Some(message) = ready_now(consumer.recv()).await else {
                break; // nothing more fetched right now
            };
            let record = match message {
                Ok(m) => shared.received(&m),
                Err(error) => {
                    tracing::warn!(%error, "receive failed");
                    break;
                }
            };
            let Some(owned) = shared.owned(record.partition) else {
                continue;
            };
            match slot(record.partition).try_acquire_owned() {
                Ok(permit) => batch.push(shared.start(record, owned, permit)),
                Err(_) => {
                    carried = Some(record);
                    break;
                }
            }
        }
        launch(
            batch,
            &mut records,
            &consumer,
            &shared,
            &worker,
            &provider,
            config.retry_delay,
        );
        while records.try_join_next().is_some() {}
    }
    // Graceful stop: in-flight records get the grace period to settle and commit.
    let in_flight = records.len();
    let drained = tokio::time::timeout(config.shutdown_grace, async {
        while records.join_next().await.is_some() {}
    })
    .await
    .is_ok();
    let mut report = ShutdownReport {
        in_flight,
        ..ShutdownReport::default()
    };
    if !drained {
        report.left_unfinished = records.len();
        // Out of time: stop the work (dropping a `handle` future abandons its
        // lease), then give every lease back so the tasks are claimable at once
        // instead of after the lease expiry. Their records stay unfinished.
        records.shutdown().await;
        let held: Vec<((i32, i64), Lease)> = shared.held.lock().expect("held lock").drain().collect();
        for ((partition, offset), lease) in held {
            let task = lease.task_id();
            let accepted = match shared.store.release(lease).await {
                Ok(Fenced::Accepted(())) => true,
                Ok(Fenced::Rejected(rejection)) => {
                    tracing::info!(%task, %rejection, "release refused; the task was settled or taken over");
                    false
                }
                Err(error) => {
                    // The lease expires by itself; the task is claimable after it.
                    tracing::warn!(%task, %error, "release failed");
                    false
                }
            };
            shared.journal.record(Event::Released {
                consumer: shared.name.clone(),
                partition,
                offset,
                task,
                accepted,
            });
            report.released += usize::from(accepted);
        }
    }
    // Dropping the client closes it (blocking): revoke runs and commits what is left.
    let _ = tokio::task::spawn_blocking(move || drop(consumer)).await;
    report
}

/// What [`ReplyConsumer::shutdown`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Records in flight when the shutdown began.
    pub in_flight: usize,
    /// Leases given back because the grace period ran out.
    pub released: usize,
    /// Records left unfinished (released, or waiting out a backoff): the next
    /// owner re-reads them.
    pub left_unfinished: usize,
}

/// A record as read, before it is tracked.
struct Incoming {
    partition: i32,
    offset: i64,
    task: Option<TaskId>,
}

/// A tracked record: started in the tracker, holding a slot of its partition.
struct Record {
    partition: i32,
    offset: i64,
    task: Option<TaskId>,
    owned: Arc<AtomicBool>,
    permit: OwnedSemaphorePermit,
}

impl Shared {
    /// Journals a record as received and reads its task id.
    fn received(&self, message: &BorrowedMessage<'_>) -> Incoming {
        let record = Incoming {
            partition: message.partition(),
            offset: message.offset(),
            task: task_id(message.payload()),
        };
        self.journal.record(Event::Received {
            consumer: self.name.clone(),
            partition: record.partition,
            offset: record.offset,
            task: record.task,
        });
        record
    }

    /// Starts tracking a record: from now on the commit stays before it until it finishes.
    fn start(&self, record: Incoming, owned: Arc<AtomicBool>, permit: OwnedSemaphorePermit) -> Record {
        self.tracker
            .lock()
            .expect("tracker lock")
            .start(record.partition, record.offset);
        Record {
            partition: record.partition,
            offset: record.offset,
            task: record.task,
            owned,
            permit,
        }
    }
}

/// The output of `future` if it is ready at the first poll: takes what is
/// already fetched without waiting for more.
async fn ready_now<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    std::future::poll_fn(|cx| match future.as_mut().poll(cx) {
        Poll::Ready(output) => Poll::Ready(Some(output)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

/// Runs a gathered batch: one task per record, and one `claim_many` for the
/// distinct tasks of the batch (two or more), whose answers the records'
/// first claims take.
fn launch(
    batch: Vec<Record>,
    records: &mut JoinSet<()>,
    consumer: &Arc<StreamConsumer<Ctx>>,
    shared: &Arc<Shared>,
    worker: &Worker,
    provider: &Arc<dyn Provider>,
    retry_delay: Duration,
) {
    let mut seen = HashSet::new();
    let mut waiting = Vec::new();
    for record in batch {
        let first_claim = match record.task {
            // A second copy of a task in this batch claims on its own, as before.
            Some(id) if seen.insert(id) => {
                let (answer, first_claim) = oneshot::channel();
                waiting.push((id, answer));
                Some(first_claim)
            }
            _ => None,
        };
        records.spawn(process(
            record,
            first_claim,
            Arc::clone(consumer),
            Arc::clone(shared),
            worker.clone(),
            Arc::clone(provider),
            retry_delay,
        ));
    }
    if waiting.len() >= 2 {
        let request = ClaimRequest::new(worker.config().worker_id.clone(), worker.config().lease);
        tokio::spawn(claim_batch(Arc::clone(shared), request, waiting));
    }
    // A batch of one: dropping the sender lets the record claim on its own.
}

/// One `claim_many` for a batch; hands each answer to its record. On a store
/// error the records claim on their own (their senders are dropped).
async fn claim_batch(
    shared: Arc<Shared>,
    request: ClaimRequest,
    waiting: Vec<(TaskId, oneshot::Sender<Claim>)>,
) {
    if shared.dead.load(Ordering::SeqCst) {
        return; // killed before the claim went out: a dead process claims nothing
    }
    let ids: Vec<TaskId> = waiting.iter().map(|(id, _)| *id).collect();
    let claims = match shared.store.claim_many(&ids, request).await {
        Ok(claims) => claims,
        Err(error) => {
            tracing::warn!(%error, tasks = ids.len(), "batch claim failed; each record claims on its own");
            return;
        }
    };
    tracing::debug!(tasks = ids.len(), "claimed a batch");
    for ((_, answer), claim) in waiting.into_iter().zip(claims) {
        // The record's task is gone (stopped or killed) and the claim took a
        // lease: give it back, unless this process is "dead".
        if let Err(Claim::Acquired(lease)) = answer.send(claim)
            && !shared.dead.load(Ordering::SeqCst)
        {
            release_unused(&shared, lease).await;
        }
    }
}

/// Gives back a lease the batch claim took for a record that will not work on it.
async fn release_unused(shared: &Shared, lease: Lease) {
    let task = lease.task_id();
    if let Err(error) = shared.store.release(lease).await {
        tracing::warn!(%task, %error, "releasing an unused lease failed; it expires by itself");
    }
}

/// Answers one claim of `task` with the batch's answer, once; everything
/// else passes through. A record's first [`Worker::handle`] runs on it, so
/// the batch's claim is decided exactly as that `handle` would decide it.
struct Answered {
    task: TaskId,
    claim: Mutex<Option<Claim>>,
}

#[async_trait]
impl Intercept for Answered {
    async fn claim(
        &self,
        inner: &dyn TaskStore,
        id: TaskId,
        request: ClaimRequest,
    ) -> taskfence::Result<Claim> {
        if id == self.task
            && let Some(claim) = self.claim.lock().expect("answered lock").take()
        {
            return Ok(claim);
        }
        inner.claim(id, request).await
    }
}

async fn process(
    record: Record,
    first_claim: Option<oneshot::Receiver<Claim>>,
    consumer: Arc<StreamConsumer<Ctx>>,
    shared: Arc<Shared>,
    worker: Worker,
    provider: Arc<dyn Provider>,
    retry_delay: Duration,
) {
    let Record {
        partition,
        offset,
        task,
        owned,
        permit: _permit,
    } = record;
    // The batch's answer for this record's task, if it was in a batch claim
    // (`None`: claim on its own).
    let mut first_claim = match first_claim {
        Some(answer) => answer.await.ok(),
        None => None,
    };
    let handled = match task {
        None => {
            tracing::warn!(partition, offset, "handoff without a task id; skipped");
            Handled::Malformed
        }
        Some(id) => loop {
            if !owned.load(Ordering::SeqCst) {
                if let Some(Claim::Acquired(lease)) = first_claim.take() {
                    release_unused(&shared, lease).await;
                }
                shared.journal.record(Event::Abandoned {
                    consumer: shared.name.clone(),
                    partition,
                    offset,
                });
                return;
            }
            if let Some(pg) = &shared.pg {
                pg.pending.expect(id, partition, offset);
            }
            let hold = Hold {
                shared: &shared,
                record: (partition, offset),
            };
            let (call, journal, name) = (
                Arc::clone(&provider),
                Arc::clone(&shared.journal),
                shared.name.clone(),
            );
            // The first attempt takes the batch's claim; later ones claim again.
            let worker = match first_claim.take() {
                Some(claim) => {
                    let answered = Answered {
                        task: id,
                        claim: Mutex::new(Some(claim)),
                    };
                    let store = Intercepted::new(Arc::clone(&shared.store), answered);
                    Worker::new(Arc::new(store), worker.config().clone()).expect("validated at spawn")
                }
                None => worker.clone(),
            };
            let outcome = worker
                .handle(id, &hold, |ctx| async move {
                    let request = ProviderRequest::for_attempt(&ctx);
                    journal.record(Event::ProviderCall {
                        worker: name,
                        task: request.task_id,
                        version: ctx.lease().version(),
                    });
                    tokio::select! {
                        answer = call.generate(&request) => {
                            answer.map(Response::from).map_err(ProviderError::into_failure)
                        }
                        // Another worker owns the task now: our answer could not be saved anyway.
                        _ = ctx.lease_lost() => Err(taskfence::Failure::retryable("lease lost during the provider call")),
                    }
                })
                .await;
            shared
                .held
                .lock()
                .expect("held lock")
                .remove(&(partition, offset));
            if let Some(pg) = &shared.pg {
                pg.pending.forget(id);
            }
            match outcome {
                Ok(Disposition::Ack(reason)) => break handled_as(reason),
                Ok(Disposition::RetryAfter { delay, reason }) => {
                    tracing::debug!(%id, ?reason, ?delay, "not now; claiming again after the wait");
                    tokio::time::sleep(delay).await;
                }
                Ok(Disposition::Leave(reason)) => {
                    tracing::info!(%id, ?reason, "lease lost; claiming again");
                    tokio::time::sleep(retry_delay).await;
                }
                Err(error) => {
                    tracing::warn!(%id, %error, "store failed; claiming again");
                    tokio::time::sleep(retry_delay).await;
                }
            }
        },
    };
    shared.journal.record(Event::Finished {
        consumer: shared.name.clone(),
        partition,
        offset,
        task,
        handled,
    });
    shared.finish(&*consumer, partition, offset);
}

/// Keeps [`Shared::held`] up to date with the lease of one record, so a
/// shutdown can release it.
struct Hold<'a> {
    shared: &'a Shared,
    record: (i32, i64),
}

#[async_trait]
impl LeaseHooks for Hold<'_> {
    async fn on_claimed(&self, lease: &Lease) {
        self.hold(lease);
    }
    async fn on_renewed(&self, lease: &Lease) {
        // The renewed expiry, so a release after it carries the current lease.
        self.hold(lease);
    }
}

impl Hold<'_> {
    fn hold(&self, lease: &Lease) {
        self.shared
            .held
            .lock()
            .expect("held lock")
            .insert(self.record, lease.clone());
    }
}

fn handled_as(reason: AckReason) -> Handled {
    match reason {
        AckReason::Completed => Handled::Completed,
        AckReason::AlreadyCompleted => Handled::AlreadyCompleted,
        AckReason::CompletedElsewhere => Handled::CompletedElsewhere,
        AckReason::Failed => Handled::Failed,
        _ => Handled::Dropped,
    }
}

/// Waits for a future from a synchronous rdkafka callback (multi-thread runtime only).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
}

/// Why [`ReplyConsumer::spawn`] or [`ReplyConsumer::spawn_with_positions`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The worker configuration is invalid.
    #[error(transparent)]
    Worker(#[from] InvalidInput),
    /// The Kafka client could not be created or subscribed.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}
