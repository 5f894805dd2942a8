//! Batching against moto's SQS and PostgreSQL, in process: the dispatcher
//! publishes ten handoffs per `SendMessageBatch`, and the worker claims each
//! receive in one `claim_many` (counted through an `Intercept`), with one saved
//! response per task as before. A second copy of a task in one receive is
//! acknowledged without a claim, and a message that is no task id is deleted.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sqs_worker::sim::{SimulatedConfig, SimulatedLlm, local_sqs_client};
use sqs_worker::{Dispatcher, Provider, SqsQueue, SqsWorker, Stats, WorkerConfig, work};
use taskfence::intercept::{Intercept, Intercepted};
use taskfence::runtime::{Stop, Stopped};
use taskfence::store::AttemptOutcome;
use taskfence::testing::{Fixture, PgFixture};
use taskfence::wire::Stamp;
use taskfence::{Claim, ClaimRequest, InputHash, NewTask, RequestKey, Result, Status, TaskId, TaskStore};
use taskfence_test_support::{eventually_every, fixture};

/// Counts the claims that reach the store: single ones, and batches with their ids.
#[derive(Debug, Default)]
struct CountClaims {
    single: AtomicU64,
    batches: Mutex<Vec<Vec<TaskId>>>,
}

#[async_trait]
impl Intercept for CountClaims {
    async fn claim(&self, inner: &dyn TaskStore, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        self.single.fetch_add(1, Ordering::Relaxed);
        inner.claim(id, request).await
    }
    async fn claim_many(
        &self,
        inner: &dyn TaskStore,
        ids: &[TaskId],
        request: ClaimRequest,
    ) -> Result<Vec<Claim>> {
        self.batches.lock().unwrap().push(ids.to_vec());
        inner.claim_many(ids, request).await
    }
}

async fn submit(fixture: &PgFixture, n: usize) -> Vec<TaskId> {
    let run = TaskId::new();
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let key = RequestKey::new("workspace-1", "chat.reply", format!("{run}-{i}"));
        let task =
            NewTask::new(key, InputHash::of([format!("message-{i}")])).payload(format!("question #{i}"));
        ids.push(fixture.store().submit(task).await.unwrap().into_task().id);
    }
    ids
}

/// One in-process worker on `queue`, claiming through `CountClaims`.
struct Running {
    claims: Arc<Intercepted<dyn TaskStore, CountClaims>>,
    stats: Arc<Stats>,
    stop: Stop,
    consumer: tokio::task::JoinHandle<Result<Stopped>>,
}

fn start_worker(fixture: &PgFixture, queue: &SqsQueue, lease: Duration) -> Running {
    let claims = Arc::new(Intercepted::new(fixture.store(), CountClaims::default()));
    let store: Arc<dyn TaskStore> = claims.clone();
    let provider = SimulatedLlm::new(SimulatedConfig {
        min_latency: Duration::from_millis(200),
        max_latency: Duration::from_millis(600),
        ..SimulatedConfig::default()
    });
    let stats = Arc::new(Stats::default());
    let settings = WorkerConfig {
        concurrency: 10,
        poll_wait: Duration::from_secs(1),
        visibility_slack: Duration::from_secs(1),
        shutdown_grace: Duration::from_secs(10),
        ..WorkerConfig::default()
    };
    let worker = SqsWorker::sharing_stats(
        queue.clone(),
        store,
        "batching-1",
        lease,
        &settings,
        Arc::clone(&stats),
    )
    .unwrap();
    let provider: Arc<dyn Provider> = Arc::new(provider);
    let stop = worker.stop().clone();
    let consumer = tokio::spawn(worker.run(move |ctx| work(ctx, Arc::clone(&provider))));
    Running {
        claims,
        stats,
        stop,
        consumer,
    }
}

impl Running {
    async fn stop(self) -> (Arc<Intercepted<dyn TaskStore, CountClaims>>, Arc<Stats>) {
        self.stop.request();
        self.consumer.await.unwrap().unwrap();
        (self.claims, self.stats)
    }
}

/// Waits until every task of `ids` is completed and the queue is empty.
async fn drained(fixture: &PgFixture, queue: &SqsQueue, ids: &[TaskId]) {
    eventually_every(Duration::from_secs(60), Duration::from_millis(200), || async {
        for &id in ids {
            if fixture.store().get(id).await.unwrap().unwrap().status != Status::Completed {
                return None;
            }
        }
        (queue.depth().await.unwrap().total() == 0).then_some(())
    })
    .await;
}

/// Exactly one saved response per task, and this run's worker saved each once.
async fn one_saved_response_each(fixture: &PgFixture, ids: &[TaskId], stats: &Stats) {
    let saved_by_task = stats.saved_by_task();
    for &id in ids {
        let task = fixture.store().get(id).await.unwrap().unwrap();
        assert_eq!(task.status, Status::Completed, "{id}");
        assert!(task.response.is_some(), "{id}");
        let attempts = fixture.store().attempts(id).await.unwrap();
        let saved = attempts
            .iter()
            .filter(|a| a.outcome == AttemptOutcome::Completed)
            .count();
        assert_eq!(saved, 1, "{id}: exactly one saved response: {attempts:?}");
        assert_eq!(saved_by_task.get(&id), Some(&1), "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_is_claimed_in_one_round_trip_and_handoffs_go_ten_per_request() {
    let moto = support::Moto::start_or_env();
    let client = local_sqs_client(&moto.endpoint).await;
    let name = format!("taskfence-batching-{}", uuid::Uuid::now_v7());
    // Longer than the whole run: a message comes back only if a delete is lost.
    let queue = SqsQueue::create(client, &name, Duration::from_secs(60))
        .await
        .expect("create the queue");
    let fixture = fixture().await;
    let tasks = 30;
    let ids = submit(&fixture, tasks).await;

    // The outbox in one round: 30 handoffs, three SendMessageBatch requests.
    let dispatcher = Dispatcher::new(fixture.pg_store().clone(), queue.clone(), 100);
    assert_eq!(dispatcher.round().await.unwrap().len(), tasks);
    assert_eq!(dispatcher.requests(), 3, "ten messages per SendMessageBatch");
    assert_eq!(dispatcher.sent(), tasks as u64);
    assert_eq!(queue.depth().await.unwrap().visible, tasks as u64);

    let running = start_worker(&fixture, &queue, Duration::from_secs(10));
    drained(&fixture, &queue, &ids).await;
    let (claims, stats) = running.stop().await;

    one_saved_response_each(&fixture, &ids, &stats).await;
    let batches = claims.interceptor().batches.lock().unwrap().clone();
    let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
    let deliveries = stats.deliveries.load(Ordering::Relaxed);
    println!(
        "tasks {tasks}: SendMessageBatch requests {}, deliveries {deliveries}, claim_many calls {} (sizes {sizes:?}), single claims {}",
        dispatcher.requests(),
        batches.len(),
        claims.interceptor().single.load(Ordering::Relaxed),
    );
    // Every delivery was claimed through a batch, none on its own...
    assert_eq!(claims.interceptor().single.load(Ordering::Relaxed), 0);
    assert_eq!(sizes.iter().sum::<usize>() as u64, deliveries);
    // ...and the batches carried several deliveries: fewer round trips than messages.
    assert!(sizes.iter().any(|&n| n > 1), "{sizes:?}");
    assert!(batches.len() < tasks, "{sizes:?}");
    assert_eq!(stats.store_errors.load(Ordering::Relaxed), 0);
    assert_eq!(stats.dispositions().get("ack.completed"), Some(&(tasks as u64)));

    queue.delete_queue().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_copy_in_one_receive_and_a_malformed_message_are_handled_on_their_own() {
    let moto = support::Moto::start_or_env();
    let client = local_sqs_client(&moto.endpoint).await;
    let name = format!("taskfence-batching-dup-{}", uuid::Uuid::now_v7());
    let queue = SqsQueue::create(client.clone(), &name, Duration::from_secs(60))
        .await
        .expect("create the queue");
    let fixture = fixture().await;
    let ids = submit(&fixture, 3).await;
    // Task 0 twice, the others once, and a body that is no task id, all
    // waiting before the worker starts (so mostly in one receive).
    queue
        .publish_batch(&[0, 1, 0, 2].map(|i| Stamp::new(ids[i], 0)))
        .await
        .unwrap();
    client
        .send_message()
        .queue_url(queue.url())
        .message_body("not a task id")
        .send()
        .await
        .unwrap();

    let running = start_worker(&fixture, &queue, Duration::from_secs(3));
    drained(&fixture, &queue, &ids).await;
    let (claims, stats) = running.stop().await;

    one_saved_response_each(&fixture, &ids, &stats).await;
    let batches = claims.interceptor().batches.lock().unwrap().clone();
    println!(
        "deliveries {}, claim batches {:?}, dispositions {:?}",
        stats.deliveries.load(Ordering::Relaxed),
        batches.iter().map(Vec::len).collect::<Vec<_>>(),
        stats.dispositions()
    );
    // No batch carried a task twice (the store would refuse the batch: a store error).
    assert_eq!(stats.store_errors.load(Ordering::Relaxed), 0);
    for batch in &batches {
        let mut distinct = batch.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), batch.len(), "{batch:?}");
    }
    // Every valid delivery was claimed once, or acknowledged unclaimed as the
    // second copy of a task in its receive; the malformed one was deleted unclaimed.
    assert_eq!(stats.malformed.load(Ordering::Relaxed), 1);
    let claimed = batches.iter().map(Vec::len).sum::<usize>() as u64
        + claims.interceptor().single.load(Ordering::Relaxed);
    let copies = stats.copies.load(Ordering::Relaxed);
    assert_eq!(claimed + copies + 1, stats.deliveries.load(Ordering::Relaxed));
    // Task 0 was worked on once: its second copy found it busy or done.
    let dispositions: HashMap<_, _> = stats.dispositions().into_iter().collect();
    assert_eq!(dispositions.get("ack.completed"), Some(&3));
    assert!(
        dispositions.get("retry.busy").copied().unwrap_or(0)
            + dispositions.get("ack.already_completed").copied().unwrap_or(0)
            >= 1,
        "{dispositions:?}"
    );

    queue.delete_queue().await.unwrap();
}
