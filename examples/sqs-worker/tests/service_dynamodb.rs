//! The worker service binary on the all-AWS stack: `--store dynamodb
//! --dispatch true`, configured by the standard AWS variables
//! (`AWS_ENDPOINT_URL_DYNAMODB` for moto's DynamoDB), no PostgreSQL. The test
//! submits tasks (each with its handoff, in taskfence's outbox), the service
//! publishes and works them, and on SIGTERM exits 0; the table then holds one
//! saved response per task and no unpublished handoff.

mod support;

use std::time::Duration;

use sqs_worker::SqsQueue;
use sqs_worker::sim::local_sqs_client;
use sqs_worker::sim::unpublished;
use taskfence::clock::SystemClock;
use taskfence::store::AttemptOutcome;
use taskfence::testing::DynamoFixture;
use taskfence::{InputHash, NewTask, RequestKey, Status, TaskId, TaskStore};
use taskfence_test_support::dynamo as test_dynamo;
use taskfence_test_support::eventually_every;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_runs_on_dynamodb_without_postgres() {
    let moto = support::Moto::start_or_env();
    let endpoint = std::env::var("TASKFENCE_DYNAMODB_ENDPOINT").unwrap_or_else(|_| moto.endpoint.clone());
    let fixture = DynamoFixture::new(test_dynamo::client_at(&endpoint)).await;
    let store = taskfence::DynamoStore::builder(test_dynamo::client_at(&endpoint), fixture.table())
        .clock(SystemClock)
        .build()
        .unwrap();
    // The start-up check the service makes passes on the fixture's table.
    taskfence_sqs::store::check_table(store.client(), fixture.table())
        .await
        .unwrap();
    let client = local_sqs_client(&moto.endpoint).await;
    let queue = SqsQueue::create(
        client,
        &format!("taskfence-service-dynamodb-{}", uuid::Uuid::now_v7()),
        Duration::from_secs(10),
    )
    .await
    .unwrap();

    let run = TaskId::new();
    let mut ids = Vec::new();
    for i in 0..8 {
        let key = RequestKey::new("workspace-1", "chat.reply", format!("{run}-{i}"));
        let new =
            NewTask::new(key, InputHash::of([format!("message-{i}")])).payload(format!("question #{i}"));
        ids.push(store.submit(new.clone()).await.unwrap().into_task().id);
        // A browser retry: the same task, no second handoff.
        assert_eq!(store.submit(new).await.unwrap().into_task().id, ids[i]);
    }
    assert_eq!(
        unpublished(&store, &ids).await.unwrap(),
        ids.len(),
        "one handoff per task"
    );

    let mut service = support::start_service_dynamodb(
        "dyn-w0",
        &moto,
        &endpoint,
        fixture.table(),
        queue.url(),
        &[
            "--provider",
            "simulated",
            "--sim-min-latency",
            "100ms",
            "--sim-max-latency",
            "400ms",
            "--dispatch",
            "true",
            "--dispatch-idle",
            "200ms",
            "--concurrency",
            "4",
            "--lease",
            "6s",
            "--poll-wait",
            "1s",
            "--visibility-slack",
            "1s",
            "--shutdown-grace",
            "5s",
        ],
    );
    eventually_every(Duration::from_secs(90), Duration::from_millis(300), || {
        assert!(service.try_exit().is_none(), "the service exited early");
        let (store, queue, ids) = (&store, &queue, &ids);
        async move {
            for &id in ids {
                if store.get(id).await.unwrap().unwrap().status != Status::Completed {
                    return None;
                }
            }
            let empty =
                queue.depth().await.unwrap().total() == 0 && unpublished(store, ids).await.unwrap() == 0;
            empty.then_some(())
        }
    })
    .await;
    service.signal("TERM");
    let status = eventually_every(Duration::from_secs(20), Duration::from_millis(100), || {
        let exited = service.try_exit();
        async move { exited }
    })
    .await;
    assert!(status.success(), "exit status {status}");

    for &id in &ids {
        let task = store.get(id).await.unwrap().unwrap();
        assert!(task.response.is_some(), "{id}");
        let attempts = store.attempts(id).await.unwrap();
        let saved = attempts
            .iter()
            .filter(|a| a.outcome == AttemptOutcome::Completed)
            .count();
        assert_eq!(saved, 1, "{id}: one saved response: {attempts:?}");
    }
    assert_eq!(fixture.count("T").await, ids.len() as u64);
    println!("dynamodb service: {} tasks completed, exit {status}", ids.len());
    queue.delete_queue().await.unwrap();
}
