//! The reply consumer: taskfence's [`Consumer`] over a Kafka topic whose
//! records name task ids (`KafkaSource`). The library claims each fetch in
//! one `claim_many`, runs the work function under a concurrency limit, renews the
//! leases, group-commits the responses and stops within a bound; this module
//! only turns Kafka into deliveries and settlements into offsets.
//!
//! Why it looks the way it does:
//! * **Commits are ours alone** (`enable.auto.commit` and
//!   `enable.auto.offset.store` off), and each is the [`OffsetTracker`]'s safe
//!   position: records finish out of order, so the commit stays on the lowest
//!   one still in flight. A record is tracked from the moment it is fetched
//!   and finished only when the store durably settled its task.
//! * **Kafka cannot show one record again later**, so a record whose task is
//!   busy, backing off, or whose lease was lost stays in flight here and is
//!   delivered again after the wait; the store decides what it is worth then.
//! * **A partition's records belong to one assignment.** Revoking commits the
//!   safe position and forgets the rest: the next owner re-reads them, and a
//!   late settlement of this assignment's record moves nothing.
//! * **Stopping** is the consumer's: no more fetching, the grace for running
//!   work, then its leases released; their records stay unfinished, so the
//!   final commit (on leaving the group) stops before them.
//! * **Results go out before the record is finished** (with
//!   [`KafkaConfig::publish_results`]): a record whose task was saved (by
//!   this delivery, or before it) publishes the saved result first; a failed
//!   publish delivers the record again, whose claim finds the result saved.
//!   In PostgreSQL position mode the completion's transaction already moves
//!   the position, so a crash between the save and the publish loses that
//!   publication: use group offsets when every result must go out.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::offsets::OffsetTracker;
use async_trait::async_trait;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use std::future::Future;
use taskfence::error::InvalidInput;
use taskfence::intercept::{Call, Intercept, Intercepted, Outcome, Pending as Run};
use taskfence::runtime::{
    AckReason, Consumer, ConsumerConfig, Delivery, Disposition, RetryReason, Source, Stop, Stopped,
    WorkContext,
};
use taskfence::{Claim, ClaimRequest, Failure, Fenced, Lease, PgStore, Response, Task, TaskId, TaskStore};
use tokio::time::Instant;

use crate::dispatcher::task_id;
use crate::journal::{Event, Handled, Journal};
use crate::positions::{Pending, PgPositions, PositionedStore};
use crate::results::Results;

/// How long a fetch waits for a record when none is waiting.
const POLL_WAIT: Duration = Duration::from_secs(1);

/// Where the consumer reads.
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// The consumer group: consumers in one group share the partitions.
    pub group: String,
    /// The handoff topic.
    pub topic: String,
    /// This consumer's name (Kafka `client.id`; use the worker id).
    pub name: String,
    /// `session.timeout.ms`: how long the group waits for a silent member.
    pub session_timeout: Duration,
    /// Where saved results are published (`None`: nowhere).
    pub results: Option<Arc<Results>>,
}

impl KafkaConfig {
    /// A config with a 10 s session timeout.
    ///
    /// ```
    /// let c = taskfence_kafka::KafkaConfig::new("127.0.0.1:9092", "reply-workers", "handoffs", "worker-a");
    /// assert_eq!(c.session_timeout.as_secs(), 10);
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
            session_timeout: Duration::from_secs(10),
            results: None,
        }
    }

    /// Publishes every saved result to `results` before its handoff record
    /// is finished (see the module documentation).
    pub fn publish_results(mut self, results: Arc<Results>) -> Self {
        self.results = Some(results);
        self
    }

    fn client_config(&self) -> ClientConfig {
        let session = self.session_timeout.as_millis();
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap)
            .set("group.id", &self.group)
            .set("client.id", &self.name)
            // The two settings that make commits ours alone.
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", session.to_string())
            .set("heartbeat.interval.ms", (session / 5).max(100).to_string())
            // Eager protocol: a rebalance revokes everything, then assigns.
            .set("partition.assignment.strategy", "roundrobin");
        c
    }
}

/// A delivery's receipt: a record, in one assignment (`generation`) of its partition.
#[derive(Debug, Clone, Copy)]
struct Record {
    partition: i32,
    offset: i64,
    task: TaskId,
    generation: u64,
}

/// What the source, the rebalance callbacks and the handle share.
struct Shared {
    name: String,
    topic: String,
    journal: Arc<dyn Journal>,
    /// Records in flight and safe positions. Lock order: tracker, then `state`.
    tracker: Arc<Mutex<OffsetTracker<i32>>>,
    /// Set by [`ReplyConsumer::kill`]: a dead process runs no more code.
    dead: Arc<AtomicBool>,
    state: Mutex<State>,
    /// PostgreSQL position mode: the table, and the record each task came from.
    positions: Option<(Arc<PgPositions>, Arc<Pending>)>,
    /// The wait before a record whose lease was lost is claimed again.
    retry_delay: Duration,
    /// Where saved results go, if anywhere.
    results: Option<Arc<Results>>,
    /// Saved tasks seen by a claim or a completion, until their records settle.
    saved: Arc<Saved>,
    /// The store's answers to releases, until their records settle.
    releases: Arc<Releases>,
    /// Taken on shutdown or kill (dropping it leaves the group).
    client: Mutex<Option<Arc<StreamConsumer<Ctx>>>>,
}

#[derive(Default)]
struct State {
    /// Owned partitions, each with its assignment's generation.
    owned: HashMap<i32, u64>,
    generations: u64,
    /// Records to deliver again once their instant is reached.
    waiting: Vec<(Instant, Record)>,
}

impl Shared {
    fn new(kafka: &KafkaConfig, config: &ConsumerConfig, journal: Arc<dyn Journal>) -> Self {
        Self {
            name: kafka.name.clone(),
            topic: kafka.topic.clone(),
            journal,
            tracker: Arc::default(),
            dead: Arc::default(),
            state: Mutex::default(),
            positions: None,
            retry_delay: config.min_retry_delay,
            results: kafka.results.clone(),
            saved: Arc::default(),
            releases: Arc::default(),
            client: Mutex::new(None),
        }
    }

    fn client(&self) -> Option<Arc<StreamConsumer<Ctx>>> {
        self.client.lock().expect("client lock").clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("state lock")
    }

    /// A record is durably handled: journal it (a killed consumer too: the
    /// save it waited for landed) and, if it belongs to the current
    /// assignment, commit the partition's new safe position. Under the
    /// tracker lock, so commits of one partition go out in order.
    fn finish(&self, partition: i32, offset: i64, generation: u64, task: Option<TaskId>, handled: Handled) {
        let mut tracker = self.tracker.lock().expect("tracker lock");
        let consumer = self.name.clone();
        self.journal.record(Event::Finished {
            consumer,
            partition,
            offset,
            task,
            handled,
        });
        let current = self.state().owned.get(&partition) == Some(&generation);
        if current
            && !self.dead.load(Ordering::SeqCst)
            && tracker.finish(&partition, offset)
            && let Some(position) = tracker.take_commit(&partition)
        {
            self.commit(partition, position);
        }
    }

    /// Saves a safe position: to PostgreSQL in position mode (in the
    /// background; positions only move forward), else as an asynchronous
    /// group commit. Call under the tracker lock.
    fn commit(&self, partition: i32, position: i64) {
        let consumer = self.name.clone();
        self.journal.record(Event::Commit {
            consumer,
            partition,
            offset: position,
            with: None,
        });
        if let Some((positions, _)) = &self.positions {
            let (positions, topic) = (Arc::clone(positions), self.topic.clone());
            let (journal, consumer) = (Arc::clone(&self.journal), self.name.clone());
            tokio::spawn(async move {
                let ok = positions.save(&topic, partition, position).await;
                if let Err(error) = &ok {
                    tracing::warn!(partition, position, %error, "saving the position failed; a later one covers it");
                }
                journal.record(Event::CommitResult {
                    consumer,
                    partition,
                    offset: position,
                    ok: ok.is_ok(),
                });
            });
            return;
        }
        let mut tpl = TopicPartitionList::new();
        let committed = tpl
            .add_partition_offset(&self.topic, partition, Offset::Offset(position))
            .and_then(|()| self.client().ok_or(KafkaError::Canceled))
            .and_then(|client| client.commit(&tpl, CommitMode::Async));
        if let Err(error) = committed {
            tracing::warn!(partition, position, %error, "commit failed; a later commit covers it");
            self.commit_result(partition, position, false);
        }
    }

    fn commit_result(&self, partition: i32, offset: i64, ok: bool) {
        let consumer = self.name.clone();
        self.journal.record(Event::CommitResult {
            consumer,
            partition,
            offset,
            ok,
        });
    }

    /// Delivers the waiting records that are due (one per task, up to `max`);
    /// returns when the next one is.
    fn due(
        &self,
        max: usize,
        out: &mut Vec<Delivery<Record>>,
        tasks: &mut HashSet<TaskId>,
    ) -> Option<Instant> {
        let mut state = self.state();
        let (now, mut next) = (Instant::now(), None::<Instant>);
        let waiting = std::mem::take(&mut state.waiting);
        for (at, record) in waiting {
            if state.owned.get(&record.partition) != Some(&record.generation) {
                continue; // revoked: the next owner re-reads it
            }
            if at <= now && out.len() < max && tasks.insert(record.task) {
                self.deliver(record, out);
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
                state.waiting.push((at, record));
            }
        }
        next
    }

    fn deliver(&self, record: Record, out: &mut Vec<Delivery<Record>>) {
        if let Some((_, pending)) = &self.positions {
            pending.expect(record.task, record.partition, record.offset);
        }
        out.push(Delivery::Task(record.task, record));
    }

    /// A record just read: tracked at once (so the commit stays before it),
    /// then delivered, held for the next fetch (a second copy of a task in
    /// this one), or finished (no task id).
    fn received(
        &self,
        m: &rdkafka::message::BorrowedMessage<'_>,
        out: &mut Vec<Delivery<Record>>,
        tasks: &mut HashSet<TaskId>,
    ) {
        let (partition, offset, task) = (m.partition(), m.offset(), task_id(m.payload()));
        let consumer = self.name.clone();
        self.journal.record(Event::Received {
            consumer,
            partition,
            offset,
            task,
        });
        let mut tracker = self.tracker.lock().expect("tracker lock");
        let mut state = self.state();
        // Callbacks run only inside `recv`: a record of a revoked partition is stale.
        let Some(&generation) = state.owned.get(&partition) else {
            return;
        };
        tracker.start(partition, offset);
        let Some(task) = task else {
            tracing::warn!(partition, offset, "handoff without a task id; skipped");
            drop((state, tracker));
            return self.finish(partition, offset, generation, None, Handled::Malformed);
        };
        let record = Record {
            partition,
            offset,
            task,
            generation,
        };
        if tasks.insert(task) {
            drop(state);
            self.deliver(record, out);
        } else {
            // The first copy is claimed now; this one after it, alone.
            state.waiting.push((Instant::now(), record));
        }
    }
}

/// The handoff topic as the consumer's [`Source`].
struct KafkaSource(Arc<Shared>);

#[async_trait]
impl Source for KafkaSource {
    type Receipt = Record;

    /// The records due again, then what Kafka has: waits up to [`POLL_WAIT`]
    /// (or until a record is due) for one, then takes what is fetched already.
    async fn fetch(&self, max: usize, _claim: &ClaimRequest) -> taskfence::Result<Vec<Delivery<Record>>> {
        let shared = &self.0;
        let (mut out, mut tasks) = (Vec::new(), HashSet::new());
        let Some(client) = shared.client().filter(|_| !shared.dead.load(Ordering::SeqCst)) else {
            return Ok(out);
        };
        let next = shared.due(max, &mut out, &mut tasks);
        let mut wait = match next {
            _ if !out.is_empty() => Duration::ZERO,
            Some(at) => POLL_WAIT.min(at.saturating_duration_since(Instant::now())),
            None => POLL_WAIT,
        };
        while out.len() < max {
            // A zero timeout still polls once: takes what is fetched already.
            let Ok(message) = tokio::time::timeout(wait, client.recv()).await else {
                break;
            };
            wait = Duration::ZERO;
            match message {
                Ok(m) => shared.received(&m, &mut out, &mut tasks),
                Err(error) => {
                    tracing::warn!(%error, "receive failed");
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Ack: the record is handled. Released (a stop): it stays unfinished
    /// for the next owner. Any other: delivered again after the wait.
    async fn settle(&self, record: Record, disposition: Disposition) -> taskfence::Result<()> {
        let shared = &self.0;
        if let Some((_, pending)) = &shared.positions {
            pending.forget(record.task, record.partition, record.offset);
        }
        let Record {
            partition,
            offset,
            task,
            generation,
        } = record;
        let delay = match disposition {
            Disposition::Ack(reason) => {
                let saved = shared.saved.take(task);
                if let (Some(results), AckReason::Completed | AckReason::AlreadyCompleted) =
                    (&shared.results, reason)
                {
                    let published = match &saved {
                        Some(saved) => results.publish(saved).await.map_err(|e| e.to_string()),
                        None => Err("the saved task was not seen".to_owned()),
                    };
                    if let Err(error) = published {
                        // Delivered again: its claim finds the result saved.
                        tracing::warn!(%task, %error, "publishing the result failed; the record goes again");
                        shared
                            .state()
                            .waiting
                            .push((Instant::now() + shared.retry_delay, record));
                        return Ok(());
                    }
                }
                shared.finish(partition, offset, generation, Some(task), handled_as(reason));
                return Ok(());
            }
            Disposition::RetryAfter {
                reason: RetryReason::Released,
                ..
            } => {
                let consumer = shared.name.clone();
                let (accepted, refusal) = match shared.releases.take(task) {
                    Some(Ok(())) => (true, None),
                    Some(Err(refusal)) => (false, Some(refusal)),
                    None => (false, Some("the store gave no answer".to_owned())),
                };
                if !accepted {
                    tracing::warn!(%task, refusal = refusal.as_deref().unwrap_or_default(), "the store did not accept the release; the lease runs out on its own");
                }
                shared.journal.record(Event::Released {
                    consumer,
                    partition,
                    offset,
                    task,
                    accepted,
                    refusal,
                });
                return Ok(());
            }
            Disposition::RetryAfter { delay, reason } => {
                tracing::debug!(%task, ?reason, ?delay, "not now; delivered again after the wait");
                delay
            }
            Disposition::Leave(reason) => {
                tracing::info!(%task, ?reason, "lease lost or store failed; delivered again");
                shared.retry_delay
            }
        };
        shared.state().waiting.push((Instant::now() + delay, record));
        Ok(())
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

/// The rdkafka context: rebalance and commit callbacks (run inside `recv`).
struct Ctx(Arc<Shared>);

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let (shared, Rebalance::Revoke(revoked)) = (&self.0, rebalance) else {
            return;
        };
        let mut commit = TopicPartitionList::new();
        {
            let mut tracker = shared.tracker.lock().expect("tracker lock");
            if shared.dead.load(Ordering::SeqCst) {
                return;
            }
            let mut state = shared.state();
            for element in revoked.elements_for_topic(&shared.topic) {
                let partition = element.partition();
                state.owned.remove(&partition);
                let consumer = shared.name.clone();
                shared.journal.record(Event::Revoked { consumer, partition });
                if let Some(position) = tracker.revoke(&partition) {
                    let consumer = shared.name.clone();
                    shared.journal.record(Event::Commit {
                        consumer,
                        partition,
                        offset: position,
                        with: None,
                    });
                    let _ = commit.add_partition_offset(&shared.topic, partition, Offset::Offset(position));
                }
            }
        }
        if commit.count() == 0 {
            return;
        }
        // Synchronous: the next owner must see it.
        let ok = match &shared.positions {
            Some((positions, _)) => block_on(async {
                for e in commit.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        positions.save(&shared.topic, e.partition(), o).await?;
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

    fn post_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let (shared, Rebalance::Assign(assigned)) = (&self.0, rebalance) else {
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
        // Where this assignment resumes: position mode seeks to the saved
        // positions (the first record when none is saved); otherwise the
        // group's committed offsets apply, read back here for the journal.
        // `None`: unknown (the read failed), so the journal makes no claim.
        let committed: Option<HashMap<i32, Option<i64>>> = match &shared.positions {
            Some((positions, _)) => match block_on(positions.load(&shared.topic, &partitions)) {
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
                    let offset = |o| match o {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    };
                    let elements = tpl.elements_for_topic(&shared.topic);
                    elements
                        .iter()
                        .map(|e| (e.partition(), offset(e.offset())))
                        .collect()
                })
                .inspect_err(|error| tracing::warn!(%error, "could not read the committed offsets"))
                .ok(),
        };
        let mut state = shared.state();
        for partition in partitions {
            state.generations += 1;
            let generation = state.generations;
            state.owned.insert(partition, generation);
            if let Some(committed) = &committed {
                let (consumer, committed) =
                    (shared.name.clone(), committed.get(&partition).copied().flatten());
                shared.journal.record(Event::Assigned {
                    consumer,
                    partition,
                    committed,
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

/// Waits for a future from a synchronous rdkafka callback (multi-thread runtime only).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
}

/// Saved tasks a claim or a completion returned, by task, with how many
/// records are still to settle for it: what a record's settlement publishes.
#[derive(Default)]
struct Saved(Mutex<HashMap<TaskId, (Task, usize)>>);

impl Saved {
    fn seen(&self, task: &Task) {
        let mut saved = self.0.lock().expect("saved lock");
        let entry = saved.entry(task.id).or_insert_with(|| (task.clone(), 0));
        entry.0 = task.clone();
        entry.1 += 1;
    }

    fn take(&self, id: TaskId) -> Option<Task> {
        let mut saved = self.0.lock().expect("saved lock");
        let (task, left) = saved.get_mut(&id)?;
        *left -= 1;
        let task = task.clone();
        if *left == 0 {
            saved.remove(&id);
        }
        Some(task)
    }
}

/// The store's answer to each release, by task, until the record of the
/// released task settles and the journal says whether it was accepted.
#[derive(Default)]
struct Releases(Mutex<HashMap<TaskId, Result<(), String>>>);

impl Releases {
    fn answered(&self, task: TaskId, answer: &taskfence::Result<Fenced<()>>) {
        let answer = match answer {
            Ok(Fenced::Accepted(())) => Ok(()),
            Ok(Fenced::Rejected(rejection)) => Err(format!("refused: {rejection}")),
            Err(error) => Err(format!("store error: {error}")),
        };
        self.0.lock().expect("releases lock").insert(task, answer);
    }

    fn take(&self, task: TaskId) -> Option<Result<(), String>> {
        self.0.lock().expect("releases lock").remove(&task)
    }
}

/// The store as this consumer sees it: every call refused once it is
/// killed (a dead process writes nothing), batches kept native; saved
/// tasks noted for [`Saved`], answers to releases for [`Releases`].
struct Alive(Arc<AtomicBool>, Arc<Saved>, Arc<Releases>);

impl Alive {
    fn claimed(&self, claim: &Claim) {
        if let Claim::Completed(task) = claim {
            self.1.seen(task);
        }
    }

    fn completed(&self, done: &taskfence::Result<Fenced<Task>>) {
        if let Ok(Fenced::Accepted(task)) = done {
            self.1.seen(task);
        }
    }
}

#[async_trait]
impl Intercept for Alive {
    async fn around<'a, T: Outcome + Send + 'a>(
        &'a self,
        _call: Call,
        run: Run<'a, T>,
    ) -> taskfence::Result<T> {
        if self.0.load(Ordering::SeqCst) {
            return Err(taskfence::Error::storage(std::io::Error::other(
                "consumer killed",
            )));
        }
        run.await
    }
    async fn claim(
        &self,
        inner: &dyn TaskStore,
        id: TaskId,
        request: ClaimRequest,
    ) -> taskfence::Result<Claim> {
        let claim = inner.claim(id, request).await?;
        self.claimed(&claim);
        Ok(claim)
    }
    async fn complete(
        &self,
        inner: &dyn TaskStore,
        lease: Lease,
        response: Response,
    ) -> taskfence::Result<Fenced<Task>> {
        let done = inner.complete(lease, response).await;
        self.completed(&done);
        done
    }
    async fn release(&self, inner: &dyn TaskStore, lease: Lease) -> taskfence::Result<Fenced<()>> {
        let task = lease.task_id();
        let answer = inner.release(lease).await;
        self.2.answered(task, &answer);
        answer
    }
    // A prefetched claim given back at a stop: its answer is reported alike.
    async fn release_unstarted(&self, inner: &dyn TaskStore, lease: Lease) -> taskfence::Result<Fenced<()>> {
        let task = lease.task_id();
        let answer = inner.release_unstarted(lease).await;
        self.2.answered(task, &answer);
        answer
    }
    async fn claim_many(
        &self,
        inner: &dyn TaskStore,
        ids: &[TaskId],
        request: ClaimRequest,
    ) -> taskfence::Result<Vec<Claim>> {
        let claims = inner.claim_many(ids, request).await?;
        claims.iter().for_each(|claim| self.claimed(claim));
        Ok(claims)
    }
    async fn complete_many(
        &self,
        inner: &dyn TaskStore,
        completions: Vec<(Lease, Response)>,
    ) -> taskfence::Result<Vec<taskfence::Result<Fenced<Task>>>> {
        let done = inner.complete_many(completions).await?;
        done.iter().for_each(|done| self.completed(done));
        Ok(done)
    }
    async fn renew_many(
        &self,
        inner: &dyn TaskStore,
        leases: &mut [Lease],
        by: Duration,
    ) -> taskfence::Result<Vec<Fenced<()>>> {
        inner.renew_many(leases, by).await
    }
}

/// A running reply consumer. Stop it with [`shutdown`](Self::shutdown) (or
/// its [`stop`](Self::stop) switch), or, in a crash test, [`kill`](Self::kill).
pub struct ReplyConsumer {
    shared: Arc<Shared>,
    stop: Stop,
    task: tokio::task::JoinHandle<taskfence::Result<Stopped>>,
}

impl ReplyConsumer {
    /// Subscribes to the topic and starts consuming, with tasks in `store`
    /// and the group's committed offsets as positions.
    pub fn spawn<F, Fut>(
        kafka: KafkaConfig,
        store: Arc<dyn TaskStore>,
        config: ConsumerConfig,
        journal: Arc<dyn Journal>,
        work: F,
    ) -> Result<Self, SpawnError>
    where
        F: Fn(WorkContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Response, Failure>> + Send + 'static,
    {
        let shared = Shared::new(&kafka, &config, journal);
        Self::start(kafka, store, config, shared, work)
    }

    /// Like [`spawn`](Self::spawn), in **PostgreSQL position mode**: each
    /// completion saves its partition's position in the same transaction,
    /// and an assigned partition starts from the saved position; the group's
    /// offsets are not used. See [`positions`](crate::positions). The
    /// rebalance callbacks wait for PostgreSQL with `block_in_place`: this
    /// needs tokio's multi-thread runtime.
    pub fn spawn_with_positions<F, Fut>(
        kafka: KafkaConfig,
        config: ConsumerConfig,
        store: Arc<PgStore>,
        positions: Arc<PgPositions>,
        journal: Arc<dyn Journal>,
        work: F,
    ) -> Result<Self, SpawnError>
    where
        F: Fn(WorkContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Response, Failure>> + Send + 'static,
    {
        let mut shared = Shared::new(&kafka, &config, Arc::clone(&journal));
        let (topic, tracker, dead) = (kafka.topic.clone(), &shared.tracker, &shared.dead);
        let pending = Pending::new(
            topic,
            kafka.name.clone(),
            Arc::clone(tracker),
            Arc::clone(dead),
            journal,
        );
        let pending = Arc::new(pending);
        let store = PositionedStore::wrap(store, Arc::clone(&positions), Arc::clone(&pending));
        shared.positions = Some((positions, pending));
        // Each completion is a transaction of its own (it moves its record's
        // position): batching them would only hold each answer for the batch.
        let config = config.commit(1, Duration::ZERO);
        Self::start(kafka, Arc::new(store), config, shared, work)
    }

    fn start<F, Fut>(
        kafka: KafkaConfig,
        store: Arc<dyn TaskStore>,
        config: ConsumerConfig,
        shared: Shared,
        work: F,
    ) -> Result<Self, SpawnError>
    where
        F: Fn(WorkContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Response, Failure>> + Send + 'static,
    {
        let shared = Arc::new(shared);
        let alive = Alive(
            Arc::clone(&shared.dead),
            Arc::clone(&shared.saved),
            Arc::clone(&shared.releases),
        );
        let store = Arc::new(Intercepted::new(store, alive));
        let consumer = Consumer::new(store, KafkaSource(Arc::clone(&shared)), config)?;
        let client: StreamConsumer<Ctx> = kafka
            .client_config()
            .create_with_context(Ctx(Arc::clone(&shared)))?;
        client.subscribe(&[&kafka.topic])?;
        *shared.client.lock().expect("client lock") = Some(Arc::new(client));
        let stop = consumer.stop().clone();
        let run = consumer.run(work);
        Ok(Self {
            shared,
            stop,
            task: tokio::spawn(run),
        })
    }

    /// Partitions this consumer owns now.
    pub fn assigned(&self) -> Vec<i32> {
        let mut p: Vec<i32> = self.shared.state().owned.keys().copied().collect();
        p.sort_unstable();
        p
    }

    /// The stop switch: the first request drains, a second releases at once.
    pub fn stop(&self) -> &Stop {
        &self.stop
    }

    /// Stops (draining, unless a stop is already further along), waits for
    /// the consumer, then leaves the group: the revoke commits the safe
    /// positions. Returns what the consumer did.
    pub async fn shutdown(self) -> Stopped {
        self.stop.drain();
        let stopped = match self.task.await {
            Ok(Ok(stopped)) => stopped,
            Ok(Err(error)) => {
                tracing::error!(%error, "the consumer could not start");
                Stopped::default()
            }
            Err(error) => {
                tracing::warn!(%error, "consumer task ended abnormally");
                Stopped::default()
            }
        };
        // Closing the client is blocking (librdkafka waits for the leave).
        let client = self.shared.client.lock().expect("client lock").take();
        let _ = tokio::task::spawn_blocking(move || drop(client)).await;
        stopped
    }

    /// Simulates a crash (`kill -9`): from now on this consumer commits
    /// nothing and its store calls are refused (so its leases are left to
    /// expire), its work is dropped; what it committed before stays, the
    /// next owner re-reads the rest. Only saves already under way are still
    /// journaled as finished. (Destroying the librdkafka client still sends
    /// LeaveGroup, so the group rebalances at once instead of after
    /// `session.timeout.ms`.)
    pub fn kill(self) {
        {
            let _tracker = self.shared.tracker.lock().expect("tracker lock");
            self.shared.dead.store(true, Ordering::SeqCst);
        }
        let consumer = self.shared.name.clone();
        self.shared.journal.record(Event::Killed { consumer });
        self.stop.now();
        let client = self.shared.client.lock().expect("client lock").take();
        tokio::task::spawn_blocking(move || drop(client));
    }
}

/// Why [`ReplyConsumer::spawn`] or [`ReplyConsumer::spawn_with_positions`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The consumer configuration is invalid.
    #[error(transparent)]
    Config(#[from] InvalidInput),
    /// The Kafka client could not be created or subscribed.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}
