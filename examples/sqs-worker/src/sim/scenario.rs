//! A whole run: submit tasks, publish every handoff (more than once), let a
//! fleet of workers drain the queue, and report what happened. The binary
//! prints the report; the end-to-end test checks it against the store.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use taskfence::intercept::Intercepted;
use taskfence::{
    DynamoStore, InputHash, NewTask, PgStore, RequestKey, RetryPolicy, Status, TaskId, TaskStore,
};

use taskfence_sqs::{Dispatcher, SqsQueue, SqsWorker, Stats, WorkerConfig};

use crate::BoxError;
use crate::sim::chaos::{StallingStore, Stalls};
use crate::sim::fleet::Fleet;
use crate::sim::llm::{CallOutcome, SimulatedConfig, SimulatedLlm};

/// The store a run uses, with its outbox.
#[derive(Debug, Clone)]
pub enum StoreChoice {
    /// PostgreSQL: `submit` writes the handoff row.
    Postgres(PgStore),
    /// DynamoDB: `submit` writes the handoff item in the task's transaction.
    Dynamo(DynamoStore),
}

impl StoreChoice {
    /// The DynamoDB backend on `store`'s table.
    pub fn dynamo(store: DynamoStore) -> Self {
        Self::Dynamo(store)
    }

    /// The task store.
    pub fn store(&self) -> Arc<dyn TaskStore> {
        match self {
            Self::Postgres(pg) => Arc::new(pg.clone()),
            Self::Dynamo(store) => Arc::new(store.clone()),
        }
    }

    async fn submit(&self, task: NewTask) -> taskfence::Result<taskfence::Submitted> {
        match self {
            Self::Postgres(pg) => pg.submit(task).await,
            Self::Dynamo(store) => store.submit(task).await,
        }
    }

    fn dispatcher(&self, queue: SqsQueue, batch: usize) -> Dispatcher {
        match self {
            Self::Postgres(pg) => Dispatcher::new(pg.clone(), queue, batch),
            Self::Dynamo(store) => Dispatcher::new(store.clone(), queue, batch),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Tasks submitted.
    pub tasks: usize,
    /// Lose the answer to the first `SendMessageBatch` that carries a handoff
    /// (the messages did reach the queue): the dispatcher sees a failure,
    /// leaves the batch pending and sends it again next round, so every
    /// handoff is sent twice.
    pub lose_first_send_ack: bool,
    /// Handoffs per dispatcher round.
    pub dispatch_batch: usize,
    /// Concurrent workers.
    pub workers: usize,
    /// The queue's default visibility timeout (the workers' receives ask for
    /// `lease + slack` instead).
    pub queue_visibility: Duration,
    /// Lease length; renewed every third of it.
    pub lease: Duration,
    /// Per-worker settings.
    pub worker: WorkerConfig,
    /// Every task's retry budget.
    pub policy: RetryPolicy,
    /// The simulated provider.
    pub provider: SimulatedConfig,
    /// Give up waiting for the queue to drain after this long.
    pub deadline: Duration,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            tasks: 50,
            lose_first_send_ack: true,
            dispatch_batch: 50,
            workers: 4,
            queue_visibility: Duration::from_secs(2),
            lease: Duration::from_secs(5),
            worker: WorkerConfig {
                poll_wait: Duration::from_secs(1),
                visibility_slack: Duration::from_secs(1),
                ..WorkerConfig::default()
            },
            policy: RetryPolicy::default()
                .max_attempts(6)
                .initial_backoff(Duration::from_millis(500))
                .max_backoff(Duration::from_secs(2)),
            provider: SimulatedConfig::default(),
            deadline: Duration::from_secs(300),
        }
    }
}

/// What happened.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The tasks submitted.
    pub task_ids: Vec<TaskId>,
    /// Messages published.
    pub published: u64,
    /// Messages received (redeliveries included).
    pub deliveries: u64,
    /// Provider calls, by outcome.
    pub provider_calls: BTreeMap<String, u64>,
    /// Tasks completed with a saved response.
    pub completed: u64,
    /// Tasks terminally failed.
    pub failed: u64,
    /// Attempts made (claims), over all tasks.
    pub attempts: u64,
    /// Workers killed mid-flight.
    pub kills: u64,
    /// How many deliveries saved each task's response (must be 1 for every completed task).
    pub saved_by_task: HashMap<TaskId, u32>,
    /// Dispositions, by name.
    pub dispositions: BTreeMap<&'static str, u64>,
    /// Visibility extensions made while leases were renewed.
    pub extensions: u64,
    /// Extensions that failed.
    pub extension_errors: u64,
    /// Deliveries of a message still being handled (a visibility timeout ran out mid-work).
    pub redelivered_in_flight: u64,
    /// Handlings that ended on a store error.
    pub store_errors: u64,
    /// Messages left in the queue at the end.
    pub left_in_queue: u64,
    /// Wall time from the first publish until the queue was empty.
    pub elapsed: Duration,
}

impl Report {
    /// Provider calls of every outcome.
    pub fn total_provider_calls(&self) -> u64 {
        self.provider_calls.values().sum()
    }

    /// Deliveries whose lease was refused a write: a renewal (lease lost
    /// mid-work) or the final save or failure report.
    pub fn rejections(&self) -> u64 {
        ["leave.lease_lost", "leave.rejected", "ack.completed_elsewhere"]
            .iter()
            .map(|name| self.dispositions.get(name).copied().unwrap_or(0))
            .sum()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "tasks                  {}", self.task_ids.len())?;
        writeln!(f, "messages published     {}", self.published)?;
        writeln!(f, "deliveries             {}", self.deliveries)?;
        writeln!(f, "attempts (claims)      {}", self.attempts)?;
        writeln!(
            f,
            "provider calls         {} {:?}",
            self.total_provider_calls(),
            self.provider_calls
        )?;
        writeln!(f, "saved responses        {}", self.completed)?;
        writeln!(f, "terminal failures      {}", self.failed)?;
        writeln!(f, "workers killed         {}", self.kills)?;
        writeln!(f, "fenced rejections      {}", self.rejections())?;
        writeln!(f, "dispositions           {:?}", self.dispositions)?;
        writeln!(
            f,
            "visibility extensions  {} ({} failed)",
            self.extensions, self.extension_errors
        )?;
        writeln!(f, "redelivered in flight  {}", self.redelivered_in_flight)?;
        writeln!(f, "store errors           {}", self.store_errors)?;
        writeln!(f, "left in queue          {}", self.left_in_queue)?;
        write!(f, "elapsed                {:.1?}", self.elapsed)
    }
}

/// Submits `scenario.tasks` tasks to `store_choice` (each with its handoff),
/// starts the fleet, dispatches the handoffs to `queue`, waits until every
/// task is terminal and the queue is empty (or the deadline passes), and stops.
pub async fn run(
    scenario: &Scenario,
    store_choice: StoreChoice,
    queue: SqsQueue,
) -> Result<(Report, SimulatedLlm), BoxError> {
    let store = store_choice.store();
    let llm = SimulatedLlm::new(scenario.provider.clone());
    let stats = Arc::new(Stats::default());
    let run_id = TaskId::new();

    let mut task_ids = Vec::with_capacity(scenario.tasks);
    for i in 0..scenario.tasks {
        // The browser's request id for one press of Send.
        let key = RequestKey::new("workspace-1", "chat.reply", format!("{run_id}-{i}"));
        let task = NewTask::new(
            key,
            InputHash::of([format!("conversation-{i}"), format!("message-{i}")]),
        )
        .payload(format!("question #{i}"))
        .policy(scenario.policy);
        task_ids.push(store_choice.submit(task).await?.into_task().id);
    }

    let started = Instant::now();
    let fleet = {
        let (store, queue, llm, stats) = (Arc::clone(&store), queue.clone(), llm.clone(), Arc::clone(&stats));
        let (lease, settings) = (scenario.lease, scenario.worker.clone());
        Fleet::start(scenario.workers, move |worker_id, kill| {
            // Each worker incarnation stalls and dies on its own, like a process would.
            let stalls = Stalls::new();
            let alive: Arc<dyn TaskStore> = Arc::new(Intercepted::new(Arc::clone(&store), kill.clone()));
            let worker_store: Arc<dyn TaskStore> = Arc::new(StallingStore::new(alive, stalls.clone()));
            let worker = SqsWorker::sharing_stats(
                kill.queue(&queue),
                worker_store,
                worker_id,
                lease,
                &settings,
                Arc::clone(&stats),
            )
            .expect("valid worker settings");
            (
                worker,
                Arc::new(llm.for_worker(kill, stalls)) as Arc<dyn crate::Provider>,
            )
        })
    };

    let dispatcher = store_choice.dispatcher(queue.clone(), scenario.dispatch_batch);
    let acks_lost = Arc::new(Mutex::new(HashSet::new()));
    let lose_first_send_ack = scenario.lose_first_send_ack;
    let lose_ack = move |tasks: &[TaskId]| -> Result<(), String> {
        if lose_first_send_ack {
            let mut lost = acks_lost.lock().unwrap();
            let mut first_send = false;
            for &task in tasks {
                first_send |= lost.insert(task);
            }
            if first_send {
                return Err("SendMessageBatch timed out (the messages were sent)".into());
            }
        }
        Ok(())
    };
    let mut marked = 0;
    let mut rounds = 0;
    while marked < task_ids.len() {
        rounds += 1;
        if rounds > 2 * task_ids.len() + 10 {
            return Err(format!("the outbox did not drain: {marked} of {} marked", task_ids.len()).into());
        }
        match dispatcher.round_checked(lose_ack.clone()).await {
            Ok(published) => marked += published.len(),
            // As the service's dispatcher does: what it did not mark stays pending for the next round.
            Err(error) => tracing::warn!(%error, "a dispatch round failed"),
        }
    }
    let published = dispatcher.sent();
    if !dispatcher.round().await?.is_empty() {
        return Err("the outbox still had handoffs after every task was published".into());
    }

    // Wait until the store has settled every task and the queue is empty.
    // The tasks are read only once the queue looks empty (until then some
    // surely are open, and reading them would compete with the workers for
    // the store: moto's DynamoDB serves one request at a time); a terminal
    // task stays terminal, so only the open ones are read again.
    let deadline = started + scenario.deadline;
    let mut open = task_ids.clone();
    loop {
        let left_in_queue = queue.depth().await?.total();
        if left_in_queue == 0 {
            let mut still_open = Vec::with_capacity(open.len());
            for id in open {
                match store.get(id).await {
                    Ok(Some(task)) if task.status.is_terminal() => {}
                    Ok(Some(_)) => still_open.push(id),
                    Ok(None) => return Err("a submitted task disappeared".into()),
                    // A read that timed out behind the workers' requests: again next round.
                    Err(error) if error.is_retryable() => {
                        tracing::debug!(%id, %error, "reading a task failed; again next round");
                        still_open.push(id);
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            open = still_open;
            if open.is_empty() {
                break;
            }
        }
        if Instant::now() >= deadline {
            tracing::error!(
                open = open.len(),
                left_in_queue,
                "deadline passed before the queue drained"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let elapsed = started.elapsed();
    let kills = fleet.stop().await;

    let mut report = Report {
        published,
        deliveries: stats.deliveries.load(Ordering::Relaxed),
        kills,
        dispositions: stats.dispositions(),
        saved_by_task: stats.saved_by_task(),
        extensions: stats.extensions.load(Ordering::Relaxed),
        extension_errors: stats.extension_errors.load(Ordering::Relaxed),
        redelivered_in_flight: stats.redelivered_in_flight.load(Ordering::Relaxed),
        store_errors: stats.store_errors.load(Ordering::Relaxed),
        left_in_queue: queue.depth().await?.total(),
        elapsed,
        ..Report::default()
    };
    for call in llm.calls() {
        let name = match call.outcome {
            CallOutcome::Answered => "answered",
            CallOutcome::AnsweredThenCrashed => "answered_then_crashed",
            CallOutcome::AnsweredThenStalled => "answered_then_stalled",
            CallOutcome::Transient => "transient",
            CallOutcome::Ambiguous => "ambiguous",
            CallOutcome::Permanent => "permanent",
        };
        *report.provider_calls.entry(name.to_owned()).or_default() += 1;
    }
    for &id in &task_ids {
        let task = store.get(id).await?.ok_or("a submitted task disappeared")?;
        report.attempts += u64::from(task.attempts());
        match task.status {
            Status::Completed => report.completed += 1,
            Status::Failed => report.failed += 1,
            _ => {}
        }
    }
    report.task_ids = task_ids;
    Ok((report, llm))
}
