//! A release at a stop says whether the store accepted it: a worker stopped
//! with no grace gives back the tasks it works on; the store accepts the
//! release of two and refuses the third, which an operator cancelled while
//! it ran. The refusal is counted (`Stats::releases_refused`) and logged.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sqs_worker::sim::{SimulatedConfig, SimulatedLlm, local_sqs_client};
use sqs_worker::{Provider, SqsQueue, SqsWorker, Stats, WorkerConfig, work};
use taskfence::testing::task_in;
use taskfence::wire::Stamp;
use taskfence::{MemoryStore, Status, TaskStore};
use taskfence_test_support::eventually_every;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_release_is_counted_and_an_accepted_one_is_not() {
    let moto = support::Moto::start_or_env();
    let client = local_sqs_client(&moto.endpoint).await;
    let name = format!("taskfence-released-{}", uuid::Uuid::now_v7());
    let queue = SqsQueue::create(client, &name, Duration::from_secs(60))
        .await
        .expect("create the queue");
    let store = Arc::new(MemoryStore::new());
    let mut tasks = Vec::new();
    for i in 0..3 {
        let new = task_in("user-1", &format!("req-{i}")).payload(format!("message {i}"));
        tasks.push(store.submit(new).await.expect("submit").into_task());
    }
    queue
        .publish_batch(&tasks.iter().map(|t| Stamp::new(t.id, 0)).collect::<Vec<_>>())
        .await
        .expect("publish");
    // The provider takes an hour: every task is still worked on at the stop.
    let provider = SimulatedLlm::new(SimulatedConfig {
        min_latency: Duration::from_secs(3600),
        max_latency: Duration::from_secs(3600),
        ..SimulatedConfig::default()
    });
    let stats = Arc::new(Stats::default());
    let settings = WorkerConfig {
        concurrency: 3,
        poll_wait: Duration::from_secs(1),
        shutdown_grace: Duration::ZERO,
        ..WorkerConfig::default()
    };
    let worker = SqsWorker::sharing_stats(
        queue.clone(),
        Arc::clone(&store) as Arc<dyn TaskStore>,
        "released-1",
        // Renewed after 20 s: nothing but the cancellation touches the leases.
        Duration::from_secs(60),
        &settings,
        Arc::clone(&stats),
    )
    .expect("worker");
    let provider: Arc<dyn Provider> = Arc::new(provider);
    let stop = worker.stop().clone();
    let running = tokio::spawn(worker.run(move |ctx| work(ctx, Arc::clone(&provider))));
    eventually_every(Duration::from_secs(60), Duration::from_millis(100), || async {
        for task in &tasks {
            if store.get(task.id).await.unwrap().unwrap().status != Status::Running {
                return None;
            }
        }
        Some(())
    })
    .await;

    // The operator cancels one while it runs: its release will be refused.
    let cancelled = tasks[0].id;
    assert!(
        store
            .cancel(cancelled, "no longer wanted")
            .await
            .expect("cancel")
            .is_accepted()
    );
    stop.request();
    let stopped = running.await.unwrap().expect("stopped");
    assert_eq!(stopped.released, 3, "{stopped:?}");
    assert_eq!(stats.dispositions().get("retry.released"), Some(&3));
    assert_eq!(stats.releases_refused.load(Ordering::Relaxed), 1);
    assert_eq!(
        store.get(cancelled).await.unwrap().unwrap().status,
        Status::Cancelled,
        "the refused release changed nothing"
    );
    for task in &tasks[1..] {
        assert_eq!(store.get(task.id).await.unwrap().unwrap().status, Status::Pending);
    }
    queue.delete_queue().await.unwrap();
}
