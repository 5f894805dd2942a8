//! The crate against moto's SQS, with PostgreSQL and DynamoDB stores: the
//! outbox published ten per request with the stamp in the attributes, one
//! saved response per task, a message kept until the store's durable
//! answer, malformed messages and bad batches, and a stop bounded against
//! an endpoint that never answers.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use taskfence::clock::SystemClock;
use taskfence::intercept::{Intercept, Intercepted};
use taskfence::testing::{DynamoFixture, Fixture, PgFixture};
use taskfence::wire::Stamp;
use taskfence::{
    Fenced, InputHash, Lease, MemoryStore, NewTask, RequestKey, Response, Status, Task, TaskId, TaskStore,
};
use taskfence_sqs::{Dispatcher, Error, SqsQueue, SqsWorker, Stats, WorkerConfig};
use taskfence_test_support::{dynamo, eventually_every};

fn config() -> WorkerConfig {
    WorkerConfig {
        concurrency: 10,
        poll_wait: Duration::from_secs(1),
        visibility_slack: Duration::from_secs(1),
        shutdown_grace: Duration::from_secs(5),
        release_deadline: Duration::from_secs(2),
    }
}

async fn submit(store: &dyn TaskStore, n: usize) -> Vec<TaskId> {
    let run = TaskId::new();
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let key = RequestKey::new("tenant-1", "report", format!("{run}-{i}"));
        let task = NewTask::new(key, InputHash::of([format!("input-{i}")])).payload(format!("question #{i}"));
        ids.push(store.submit(task).await.unwrap().into_task().id);
    }
    ids
}

/// The answer the tests' work function gives: the payload, echoed.
async fn echo(ctx: taskfence::runtime::WorkContext) -> Result<Response, taskfence::Failure> {
    let payload = String::from_utf8_lossy(&ctx.task().payload).into_owned();
    Ok(Response::new(format!("answer to {payload}")))
}

/// A worker on `queue` running `echo`, and how to stop it.
struct Running {
    stats: Arc<Stats>,
    stop: taskfence::runtime::Stop,
    handle: tokio::task::JoinHandle<taskfence::Result<taskfence::runtime::Stopped>>,
}

fn start(queue: &SqsQueue, store: Arc<dyn TaskStore>, lease: Duration) -> Running {
    let worker = SqsWorker::new(queue.clone(), store, "worker-1", lease, &config()).unwrap();
    let (stats, stop) = (Arc::clone(worker.stats()), worker.stop().clone());
    let handle = tokio::spawn(worker.run(echo));
    Running { stats, stop, handle }
}

impl Running {
    async fn stop(self) -> Arc<Stats> {
        self.stop.request();
        self.handle.await.unwrap().unwrap();
        self.stats
    }
}

/// Waits until every task of `ids` is completed and the queue is empty.
async fn drained(store: &dyn TaskStore, queue: &SqsQueue, ids: &[TaskId]) {
    eventually_every(Duration::from_secs(60), Duration::from_millis(200), || async {
        for &id in ids {
            if store.get(id).await.unwrap().unwrap().status != Status::Completed {
                return None;
            }
        }
        (queue.depth().await.unwrap().total() == 0).then_some(())
    })
    .await;
}

/// Each task saved once, by this worker, with its own answer.
async fn one_saved_response_each(store: &dyn TaskStore, ids: &[TaskId], stats: &Stats) {
    let saved = stats.saved_by_task();
    for &id in ids {
        let task = store.get(id).await.unwrap().unwrap();
        let expected = format!("answer to {}", String::from_utf8_lossy(&task.payload));
        assert_eq!(task.response.unwrap().as_bytes(), expected.as_bytes());
        assert_eq!(saved.get(&id), Some(&1), "task {id} saved once");
    }
    assert_eq!(saved.len(), ids.len());
}

/// The outbox goes out ten per request, each message stamped; the worker
/// saves one response per task and deletes every message.
async fn outbox_to_worker(queue: &SqsQueue, dispatcher: Dispatcher, store: Arc<dyn TaskStore>, n: usize) {
    let ids = submit(&*store, n).await;
    let published = dispatcher.round().await.unwrap();
    assert_eq!(published.len(), n);
    assert_eq!(
        dispatcher.requests() as usize,
        n.div_ceil(10),
        "ten per SendMessageBatch"
    );
    assert_eq!(dispatcher.sent() as usize, n);
    assert!(
        dispatcher.round().await.unwrap().is_empty(),
        "each handoff marked published"
    );

    // A message's attributes carry the stamp of a task never claimed (version 0).
    let peek = queue
        .client()
        .receive_message()
        .queue_url(queue.url())
        .message_attribute_names("All")
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    let message = &peek.messages()[0];
    let stamp = Stamp::from_headers(
        message
            .message_attributes()
            .unwrap()
            .iter()
            .map(|(name, value)| (name.as_str(), value.string_value().unwrap_or_default().as_bytes())),
    )
    .unwrap();
    assert_eq!(stamp.task_id.to_string(), message.body().unwrap());
    assert_eq!(stamp.version, 0);

    let running = start(queue, Arc::clone(&store), Duration::from_secs(5));
    drained(&*store, queue, &ids).await;
    let stats = running.stop().await;
    one_saved_response_each(&*store, &ids, &stats).await;
    assert_eq!(stats.dispositions().get("ack.completed").copied(), Some(n as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_the_outbox_reaches_the_worker_and_each_task_is_saved_once() {
    let moto = support::Moto::start_or_env();
    let queue = support::queue(&moto, "pg").await;
    let fixture = PgFixture::new().await;
    let dispatcher = Dispatcher::new(fixture.pg_store().clone(), queue.clone(), 100);
    outbox_to_worker(&queue, dispatcher, fixture.store(), 25).await;
    queue.delete_queue().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_dynamodb_the_outbox_reaches_the_worker_and_each_task_is_saved_once() {
    let moto = support::Moto::start_or_env();
    let queue = support::queue(&moto, "dynamo").await;
    let endpoint = std::env::var("TASKFENCE_DYNAMODB_ENDPOINT").unwrap_or_else(|_| moto.endpoint.clone());
    let fixture = DynamoFixture::new(dynamo::client_at(&endpoint)).await;
    // The workers need real time: a store on the system clock, on the fixture's table.
    let store = taskfence::DynamoStore::builder(dynamo::client_at(&endpoint), fixture.table())
        .clock(SystemClock)
        .build()
        .unwrap();
    let dispatcher = Dispatcher::new(store.clone(), queue.clone(), 100);
    outbox_to_worker(&queue, dispatcher, Arc::new(store), 12).await;
    queue.delete_queue().await.unwrap();
}

/// Fails the first `n` completions as a store that is down would.
struct FailCompletions(AtomicU32);

#[async_trait]
impl Intercept for FailCompletions {
    async fn complete(
        &self,
        inner: &dyn TaskStore,
        lease: Lease,
        response: Response,
    ) -> taskfence::Result<Fenced<Task>> {
        if self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(taskfence::Error::Storage("the store is down".into()));
        }
        inner.complete(lease, response).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_stays_until_the_store_saved_its_task() {
    let moto = support::Moto::start_or_env();
    let queue = support::queue(&moto, "store-down").await;
    let fixture = PgFixture::new().await;
    let ids = submit(&*fixture.store(), 1).await;
    Dispatcher::new(fixture.pg_store().clone(), queue.clone(), 10)
        .round()
        .await
        .unwrap();
    let failing = Arc::new(Intercepted::new(
        fixture.store(),
        FailCompletions(AtomicU32::new(1)),
    ));
    let running = start(&queue, failing.clone(), Duration::from_secs(3));
    drained(&*fixture.store(), &queue, &ids).await;
    let stats = running.stop().await;
    assert_eq!(
        failing.interceptor().0.load(Ordering::SeqCst),
        0,
        "the failure was injected"
    );
    assert!(
        stats.deliveries.load(Ordering::Relaxed) >= 2,
        "the message was not deleted when the save failed: it came back"
    );
    assert_eq!(stats.dispositions().get("leave.store_failed"), Some(&1));
    one_saved_response_each(&*fixture.store(), &ids, &stats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_are_deleted_and_bad_batches_send_nothing() {
    let moto = support::Moto::start_or_env();
    let queue = support::queue(&moto, "input").await;
    let stamps: Vec<Stamp> = (0..11).map(|_| Stamp::new(TaskId::new(), 0)).collect();
    assert!(matches!(
        queue.publish_batch(&stamps).await,
        Err(Error::BatchSize { len: 11, .. })
    ));
    assert!(matches!(
        queue.publish_batch(&[]).await,
        Err(Error::BatchSize { len: 0, .. })
    ));
    assert!(matches!(
        queue.delete_batch(&[]).await,
        Err(Error::BatchSize { len: 0, .. })
    ));
    assert_eq!(queue.depth().await.unwrap().total(), 0, "nothing was sent");

    queue
        .client()
        .send_message()
        .queue_url(queue.url())
        .message_body("not a task id")
        .send()
        .await
        .unwrap();
    let running = start(&queue, Arc::new(MemoryStore::new()), Duration::from_secs(5));
    let stats = Arc::clone(&running.stats);
    eventually_every(Duration::from_secs(30), Duration::from_millis(200), || async {
        (stats.malformed.load(Ordering::Relaxed) == 1 && queue.depth().await.unwrap().total() == 0)
            .then_some(())
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_returns_within_grace_and_release_deadline_when_sqs_never_answers() {
    // An endpoint that accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let queue = SqsQueue::new(support::client(&endpoint).await, format!("{endpoint}/123/silent"));
    let config = WorkerConfig {
        shutdown_grace: Duration::from_secs(1),
        release_deadline: Duration::from_secs(1),
        ..config()
    };
    let worker = SqsWorker::new(
        queue,
        Arc::new(MemoryStore::new()),
        "worker-1",
        Duration::from_secs(5),
        &config,
    )
    .unwrap();
    let stop = worker.stop().clone();
    let handle = tokio::spawn(worker.run(echo));
    tokio::time::sleep(Duration::from_millis(500)).await; // a receive is in flight
    let asked = Instant::now();
    stop.request();
    let stopped = tokio::time::timeout(config.stop_within() + Duration::from_secs(5), handle).await;
    assert!(stopped.is_ok(), "the worker did not stop");
    assert!(
        asked.elapsed() <= config.stop_within() + Duration::from_millis(500),
        "stopped after {:?}, past grace + release deadline",
        asked.elapsed()
    );
}
