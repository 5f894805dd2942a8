//! The end-to-end scenario of `tests/e2e.rs`, at 100 tasks, on the all-AWS
//! stack: tasks in DynamoDB (`DynamoStore`), handoffs in taskfence's outbox
//! in the same table (written by `submit` in the task's transaction,
//! published by `DynamoStore::dispatch_batches`), SQS for the messages (moto
//! serves both, in `scripts/test` from two processes).
//! Then the table is read back: one task item per submitted task, one
//! attempt item per claim, no handoff left unpublished.

mod support;

use std::sync::Arc;

use sqs_worker::sim::scenario::StoreChoice;
use taskfence::TaskStore;
use taskfence::clock::SystemClock;
use taskfence::testing::DynamoFixture;
use taskfence_test_support::dynamo;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_dynamodb_every_task_ends_with_one_saved_response_or_a_terminal_failure() {
    let moto = support::Moto::start_or_env();
    let endpoint = std::env::var("TASKFENCE_DYNAMODB_ENDPOINT").unwrap_or_else(|_| moto.endpoint.clone());
    // A fresh table (deleted with the fixture). The fixture's own store runs
    // on a manual clock; the workers need real time: a store of their own on
    // the system clock, on the same table.
    let fixture = DynamoFixture::new(dynamo::client_at(&endpoint)).await;
    let store = taskfence::DynamoStore::builder(dynamo::client_at(&endpoint), fixture.table())
        .clock(SystemClock)
        .build()
        .expect("a valid table name");
    let shared: Arc<dyn TaskStore> = Arc::new(store.clone());
    // Half the PostgreSQL run's tasks, and 3 in flight per worker where it
    // has 10: moto copies the whole table in each transaction, one request
    // at a time, so its cost grows with the table (a claim or a save at 1,000
    // items takes about 0.1 s of its one thread, more on a slower machine).
    // With 40 tasks in flight the renewals alone queue up behind each other
    // until leases run out; with 12 they keep up. The faults are drawn per
    // provider call, so the run meets as many of each.
    let report = support::e2e::run_and_check(
        &moto,
        "taskfence-e2e-dynamodb",
        100,
        3,
        StoreChoice::Dynamo(store.clone()),
        shared,
    )
    .await;

    // From the table itself: nothing lost, nothing extra.
    let tasks = report.task_ids.len() as u64;
    assert_eq!(
        fixture.count("T").await,
        tasks,
        "one task item per submitted task"
    );
    assert_eq!(
        fixture.count("A#").await,
        report.attempts,
        "one attempt item per claim"
    );
    assert_eq!(fixture.count("K").await, tasks, "one dedup record per task");
    assert!(
        sqs_worker::sim::unpublished(&store, &report.task_ids)
            .await
            .expect("read the stories")
            == 0,
        "every handoff was published"
    );
}
