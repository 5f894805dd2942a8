//! The consumer's own concurrency — fetch, prefetch, renewal batches, group
//! commit, panics, the stop with its grace and release deadline — explored
//! by a deterministic scheduler: tokio's current-thread runtime on a paused
//! clock, where the order of events is a function of the timers alone, and
//! a seed that draws every timer and fault (store latencies, store errors
//! before a write, answers lost after one, work durations and outcomes,
//! when the stop comes). Each seed is one reproducible interleaving.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use taskfence::backend::Backend;
use taskfence::clock::Clock;
use taskfence::effect::{Effect, EffectOutcome, EffectStart};
use taskfence::error::{Error, Result};
use taskfence::runtime::{ConsumerConfig, StoreQueue};
use taskfence::store::{Attempt, AttemptOutcome, ClaimNext, ClaimRequest, ReopenRequest, Retry, Submitted};
use taskfence::{
    Claim, Failure, Fenced, InputHash, Lease, MemoryStore, NewTask, RequestKey, Response, RetryPolicy,
    Status, Task, TaskId, TaskStore,
};
use time::OffsetDateTime;

/// The store's clock: tokio's (paused) clock, so a lease expires when the
/// runtime's timers say it does.
#[derive(Debug, Clone)]
struct TokioClock {
    base: OffsetDateTime,
    start: tokio::time::Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> OffsetDateTime {
        self.base + (tokio::time::Instant::now() - self.start)
    }
}

/// An injected store error.
#[derive(Debug, thiserror::Error)]
#[error("injected: {0}")]
struct Injected(&'static str);

/// `MemoryStore` behind seeded faults: each call waits a drawn latency,
/// then may fail before applying, or apply and lose its answer. Calls are
/// counted, and the tasks a fault touched are remembered.
struct Seeded {
    inner: MemoryStore,
    rng: Mutex<fastrand::Rng>,
    calls: AtomicU64,
    faulted: Mutex<HashSet<TaskId>>,
}

/// What to do with one call.
enum Fate {
    Apply,
    FailBefore,
    LoseAnswer,
}

impl Seeded {
    async fn enter(&self, tasks: &[TaskId], write: bool) -> Fate {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let (delay, roll) = {
            let mut rng = self.rng.lock().unwrap();
            (rng.u64(0..40), rng.u32(0..100))
        };
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let fate = match roll {
            0..4 => Fate::FailBefore,
            4..8 if write => Fate::LoseAnswer,
            _ => Fate::Apply,
        };
        if !matches!(fate, Fate::Apply) {
            self.faulted.lock().unwrap().extend(tasks.iter().copied());
        }
        fate
    }

    /// Runs `op` under the call's fate.
    async fn write<T, F>(&self, tasks: &[TaskId], op: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        match self.enter(tasks, true).await {
            Fate::FailBefore => Err(Error::storage(Injected("before the write"))),
            Fate::LoseAnswer => {
                op.await?;
                Err(Error::storage(Injected("answer lost")))
            }
            Fate::Apply => op.await,
        }
    }
}

#[async_trait]
impl Backend for Seeded {
    async fn submit(&self, task: NewTask) -> Result<Submitted> {
        Backend::submit(&self.inner, task).await
    }
    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        Backend::get(&self.inner, id).await
    }
    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        Backend::find(&self.inner, key).await
    }
    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        self.write(&[id], Backend::claim(&self.inner, id, request)).await
    }
    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        let id = lease.task_id();
        self.write(&[id], Backend::renew(&self.inner, lease, extend_by))
            .await
    }
    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        let id = lease.task_id();
        self.write(&[id], Backend::complete(&self.inner, lease, response))
            .await
    }
    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        let id = lease.task_id();
        self.write(&[id], Backend::fail(&self.inner, lease, failure))
            .await
    }
    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        let id = lease.task_id();
        self.write(&[id], Backend::release(&self.inner, lease)).await
    }
    async fn release_unstarted(&self, lease: Lease) -> Result<Fenced<()>> {
        let id = lease.task_id();
        self.write(&[id], Backend::release_unstarted(&self.inner, lease))
            .await
    }
    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        Backend::cancel(&self.inner, id, reason).await
    }
    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        let id = lease.task_id();
        self.write(&[id], Backend::record_operation(&self.inner, lease, operation_id))
            .await
    }
    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        Backend::attempts(&self.inner, id).await
    }
    async fn begin_effect(&self, lease: &Lease, name: &str) -> Result<Fenced<EffectStart>> {
        Backend::begin_effect(&self.inner, lease, name).await
    }
    async fn finish_effect(
        &self,
        lease: &Lease,
        name: &str,
        outcome: EffectOutcome,
    ) -> Result<Fenced<Effect>> {
        Backend::finish_effect(&self.inner, lease, name, outcome).await
    }
    async fn effects(&self, id: TaskId) -> Result<Vec<Effect>> {
        Backend::effects(&self.inner, id).await
    }
    async fn reopen(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>> {
        Backend::reopen(&self.inner, id, request).await
    }
    async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
        Backend::due(&self.inner, limit).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        Backend::purge_expired(&self.inner, limit).await
    }
    async fn claim_next(&self, request: ClaimNext) -> Result<Vec<Lease>> {
        // A claim_next whose answer is lost strands its leases until they
        // expire: no task to name, so every task counts as touched.
        let all: Vec<TaskId> = Vec::new();
        match self.enter(&all, true).await {
            Fate::FailBefore => Err(Error::storage(Injected("before the write"))),
            Fate::LoseAnswer => {
                let leases = Backend::claim_next(&self.inner, request).await?;
                self.faulted
                    .lock()
                    .unwrap()
                    .extend(leases.iter().map(Lease::task_id));
                Err(Error::storage(Injected("answer lost")))
            }
            Fate::Apply => Backend::claim_next(&self.inner, request).await,
        }
    }
    async fn renew_many(&self, leases: &mut [Lease], extend_by: Duration) -> Result<Vec<Fenced<()>>> {
        let ids: Vec<TaskId> = leases.iter().map(Lease::task_id).collect();
        self.write(&ids, Backend::renew_many(&self.inner, leases, extend_by))
            .await
    }
    async fn complete_many(&self, completions: Vec<(Lease, Response)>) -> Result<Vec<Result<Fenced<Task>>>> {
        let ids: Vec<TaskId> = completions.iter().map(|(lease, _)| lease.task_id()).collect();
        self.write(&ids, Backend::complete_many(&self.inner, completions))
            .await
    }
}

const PLANTED_PANIC: &str = "a work function panics";
const LEASE: Duration = Duration::from_secs(10);
const TASKS: usize = 6;

/// What one randomized run did, summed over all runs to show the
/// exploration reached every path it claims to.
#[derive(Debug, Default)]
struct Seen {
    runs: usize,
    completed: u64,
    released: u64,
    failed_or_panicked: usize,
    faults: usize,
    left_to_expire: usize,
}

/// One randomized run (its random choices drawn from `seed`); panics
/// naming that number when a property fails.
async fn explore(seed: u64, seen: &mut Seen) {
    let clock = TokioClock {
        base: OffsetDateTime::UNIX_EPOCH + time::Duration::days(20_000),
        start: tokio::time::Instant::now(),
    };
    let memory = MemoryStore::with_clock(clock.clone());
    let seeded = Arc::new(Seeded {
        inner: memory.clone(),
        rng: Mutex::new(fastrand::Rng::with_seed(seed)),
        calls: AtomicU64::new(0),
        faulted: Mutex::new(HashSet::new()),
    });
    let mut ids = Vec::new();
    for i in 0..TASKS {
        let new = NewTask::new(
            RequestKey::new("s", "op", format!("k{i}")),
            InputHash::of([[i as u8]]),
        )
        .policy(RetryPolicy::default().max_attempts(3).jitter(0.0))
        .without_handoff();
        ids.push(
            TaskStore::submit(&memory, new)
                .await
                .expect("submit")
                .into_task()
                .id,
        );
    }
    let store: Arc<dyn TaskStore> = seeded.clone();
    let mut draw = fastrand::Rng::with_seed(seed ^ 0x5eed);
    let config = ConsumerConfig::new("c", LEASE)
        .concurrency(draw.usize(1..=3))
        .prefetch(draw.usize(0..=2))
        .renew_every(Duration::from_secs(draw.u64(2..=6)))
        .commit(draw.usize(1..=4), Duration::from_millis(draw.u64(1..=50)))
        .idle(Duration::from_millis(50), Duration::from_millis(400))
        .stop_after(
            Duration::from_secs(draw.u64(0..=15)),
            Duration::from_secs(draw.u64(1..=5)),
        )
        .lost_grace(Duration::from_secs(1));
    let consumer = StoreQueue::new(store)
        .consumer(config)
        .expect("a valid configuration")
        .with_clock(clock.clone());
    let stop = consumer.stop().clone();
    let stop_at = Duration::from_secs(draw.u64(0..=60));
    let second = draw.bool().then(|| Duration::from_secs(draw.u64(0..=10)));
    tokio::spawn(async move {
        tokio::time::sleep(stop_at).await;
        stop.request();
        if let Some(after) = second {
            tokio::time::sleep(after).await;
            stop.request();
        }
    });
    // The work: a drawn duration (sometimes past the lease), then a drawn outcome.
    let ran: Arc<Mutex<HashMap<(TaskId, u64), ()>>> = Arc::default();
    let ran_in_work = Arc::clone(&ran);
    let stopped = consumer
        .run(move |ctx| {
            let (task, version) = (ctx.task().id, ctx.lease().version());
            ran_in_work.lock().unwrap().insert((task, version), ());
            let mut rng = fastrand::Rng::with_seed(seed ^ task.as_uuid().as_u128() as u64 ^ version);
            let duration = Duration::from_millis(rng.u64(0..15_000));
            let outcome = rng.u32(0..100);
            async move {
                tokio::time::sleep(duration).await;
                match outcome {
                    0..5 => std::panic::panic_any(PLANTED_PANIC),
                    5..20 => Err(Failure::retryable("provider busy")),
                    _ => Ok(Response::from(format!("v{version}"))),
                }
            }
        })
        .await
        .expect("the consumer starts");
    let calls_at_return = seeded.calls.load(Ordering::SeqCst);

    // No lease is held after the consumer returns: nothing of it calls the
    // store again, and every lease it had runs out.
    tokio::time::sleep(LEASE * 3).await;
    assert_eq!(
        seeded.calls.load(Ordering::SeqCst),
        calls_at_return,
        "seed {seed}: the consumer called the store after it returned"
    );
    let now = clock.now();
    let mut completed = 0;
    for id in &ids {
        let task = TaskStore::get(&memory, *id).await.unwrap().unwrap();
        assert!(
            !(task.status == Status::Running && task.lease_until.is_some_and(|until| until > now)),
            "seed {seed}: task {id} still leased {:?} after the consumer returned",
            task.lease_until
        );
        if task.status == Status::Completed {
            completed += 1;
            let saved = task.response.as_ref().and_then(|r| r.as_str().map(str::to_owned));
            let by = saved
                .as_deref()
                .and_then(|s| s.strip_prefix('v'))
                .and_then(|v| v.parse::<u64>().ok());
            assert!(
                by.is_some_and(|v| ran.lock().unwrap().contains_key(&(*id, v))),
                "seed {seed}: task {id} saved {saved:?}, a response no run of it produced"
            );
        }
        // Every fetched task was run, released, or left to expire only
        // because a store fault touched it.
        let faulted = seeded.faulted.lock().unwrap().contains(id);
        for attempt in TaskStore::attempts(&memory, *id).await.unwrap() {
            let version = u64::from(attempt.number);
            let was_run = ran.lock().unwrap().contains_key(&(*id, version));
            // Given back: after work began, or unstarted (a prefetched claim, refunded).
            let released = matches!(
                attempt.outcome,
                AttemptOutcome::Released | AttemptOutcome::ReturnedUnstarted
            );
            seen.failed_or_panicked += usize::from(matches!(attempt.outcome, AttemptOutcome::Failed(_)));
            seen.left_to_expire += usize::from(!was_run && !released);
            assert!(
                was_run || released || faulted,
                "seed {seed}: task {id}'s attempt {version} was fetched, never run, never released ({:?})",
                attempt.outcome
            );
        }
    }
    seen.runs += ran.lock().unwrap().len();
    seen.completed += stopped.completed;
    seen.released += stopped.released;
    seen.faults += seeded.faulted.lock().unwrap().len();
    // No completion is reported before it is durable.
    assert!(
        stopped.completed <= completed,
        "seed {seed}: {} completions reported, {completed} saved",
        stopped.completed
    );
}

fn run_seed(seed: u64, seen: &mut Seen) {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
        .block_on(explore(seed, seen));
}

/// Runs 1,000 seeds (`TASKFENCE_CONSUMER_SEEDS` for more), each one
/// interleaving, and checks after each: no lease held after the consumer
/// returns, no completion reported before it is durable, every fetched
/// task run, released or left to expire by a store fault.
#[test]
fn the_consumer_under_seeded_schedules() {
    let seeds: u64 = std::env::var("TASKFENCE_CONSUMER_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    // The work functions' planted panics are expected: keep them out of the output.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<&str>() != Some(&PLANTED_PANIC) {
            report(info);
        }
    }));
    let mut seen = Seen::default();
    for seed in 0..seeds {
        run_seed(seed, &mut seen);
    }
    println!("{seeds} seeds: {seen:?}");
    assert!(
        seen.completed > 0
            && seen.released > 0
            && seen.failed_or_panicked > 0
            && seen.faults > 0
            && seen.left_to_expire > 0,
        "no run reached one of the paths: {seen:?}"
    );
}
