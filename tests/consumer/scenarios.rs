//! What the consumer guarantees, each scenario on a fresh store of any
//! backend: one saved response per task, renewals and completions batched,
//! panics and retry delays within the budget, a bounded, graceful stop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use taskfence::intercept::{Intercept, Intercepted};
use taskfence::runtime::{
    AckReason, Consumer, ConsumerConfig, Delivery, Disposition, Source, Stop, Stopped, StoreQueue,
};
use taskfence::store::AttemptOutcome;
use taskfence::testing::task_in;
use taskfence::{
    ClaimNext, ClaimRequest, Failure, Fenced, Lease, Response, Result, RetryPolicy, Status, Task, TaskId,
    TaskStore,
};
use tokio::time::Instant;

use crate::common::eventually;

mod stop;
pub(crate) use stop::*;

const LEASE: Duration = Duration::from_secs(30);
/// How long a scenario waits for what must happen (a liveness bound, not a
/// speed requirement).
const WITHIN: Duration = Duration::from_secs(60);

fn config() -> ConsumerConfig {
    ConsumerConfig::new("consumer-1", LEASE).idle(Duration::from_millis(10), Duration::from_millis(100))
}

/// One fresh task without a handoff (the consumer claims it with `claim_next`).
async fn submit_one(store: &dyn TaskStore, key: &str) -> Task {
    store
        .submit(task_in("tenant-1", key).without_handoff())
        .await
        .unwrap()
        .into_task()
}

/// A fresh task per key, as [`submit_one`]; their ids.
async fn submit_all(store: &dyn TaskStore, keys: impl IntoIterator<Item = String>) -> Vec<TaskId> {
    let mut ids = Vec::new();
    for key in keys {
        ids.push(submit_one(store, &key).await.id);
    }
    ids
}

async fn task(store: &dyn TaskStore, id: TaskId) -> Task {
    store.get(id).await.unwrap().expect("the task exists")
}

/// A consumer on `queue_store` whose work never ends, once it runs the
/// task `id` (read on `store`): its stop and its run.
async fn working_forever(
    queue_store: Arc<dyn TaskStore>,
    store: &dyn TaskStore,
    id: TaskId,
    config: ConsumerConfig,
) -> (Stop, tokio::task::JoinHandle<Result<Stopped>>) {
    let consumer = StoreQueue::new(queue_store).consumer(config).unwrap();
    let stop = consumer.stop().clone();
    let running = tokio::spawn(consumer.run(|_ctx| async move {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(Response::from("never"))
    }));
    eventually(WITHIN, || async {
        (task(store, id).await.status == Status::Running).then_some(())
    })
    .await;
    (stop, running)
}

/// Runs `consumer` on work that counts its starts and takes `takes` to
/// return; returns once `n` have started, with the count.
async fn start_counted(
    consumer: Consumer<StoreQueue>,
    n: usize,
    takes: Duration,
) -> (tokio::task::JoinHandle<Result<Stopped>>, Arc<AtomicUsize>) {
    let started = Arc::new(AtomicUsize::new(0));
    let seen = started.clone();
    let running = tokio::spawn(consumer.run(move |_ctx| {
        let started = seen.clone();
        async move {
            started.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(takes).await;
            Ok(Response::from("slow work"))
        }
    }));
    eventually(WITHIN, || async {
        (started.load(Ordering::SeqCst) == n).then_some(())
    })
    .await;
    (running, started)
}

/// Waits until every task has `status`.
async fn all_reach(store: &dyn TaskStore, ids: &[TaskId], status: Status) {
    eventually(WITHIN, || async {
        for &id in ids {
            if task(store, id).await.status != status {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// Counts the batched calls the consumer makes (and the single ones it should not).
#[derive(Default)]
struct Calls {
    renew: AtomicUsize,
    renew_many: AtomicUsize,
    renew_many_largest: AtomicUsize,
    complete: AtomicUsize,
    complete_many: AtomicUsize,
    complete_many_items: AtomicUsize,
    complete_many_largest: AtomicUsize,
}

#[async_trait]
impl Intercept for Counting {
    async fn renew(
        &self,
        inner: &dyn TaskStore,
        lease: &mut Lease,
        extend_by: Duration,
    ) -> Result<Fenced<()>> {
        self.0.renew.fetch_add(1, Ordering::Relaxed);
        inner.renew(lease, extend_by).await
    }
    async fn renew_many(
        &self,
        inner: &dyn TaskStore,
        leases: &mut [Lease],
        extend_by: Duration,
    ) -> Result<Vec<Fenced<()>>> {
        self.0.renew_many.fetch_add(1, Ordering::Relaxed);
        self.0
            .renew_many_largest
            .fetch_max(leases.len(), Ordering::Relaxed);
        inner.renew_many(leases, extend_by).await
    }
    async fn complete(
        &self,
        inner: &dyn TaskStore,
        lease: Lease,
        response: Response,
    ) -> Result<Fenced<Task>> {
        self.0.complete.fetch_add(1, Ordering::Relaxed);
        inner.complete(lease, response).await
    }
    async fn complete_many(
        &self,
        inner: &dyn TaskStore,
        completions: Vec<(Lease, Response)>,
    ) -> Result<Vec<Result<Fenced<Task>>>> {
        self.0.complete_many.fetch_add(1, Ordering::Relaxed);
        self.0
            .complete_many_items
            .fetch_add(completions.len(), Ordering::Relaxed);
        self.0
            .complete_many_largest
            .fetch_max(completions.len(), Ordering::Relaxed);
        inner.complete_many(completions).await
    }
}

/// The interceptor that fills a [`Calls`].
struct Counting(Arc<Calls>);

fn counted(store: Arc<dyn TaskStore>) -> (Arc<dyn TaskStore>, Arc<Calls>) {
    let calls = Arc::new(Calls::default());
    (
        Arc::new(Intercepted::new(store, Counting(Arc::clone(&calls)))),
        calls,
    )
}

/// 120 tasks, 8 at a time: each completes once with its own reply, one
/// attempt each; the replies are saved in batches (one `complete_many` for
/// several tasks), never one by one.
pub(crate) async fn drains_a_queue_saving_one_response_each_in_group_commits(store: Arc<dyn TaskStore>) {
    let (observed, calls) = counted(store.clone());
    let ids = submit_all(&*store, (0..120).map(|i| format!("q-{i}"))).await;
    let consumer = StoreQueue::new(observed)
        .consumer(config().concurrency(8))
        .unwrap();
    let stop = consumer.stop().clone();
    let running = tokio::spawn(consumer.run(|ctx| async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(Response::from(format!("reply to {}", ctx.task().key.key)))
    }));
    all_reach(&*store, &ids, Status::Completed).await;
    stop.request();
    let stopped = running.await.unwrap().unwrap();

    for &id in &ids {
        let t = task(&*store, id).await;
        assert_eq!(
            t.response,
            Some(Response::from(format!("reply to {}", t.key.key)))
        );
        assert_eq!(t.attempts(), 1, "one attempt each");
    }
    assert_eq!(stopped.completed, 120);
    assert_eq!(
        calls.complete.load(Ordering::Relaxed),
        0,
        "no completion went alone"
    );
    assert_eq!(calls.complete_many_items.load(Ordering::Relaxed), 120);
    assert!(
        calls.complete_many_largest.load(Ordering::Relaxed) > 1,
        "completions of concurrent work share a write ({} writes for 120)",
        calls.complete_many.load(Ordering::Relaxed)
    );
}

/// Work that runs three times as long as its lease keeps it: every held
/// lease is renewed in one request, and each task completes on its first
/// attempt.
pub(crate) async fn held_leases_are_renewed_together_and_outlive_their_length(store: Arc<dyn TaskStore>) {
    let (observed, calls) = counted(store.clone());
    let ids = submit_all(&*store, (0..6).map(|i| format!("slow-{i}"))).await;
    let lease = Duration::from_secs(1);
    let config = ConsumerConfig::new("consumer-1", lease)
        .renew_every(Duration::from_millis(250))
        .concurrency(6)
        .idle(Duration::from_millis(10), Duration::from_millis(100));
    let consumer = StoreQueue::new(observed).consumer(config).unwrap();
    let stop = consumer.stop().clone();
    let running = tokio::spawn(consumer.run(|_ctx| async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        Ok(Response::from("slow reply"))
    }));
    all_reach(&*store, &ids, Status::Completed).await;
    stop.request();
    running.await.unwrap().unwrap();

    for &id in &ids {
        assert_eq!(task(&*store, id).await.attempts(), 1, "no lease lapsed");
    }
    assert_eq!(calls.renew.load(Ordering::Relaxed), 0, "no lease renewed alone");
    assert!(calls.renew_many.load(Ordering::Relaxed) >= 1);
    assert!(
        calls.renew_many_largest.load(Ordering::Relaxed) > 1,
        "the held leases share a renewal"
    );
}

/// A work function that panics is a retryable failure: recorded, counted
/// against the budget, and the task fails when the budget is spent; never
/// lost, never running forever.
pub(crate) async fn a_panicking_work_function_is_a_failure_within_the_budget(store: Arc<dyn TaskStore>) {
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .jitter(0.0)
        .initial_backoff(Duration::from_millis(100));
    let t = store
        .submit(task_in("tenant-1", "explodes").without_handoff().policy(policy))
        .await
        .unwrap()
        .into_task();
    let consumer = StoreQueue::new(store.clone()).consumer(config()).unwrap();
    let stop = consumer.stop().clone();
    let running = tokio::spawn(consumer.run(|_ctx| async move {
        if true {
            panic!("index out of bounds in the prompt builder");
        }
        Ok(Response::from("never"))
    }));
    all_reach(&*store, &[t.id], Status::Failed).await;
    stop.request();
    let stopped = running.await.unwrap().unwrap();

    let failed = task(&*store, t.id).await;
    assert_eq!(failed.attempts(), 2, "both attempts of the budget were used");
    let attempts = store.attempts(t.id).await.unwrap();
    assert!(
        attempts
            .iter()
            .all(|a| a.outcome == AttemptOutcome::Failed(taskfence::policy::FailureKind::Retryable))
    );
    assert!(
        attempts[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("panicked") && e.contains("prompt builder")),
        "{attempts:?}"
    );
    assert_eq!(stopped.failed, 2);
}

/// A work closure that panics when called, before it returns its future, is
/// the same retryable failure: recorded within the budget, its lease let go
/// (not renewed until the consumer stops), the task failing when the budget
/// is spent.
pub(crate) async fn a_work_closure_that_panics_before_its_future_is_a_failure_within_the_budget(
    store: Arc<dyn TaskStore>,
) {
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .jitter(0.0)
        .initial_backoff(Duration::from_millis(100));
    let t = store
        .submit(
            task_in("tenant-1", "explodes-early")
                .without_handoff()
                .policy(policy),
        )
        .await
        .unwrap()
        .into_task();
    let consumer = StoreQueue::new(store.clone()).consumer(config()).unwrap();
    let stop = consumer.stop().clone();
    let running = tokio::spawn(consumer.run(
        |_ctx| -> std::future::Ready<std::result::Result<Response, Failure>> {
            panic!("the prompt template is missing")
        },
    ));
    all_reach(&*store, &[t.id], Status::Failed).await;
    stop.request();
    let stopped = running.await.unwrap().unwrap();

    let failed = task(&*store, t.id).await;
    assert_eq!(failed.attempts(), 2, "both attempts of the budget were used");
    let attempts = store.attempts(t.id).await.unwrap();
    assert!(
        attempts.iter().all(|a| a.outcome
            == AttemptOutcome::Failed(taskfence::policy::FailureKind::Retryable)
            && a.error
                .as_deref()
                .is_some_and(|e| e.contains("panicked") && e.contains("template"))),
        "{attempts:?}"
    );
    assert_eq!(stopped.failed, 2);
}

/// A renewal that takes longer than the renewal period, but answers before
/// the leases it renews run out, still keeps them: the work outlives its
/// lease several times over on one attempt.
pub(crate) async fn a_renewal_slower_than_its_period_still_keeps_the_lease(store: Arc<dyn TaskStore>) {
    let slow = Arc::new(Intercepted::new(
        store.clone(),
        SlowRenewals(Duration::from_millis(600)),
    ));
    let ids = submit_all(&*store, (0..3).map(|i| format!("slow-renewal-{i}"))).await;
    // Tasks held ready on a lease longer than a slow round, too.
    let config = ConsumerConfig::new("consumer-1", Duration::from_secs(2))
        .renew_every(Duration::from_millis(300))
        .ready_lease(Duration::from_millis(1500))
        .concurrency(3)
        .idle(Duration::from_millis(10), Duration::from_millis(100));
    let consumer = StoreQueue::new(slow).consumer(config).unwrap();
    let stop = consumer.stop().clone();
    let lost = Arc::new(AtomicBool::new(false));
    let saw = lost.clone();
    let running = tokio::spawn(consumer.run(move |ctx| {
        let saw = saw.clone();
        async move {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(5)) => Ok(Response::from("slow reply")),
                _ = ctx.lease_lost() => {
                    saw.store(true, Ordering::SeqCst);
                    Err(Failure::retryable("lease lost"))
                }
            }
        }
    }));
    all_reach(&*store, &ids, Status::Completed).await;
    stop.request();
    running.await.unwrap().unwrap();

    assert!(!lost.load(Ordering::SeqCst), "no lease was lost");
    for &id in &ids {
        assert_eq!(task(&*store, id).await.attempts(), 1, "no lease lapsed");
    }
}

/// Renewals that take `.0` to reach the store.
struct SlowRenewals(Duration);

#[async_trait]
impl Intercept for SlowRenewals {
    async fn renew_many(
        &self,
        inner: &dyn TaskStore,
        leases: &mut [Lease],
        extend_by: Duration,
    ) -> Result<Vec<Fenced<()>>> {
        tokio::time::sleep(self.0).await;
        inner.renew_many(leases, extend_by).await
    }
}

/// A work function's `Retry-After` replaces the policy's backoff (here a
/// minute): the second attempt comes after the requested 200 ms.
pub(crate) async fn a_requested_retry_delay_replaces_the_backoff(store: Arc<dyn TaskStore>) {
    let policy = RetryPolicy::default()
        .jitter(0.0)
        .initial_backoff(Duration::from_secs(60));
    let t = store
        .submit(
            task_in("tenant-1", "rate-limited")
                .without_handoff()
                .policy(policy),
        )
        .await
        .unwrap()
        .into_task();
    let consumer = StoreQueue::new(store.clone()).consumer(config()).unwrap();
    let stop = consumer.stop().clone();
    let running = tokio::spawn(consumer.run(|ctx| async move {
        if ctx.lease().attempt() == 1 {
            return Err(Failure::retryable("429").retry_after(Duration::from_millis(200)));
        }
        Ok(Response::from("after the wait"))
    }));
    all_reach(&*store, &[t.id], Status::Completed).await;
    stop.request();
    running.await.unwrap().unwrap();
    let attempts = store.attempts(t.id).await.unwrap();
    assert_eq!(attempts.len(), 2);
    let waited = attempts[1].started_at - attempts[0].finished_at.unwrap();
    assert!(
        waited >= time::Duration::milliseconds(200) && waited < time::Duration::seconds(30),
        "the second attempt started {waited} after the first failed"
    );
}

/// Cancelling a task while its work runs: the next renewal is refused, the
/// work function is told (`lease_lost`); one that ignores it is dropped
/// after the lost grace, and nothing is saved.
pub(crate) async fn a_lost_lease_stops_the_work_and_saves_nothing(store: Arc<dyn TaskStore>) {
    let t = submit_one(&*store, "cancelled-midway").await;
    let config = ConsumerConfig::new("consumer-1", Duration::from_secs(3))
        .renew_every(Duration::from_millis(100))
        .lost_grace(Duration::from_millis(200))
        .idle(Duration::from_millis(10), Duration::from_millis(100));
    let consumer = StoreQueue::new(store.clone()).consumer(config).unwrap();
    let stop = consumer.stop().clone();
    let noticed = Arc::new(AtomicBool::new(false));
    let told = noticed.clone();
    let running = tokio::spawn(consumer.run(move |ctx| {
        let told = told.clone();
        async move {
            ctx.lease_lost().await;
            told.store(true, Ordering::SeqCst);
            // Ignores the signal: dropped after the lost grace.
            std::future::pending::<std::result::Result<Response, Failure>>().await
        }
    }));
    eventually(WITHIN, || async {
        (task(&*store, t.id).await.status == Status::Running).then_some(())
    })
    .await;
    assert!(
        store
            .cancel(t.id, "the user deleted the chat")
            .await
            .unwrap()
            .is_accepted()
    );
    eventually(WITHIN, || async { noticed.load(Ordering::SeqCst).then_some(()) }).await;
    stop.request();
    let stopped = running.await.unwrap().unwrap();
    assert_eq!(stopped.lost, 1);
    let t = task(&*store, t.id).await;
    assert_eq!((t.status, t.response), (Status::Cancelled, None));
}

/// A broker's source: task ids as messages, each with a receipt; each
/// settlement recorded with the task's status at that moment.
struct Messages {
    store: Arc<dyn TaskStore>,
    ids: HashMap<u32, TaskId>,
    queue: Mutex<Vec<u32>>,
    settled: Settled,
}

/// Each receipt's settlement, with the task's status when it was settled.
type Settled = Arc<Mutex<HashMap<u32, (Disposition, Option<Status>)>>>;

#[async_trait]
impl Source for Messages {
    type Receipt = u32;

    async fn fetch(&self, max: usize, _claim: &ClaimRequest) -> Result<Vec<Delivery<u32>>> {
        let mut queue = self.queue.lock().unwrap();
        let n = queue.len().min(max);
        Ok(queue
            .drain(..n)
            .map(|receipt| Delivery::Task(self.ids[&receipt], receipt))
            .collect())
    }

    async fn settle(&self, receipt: u32, disposition: Disposition) -> Result<()> {
        let status = self.store.get(self.ids[&receipt]).await?.map(|t| t.status);
        self.settled
            .lock()
            .unwrap()
            .insert(receipt, (disposition, status));
        Ok(())
    }
}

/// Messages naming tasks: a fresh one is worked on, a completed one and a
/// second copy of a message are acknowledged without work, an unknown id is
/// acknowledged as not found; every message is settled, a completed one
/// only once its response is saved.
pub(crate) async fn broker_deliveries_are_claimed_together_and_settled_after_the_store(
    store: Arc<dyn TaskStore>,
) {
    let fresh = submit_one(&*store, "fresh").await;
    let done = submit_one(&*store, "done").await;
    let lease = match store
        .claim(done.id, ClaimRequest::new("earlier", LEASE))
        .await
        .unwrap()
    {
        taskfence::Claim::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    };
    assert!(
        store
            .complete(lease, Response::from("saved earlier"))
            .await
            .unwrap()
            .is_accepted()
    );
    let settled = Arc::new(Mutex::new(HashMap::new()));
    let source = Messages {
        store: store.clone(),
        ids: HashMap::from([(1, fresh.id), (2, done.id), (3, fresh.id), (4, TaskId::new())]),
        queue: Mutex::new(vec![1, 2, 3, 4]),
        settled: settled.clone(),
    };
    let consumer = taskfence::runtime::Consumer::new(store.clone(), source, config()).unwrap();
    let stop = consumer.stop().clone();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let running = tokio::spawn(consumer.run(move |_ctx| {
        let runs = counted.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(Response::from("worked"))
        }
    }));
    eventually(WITHIN, || async {
        (settled.lock().unwrap().len() == 4).then_some(())
    })
    .await;
    stop.request();
    running.await.unwrap().unwrap();

    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "one work call, for the fresh task only"
    );
    let settled = settled.lock().unwrap().clone();
    assert_eq!(
        settled[&1],
        (Disposition::Ack(AckReason::Completed), Some(Status::Completed)),
        "acknowledged once the response was durable"
    );
    assert_eq!(settled[&2].0, Disposition::Ack(AckReason::AlreadyCompleted));
    assert_eq!(
        settled[&3].0,
        Disposition::Ack(AckReason::AlreadyCompleted),
        "the copy in the same fetch"
    );
    assert_eq!(settled[&4].0, Disposition::Ack(AckReason::NotFound));
    assert_eq!(
        task(&*store, done.id).await.response,
        Some(Response::from("saved earlier"))
    );
}

/// An idle consumer (waiting up to a minute between empty fetches) starts
/// a task submitted through its queue's submitter without waiting out the
/// idle time.
pub(crate) async fn a_submission_wakes_an_idle_consumer(store: Arc<dyn TaskStore>) {
    let queue = StoreQueue::new(store.clone());
    let submit = queue.submitter();
    let config =
        ConsumerConfig::new("consumer-1", LEASE).idle(Duration::from_secs(60), Duration::from_secs(60));
    let consumer = queue.consumer(config).unwrap();
    let stop = consumer.stop().clone();
    let running = tokio::spawn(consumer.run(|_ctx| async move { Ok(Response::from("woken")) }));
    // Let the first (empty) fetch happen, so the consumer is in its idle wait.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = submit
        .submit(task_in("tenant-1", "wake-up").without_handoff())
        .await
        .unwrap()
        .into_task();
    tokio::time::timeout(
        Duration::from_secs(30),
        all_reach(&*store, &[t.id], Status::Completed),
    )
    .await
    .expect("woken well before the minute of idle wait");
    stop.request();
    running.await.unwrap().unwrap();
}

/// The store as the queue, its fetches counted.
struct CountedFetches {
    queue: StoreQueue,
    fetches: Arc<AtomicUsize>,
}

#[async_trait]
impl Source for CountedFetches {
    type Receipt = ();

    async fn fetch(&self, max: usize, claim: &ClaimRequest) -> Result<Vec<Delivery<()>>> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        self.queue.fetch(max, claim).await
    }

    fn wake(&self) -> Option<taskfence::runtime::Wake> {
        self.queue.wake()
    }

    fn short_fetch_drains(&self) -> bool {
        self.queue.short_fetch_drains()
    }
}

/// A fetch that comes back short from the store (it took every due task)
/// is followed by the idle wait, not at once by a fetch that finds
/// nothing: one task on an otherwise empty queue costs one fetch until
/// `idle_min` has passed. A stop ends that wait at once.
pub(crate) async fn a_fetch_that_drains_the_store_waits_before_the_next(store: Arc<dyn TaskStore>) {
    let id = submit_one(&*store, "only").await.id;
    let fetches = Arc::new(AtomicUsize::new(0));
    let source = CountedFetches {
        queue: StoreQueue::new(store.clone()),
        fetches: fetches.clone(),
    };
    let idle = Duration::from_secs(60);
    let config = ConsumerConfig::new("consumer-1", LEASE).idle(idle, idle);
    let consumer = Consumer::new(store.clone(), source, config).unwrap();
    let stop = consumer.stop().clone();
    let began = Instant::now();
    let running = tokio::spawn(consumer.run(|_ctx| async { Ok(Response::from("done")) }));
    all_reach(&*store, &[id], Status::Completed).await;
    // Long enough for a fetch at once to have come and gone.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(began.elapsed() < idle, "the idle wait outlasts the test's steps");
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        1,
        "the fetch drained the store: the next one waits for idle_min"
    );
    stop.request();
    let stopped = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the stop ends the idle wait after a short fetch")
        .unwrap()
        .unwrap();
    assert_eq!((stopped.completed, fetches.load(Ordering::SeqCst)), (1, 1));
}

/// A consumer dropped without a stop (its task aborted, its runtime shut
/// down) takes its renewals with it: the leases it held lapse and another
/// consumer takes the work over, rather than a process-long renewal loop
/// keeping tasks nobody works on.
pub(crate) async fn a_dropped_consumer_stops_renewing_its_leases(store: Arc<dyn TaskStore>) {
    let ids = submit_all(&*store, (0..3).map(|i| format!("dropped-{i}"))).await;
    let lease = Duration::from_millis(600);
    let dropped = ConsumerConfig::new("consumer-dropped", lease)
        .renew_every(Duration::from_millis(150))
        .concurrency(3)
        .idle(Duration::from_millis(10), Duration::from_millis(100));
    let consumer = StoreQueue::new(store.clone()).consumer(dropped).unwrap();
    let (running, _) = start_counted(consumer, 3, Duration::from_secs(3600)).await;
    // Renewals run while it lives: the leases outlast their length.
    tokio::time::sleep(lease * 2).await;
    for &id in &ids {
        let t = task(&*store, id).await;
        assert_eq!(
            (t.status, t.attempts()),
            (Status::Running, 1),
            "renewed while alive"
        );
    }
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());

    // Gone: the leases lapse and another consumer takes every task over.
    let next = StoreQueue::new(store.clone()).consumer(config()).unwrap();
    let stop = next.stop().clone();
    let taking_over = tokio::spawn(next.run(|_ctx| async { Ok(Response::from("taken over")) }));
    all_reach(&*store, &ids, Status::Completed).await;
    stop.request();
    taking_over.await.unwrap().unwrap();
    for &id in &ids {
        let attempts = store.attempts(id).await.unwrap();
        let outcomes: Vec<_> = attempts.iter().map(|a| a.outcome).collect();
        assert_eq!(outcomes, [AttemptOutcome::Expired, AttemptOutcome::Completed]);
    }
}
