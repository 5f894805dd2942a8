//! The dispatch suite (the outbox and its dispatcher) against `DynamoStore`
//! on a real DynamoDB API (moto in `scripts/test`), and what only
//! DynamoDB's outbox shows: its items, and the writer's clock on each
//! handoff of a task's story.

use std::time::Duration;

use taskfence::clock::Clock;
use taskfence::inspect::Inspect;
use taskfence::store::ReopenRequest;
use taskfence::testing::{Fixture, acquire, fail_accepted, new_task};
use taskfence::{Failure, TaskStore};
use taskfence_test_support::dynamo;

taskfence::testing::dispatch_suite!(dynamo::fixture());

/// The story lists the handoffs, published or not, oldest first, each
/// written and published at the store clock's instant: the submission's,
/// then the reopening's and a redispatch's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_story_shows_when_each_handoff_was_written_and_published() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let submitted_at = f.clock().now();
    let task = store.submit(new_task("k")).await.unwrap().into_task();
    let story = store.story(task.id).await.unwrap().unwrap();
    assert_eq!(story.handoffs.len(), 1);
    assert_eq!(story.handoffs[0].created_at, submitted_at);
    assert!(story.handoffs[0].published_at.is_none());

    f.advance(Duration::from_secs(1)).await;
    let published_at = f.clock().now();
    // The first round that sees the handoff (the index lags the table a moment).
    let published = taskfence_test_support::eventually(Duration::from_secs(10), || async {
        let round = store
            .dispatch(10, |_| std::future::ready(Ok::<(), std::io::Error>(())))
            .await
            .unwrap();
        (!round.published.is_empty()).then_some(round.published)
    })
    .await;
    assert_eq!(published, [task.id]);
    let story = store.story(task.id).await.unwrap().unwrap();
    assert_eq!(story.handoffs[0].published_at, Some(published_at));

    let lease = acquire(store, task.id, "w").await;
    fail_accepted(store, lease, Failure::permanent("bad")).await;
    f.advance(Duration::from_secs(1)).await;
    let reopened_at = f.clock().now();
    let reopened = store.reopen(task.id, ReopenRequest::new("ops", "fixed")).await;
    assert!(reopened.unwrap().is_accepted());
    assert_eq!(store.redispatch(&[task.id]).await.unwrap(), 1);
    let story = store.story(task.id).await.unwrap().unwrap();
    let created: Vec<_> = story.handoffs.iter().map(|h| h.created_at).collect();
    assert_eq!(created, [submitted_at, reopened_at, reopened_at], "oldest first");
}

/// A task for the store's own consumers writes two items: the task and its
/// dedup record, no handoff (the suite's `tasks_without_a_handoff_…`
/// checks the rest of its outbox story).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_without_a_handoff_is_its_item_and_its_record() {
    let f = dynamo::fixture().await;
    let queued = new_task("store-queue").without_handoff();
    f.dynamo_store().submit(queued).await.unwrap();
    let items = (f.count("T").await, f.count("H#").await, f.count("K").await);
    assert_eq!(items, (1, 0, 1), "the task and its record");
}

/// A store built `without_handoffs` writes no handoff item, whatever the
/// task says, nor with a reopening: an application without a dispatcher
/// accumulates nothing. The default store writes one per submission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_handoffs_writes_no_handoff_item_and_the_default_one_does() {
    let f = dynamo::fixture().await;
    let plain = taskfence::DynamoStore::builder(f.dynamo_store().client().clone(), f.table())
        .clock(f.clock().clone())
        .without_handoffs()
        .build()
        .unwrap();
    let once = taskfence::RetryPolicy::default().max_attempts(1);
    let task = plain
        .submit(new_task("no-outbox").policy(once))
        .await
        .unwrap()
        .into_task();
    let items = || async { (f.count("T").await, f.count("H#").await, f.count("K").await) };
    assert_eq!(items().await, (1, 0, 1), "the task and its record, no handoff");
    // Failed, then reopened: still none.
    let lease = acquire(&plain, task.id, "w").await;
    fail_accepted(&plain, lease, Failure::retryable("boom")).await;
    let reopened = plain
        .reopen(task.id, ReopenRequest::new("operator", "again"))
        .await
        .unwrap();
    assert!(reopened.is_accepted(), "{reopened:?}");
    assert_eq!(f.count("H#").await, 0, "a reopening writes none either");

    // The fixture's store, built with the default: one handoff.
    f.dynamo_store().submit(new_task("outbox")).await.unwrap();
    assert_eq!(f.count("H#").await, 1, "the default writes the handoff");
}
