//! The handoff (transactional outbox) and its dispatcher on DynamoDB: the
//! PostgreSQL dispatcher's tests (`tests/postgres/dispatcher.rs`) that apply,
//! on a real DynamoDB API.

use std::time::Duration;

use taskfence::clock::Clock;
use taskfence::inspect::Inspect;
use taskfence::store::ReopenRequest;
use taskfence::testing::{DynamoFixture, Fixture, acquire, new_task};
use taskfence::wire::Stamp;
use taskfence::{ClaimNext, Failure, TaskId, TaskStore};
use taskfence_test_support::dynamo;

type Sent = std::sync::Arc<std::sync::Mutex<Vec<TaskId>>>;

fn recorder() -> (
    Sent,
    impl FnMut(Stamp) -> std::future::Ready<Result<(), std::io::Error>> + Send,
) {
    let sent = Sent::default();
    let s = sent.clone();
    (sent, move |stamp: Stamp| {
        let id = stamp.task_id;
        s.lock().unwrap().push(id);
        std::future::ready(Ok(()))
    })
}

/// Submits `n` tasks `k0..`, one clock tick apart (so their handoffs have an order).
async fn submit_n(f: &DynamoFixture, n: usize) -> Vec<TaskId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let task = f
            .dynamo_store()
            .submit(new_task(&format!("k{i}")))
            .await
            .unwrap()
            .into_task();
        ids.push(task.id);
        f.advance(Duration::from_millis(1)).await;
    }
    ids
}

/// One dispatch round, waiting out the index's lag (moto is immediate;
/// DynamoDB a moment late): the first non-empty round's tasks.
async fn round(store: &taskfence::DynamoStore) -> Vec<TaskId> {
    for _ in 0..50 {
        let (_, publish) = recorder();
        let published = store.dispatch(100, publish).await.unwrap().published;
        if !published.is_empty() {
            return published;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Vec::new()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submitted_tasks_are_published_once_in_order_and_marked() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let ids = submit_n(&f, 5).await;
    // A duplicate submit writes no second handoff.
    assert!(!store.submit(new_task("k0")).await.unwrap().is_created());
    assert_eq!(f.count("H#").await, 5, "one handoff item per task");
    let (sent, publish) = recorder();
    let round = store.dispatch(100, publish).await.unwrap();
    assert_eq!(round.published, ids, "oldest first");
    assert!(round.failed.is_none());
    assert_eq!(*sent.lock().unwrap(), ids);
    let (sent, publish) = recorder();
    let again = store.dispatch(100, publish).await.unwrap();
    assert!(
        again.published.is_empty() && sent.lock().unwrap().is_empty(),
        "marked published"
    );
    assert_eq!(f.count("H#").await, 5, "published handoffs stay, for the story");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_publish_and_mark_republishes_the_same_task() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store().clone();
    let id = store.submit(new_task("k")).await.unwrap().into_task().id;
    // The dispatcher publishes, then dies before marking.
    let (published_tx, mut published_rx) = tokio::sync::mpsc::unbounded_channel();
    let dispatcher = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .dispatch(10, move |stamp: Stamp| {
                    let id = stamp.task_id;
                    published_tx.send(id).unwrap();
                    std::future::pending::<Result<(), std::io::Error>>()
                })
                .await
        }
    });
    assert_eq!(published_rx.recv().await, Some(id));
    dispatcher.abort();
    assert!(dispatcher.await.unwrap_err().is_cancelled());
    assert_eq!(
        round(&store).await,
        [id],
        "at least once, and every copy is the same task"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_publish_stops_the_round_and_stays_pending() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let ids = submit_n(&f, 2).await;
    let (a, b) = (ids[0], ids[1]);
    let round = store
        .dispatch(10, |stamp: Stamp| {
            let id = stamp.task_id;
            std::future::ready(if id == b {
                Err(std::io::Error::other("broker down"))
            } else {
                Ok(())
            })
        })
        .await
        .unwrap();
    assert_eq!(round.published, [a]);
    assert_eq!(round.failed.map(|(id, _)| id), Some(b));
    let (_, publish) = recorder();
    assert_eq!(store.dispatch(10, publish).await.unwrap().published, [b]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_publish_a_round_in_chunks_and_a_failed_batch_stays_pending_whole() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let ids = submit_n(&f, 23).await;
    let batches = std::sync::Mutex::new(Vec::new());
    let round = store
        .dispatch_batches(15, 10, |batch: Vec<Stamp>| {
            let batch: Vec<TaskId> = batch.iter().map(|s| s.task_id).collect();
            let failing = batches.lock().unwrap().len() == 1;
            batches.lock().unwrap().push(batch);
            std::future::ready(if failing {
                Err(std::io::Error::other("SendMessageBatch: 2 of 5 failed"))
            } else {
                Ok(())
            })
        })
        .await
        .unwrap();
    let batches = batches.into_inner().unwrap();
    assert_eq!(
        batches,
        [ids[..10].to_vec(), ids[10..15].to_vec()],
        "chunks of 10, in order, within the limit"
    );
    assert_eq!(round.published, ids[..10]);
    assert_eq!(round.failed.map(|(id, _)| id), Some(ids[10]));
    let (sent, publish) = recorder();
    let next = store.dispatch(100, publish).await.unwrap();
    assert_eq!(next.published, ids[10..], "the failed batch, whole, and the rest");
    assert_eq!(*sent.lock().unwrap(), ids[10..]);
    for bad in [0, taskfence::limits::MAX_BATCH + 1] {
        assert!(matches!(
            store
                .dispatch_batches(10, bad, |_| std::future::ready(Ok::<(), std::io::Error>(())))
                .await,
            Err(taskfence::Error::InvalidInput(_))
        ));
    }
}

/// The story lists the handoffs, published or not, oldest first: the
/// submission's, then the reopening's; `redispatch` writes one more for a
/// pending task and none for a running one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_story_shows_handoffs_and_reopening_and_redispatch_write_new_ones() {
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
    assert_eq!(round(store).await, [task.id]);
    let story = store.story(task.id).await.unwrap().unwrap();
    assert_eq!(story.handoffs[0].published_at, Some(published_at));

    let lease = acquire(store, task.id, "w").await;
    assert_eq!(
        store.redispatch(&[task.id]).await.unwrap(),
        0,
        "running: no message needed"
    );
    assert!(
        store
            .fail(lease, Failure::permanent("bad"))
            .await
            .unwrap()
            .is_accepted()
    );
    f.advance(Duration::from_secs(1)).await;
    let reopened_at = f.clock().now();
    assert!(
        store
            .reopen(task.id, ReopenRequest::new("ops", "fixed"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(store.redispatch(&[task.id]).await.unwrap(), 1, "pending again");
    assert_eq!(store.redispatch(&[TaskId::new()]).await.unwrap(), 0, "unknown");
    let story = store.story(task.id).await.unwrap().unwrap();
    let created: Vec<_> = story.handoffs.iter().map(|h| h.created_at).collect();
    assert_eq!(created, [submitted_at, reopened_at, reopened_at], "oldest first");
    assert!(story.handoffs[1..].iter().all(|h| h.published_at.is_none()));
    let (sent, publish) = recorder();
    assert_eq!(
        store.dispatch(10, publish).await.unwrap().published,
        [task.id, task.id]
    );
    assert_eq!(sent.lock().unwrap().len(), 2);
}

/// A task for the store's own consumers writes no handoff at submission,
/// reopening or redispatch, so the dispatcher never publishes it; a broker
/// task beside it keeps its outbox, and `claim_next` takes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_without_a_handoff_write_none_and_share_the_table_with_broker_tasks() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let queued = store
        .submit(new_task("store-queue").without_handoff())
        .await
        .unwrap()
        .into_task();
    assert_eq!(
        (f.count("T").await, f.count("H#").await, f.count("K").await),
        (1, 0, 1),
        "the task and its record"
    );
    let brokered = store.submit(new_task("broker")).await.unwrap().into_task();
    assert_eq!(f.count("H#").await, 1, "the broker task's handoff");
    let (sent, publish) = recorder();
    store.dispatch(100, publish).await.unwrap();
    assert_eq!(*sent.lock().unwrap(), [brokered.id], "only the broker task");
    assert_eq!(
        store.redispatch(&[queued.id]).await.unwrap(),
        0,
        "no handoff to re-send"
    );

    let leases = store
        .claim_next(ClaimNext::new("w", Duration::from_secs(30), 10))
        .await
        .unwrap();
    let mut taken: Vec<_> = leases.iter().map(|l| l.task_id()).collect();
    taken.sort();
    let mut both = vec![queued.id, brokered.id];
    both.sort();
    assert_eq!(taken, both, "a consumer takes both kinds");
    let lease = leases.into_iter().find(|l| l.task_id() == queued.id).unwrap();
    assert!(
        store
            .fail(lease, Failure::permanent("bad input"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert!(
        store
            .reopen(queued.id, ReopenRequest::new("ops", "fixed"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(f.count("H#").await, 1, "the reopening wrote no handoff either");
    assert!(store.story(queued.id).await.unwrap().unwrap().handoffs.is_empty());
}

/// Handoffs are children of the task's partition: `purge_expired` deletes
/// them with it, published or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_the_handoffs_with_their_task() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let task = store
        .submit(new_task("k").retention(Duration::from_secs(60)))
        .await
        .unwrap()
        .into_task();
    store.redispatch(&[task.id]).await.unwrap();
    assert_eq!(round(store).await.len(), 2);
    assert!(
        store
            .cancel(task.id, "no longer needed")
            .await
            .unwrap()
            .is_accepted()
    );
    f.advance(Duration::from_secs(61)).await;
    assert_eq!(store.purge_expired(10).await.unwrap(), 1);
    assert_eq!(f.record_count().await, 0, "task, record and handoffs gone");
    let (_, publish) = recorder();
    assert!(store.dispatch(10, publish).await.unwrap().published.is_empty());
}
