//! Guarantee 9 on a store with a transactional outbox: submit and handoff
//! are atomic, the dispatcher ([`Outbox`]) publishes each handoff at least
//! once and in order, marks it only once it is out, stops at the first
//! failure, and stamps each message with its task's id and version;
//! [`redispatch`](Outbox::redispatch) hands pending tasks to it again. Run by
//! [`dispatch_suite!`](crate::testing::dispatch_suite) on an
//! [`OutboxFixture`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::dispatch::Outbox;
use crate::error::Error;
use crate::inspect::Inspect;
use crate::limits;
use crate::policy::Failure;
use crate::republish::republish_due;
use crate::store::{ClaimNext, ReopenRequest};
use crate::testing::OutboxFixture;
use crate::wire::Stamp;

/// The task ids a recording `publish` was handed, in order.
type Sent = Arc<Mutex<Vec<TaskId>>>;

/// A `publish` that records each task id and accepts it.
fn recorder() -> (
    Sent,
    impl FnMut(Stamp) -> std::future::Ready<Result<(), std::io::Error>> + Send + 'static,
) {
    let sent = Sent::default();
    let s = sent.clone();
    (sent, move |stamp: Stamp| {
        s.lock().expect("sent").push(stamp.task_id);
        std::future::ready(Ok(()))
    })
}

/// Reopens the failed task `id`; panics unless the reopening was accepted.
async fn reopen(store: &dyn TaskStore, id: TaskId) {
    let reopened = store
        .reopen(id, ReopenRequest::new("ops", "fixed"))
        .await
        .expect("reopen");
    assert!(reopened.is_accepted(), "the reopening of {id}: {reopened:?}");
}

/// Submits `n` tasks `k0..`, one store-clock millisecond apart (so their
/// handoffs have an order on every backend).
async fn submit_n<F: OutboxFixture>(f: &F, n: usize) -> Vec<TaskId> {
    let store = f.outbox();
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(submit(&store, new_task(&format!("k{i}"))).await.id);
        f.advance(Duration::from_millis(1)).await;
    }
    ids
}

/// The tasks of the first dispatch round that publishes anything, within
/// a bound: what waits out a round that a cancelled one still holds back
/// (PostgreSQL rolls its transaction back a moment later) or an index that
/// lags the table (DynamoDB).
async fn first_published_round<S: Outbox>(store: &S) -> Vec<TaskId> {
    for _ in 0..200 {
        let (_, publish) = recorder();
        let published = store.dispatch(100, publish).await.expect("dispatch").published;
        if !published.is_empty() {
            return published;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Vec::new()
}

/// Each submitted task's handoff is published once, oldest first, and
/// marked; a duplicate submission writes no second one; published handoffs
/// stay (for the story).
pub async fn submitted_tasks_are_published_once_in_order_and_marked<F: OutboxFixture>(f: &F) {
    let store = f.outbox();
    let ids = submit_n(f, 5).await;
    assert!(
        !store.submit(new_task("k0")).await.unwrap().is_created(),
        "a duplicate submission"
    );
    assert_eq!(f.handoff_count().await, 5, "one handoff per task");
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
    assert_eq!(
        f.handoff_count().await,
        5,
        "published handoffs stay, for the story"
    );
}

/// A dispatcher that dies after publishing and before marking (its round
/// is cancelled mid-publish) leaves the handoff pending: the next round
/// publishes the same task again.
pub async fn crash_between_publish_and_mark_republishes_the_same_task<F: OutboxFixture>(f: &F) {
    let store = f.outbox();
    let id = submit(&store, new_task("k")).await.id;
    let (published_tx, mut published_rx) = tokio::sync::mpsc::unbounded_channel();
    let dispatcher = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .dispatch(10, move |stamp: Stamp| {
                    published_tx.send(stamp.task_id).expect("the test listens");
                    std::future::pending::<Result<(), std::io::Error>>()
                })
                .await
        }
    });
    assert_eq!(published_rx.recv().await, Some(id));
    dispatcher.abort();
    assert!(dispatcher.await.unwrap_err().is_cancelled());
    assert_eq!(
        first_published_round(&store).await,
        [id],
        "at least once, and every copy is the same task"
    );
}

/// A refused publish stops the round: the tasks before it are published
/// and marked, it and the rest stay pending for the next round.
pub async fn a_failed_publish_stops_the_round_and_stays_pending<F: OutboxFixture>(f: &F) {
    let store = f.outbox();
    let ids = submit_n(f, 2).await;
    let (a, b) = (ids[0], ids[1]);
    let round = store
        .dispatch(10, |stamp: Stamp| {
            std::future::ready(if stamp.task_id == b {
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

/// `dispatch_batches` publishes a round in chunks of `batch`, in order,
/// within the limit; a refused batch stays pending whole (also the part the
/// broker took) and is named by its first task; a batch size out of
/// `1..=MAX_BATCH` is a typed error.
pub async fn batches_publish_a_round_in_chunks_and_a_failed_batch_stays_pending_whole<F: OutboxFixture>(
    f: &F,
) {
    let store = f.outbox();
    let ids = submit_n(f, 23).await;
    let batches = Mutex::new(Vec::new());
    let round = store
        .dispatch_batches(15, 10, |batch: Vec<Stamp>| {
            let batch: Vec<TaskId> = batch.iter().map(|s| s.task_id).collect();
            let failing = batches.lock().unwrap().len() == 1;
            batches.lock().unwrap().push(batch);
            // The second batch fails, say after the broker took some of it.
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
    assert_eq!(
        round.failed.map(|(id, _)| id),
        Some(ids[10]),
        "named by its first task"
    );

    let (sent, publish) = recorder();
    let next = store.dispatch(100, publish).await.unwrap();
    assert_eq!(next.published, ids[10..], "the failed batch, whole, and the rest");
    assert_eq!(*sent.lock().unwrap(), ids[10..]);
    for bad in [0, limits::MAX_BATCH + 1] {
        assert!(
            matches!(
                store
                    .dispatch_batches(10, bad, |_| std::future::ready(Ok::<(), std::io::Error>(())))
                    .await,
                Err(Error::InvalidInput(_))
            ),
            "batch {bad}"
        );
    }
}

/// A task for the store's own consumers
/// ([`without_handoff`](crate::NewTask::without_handoff)) gets no handoff
/// at submission, reopening or redispatch, so the dispatcher never
/// publishes it; a broker task beside it keeps its outbox, and
/// `claim_next` takes both.
pub async fn tasks_without_a_handoff_get_none_and_share_the_store_with_broker_tasks<F: OutboxFixture>(f: &F) {
    let store = f.outbox();
    let queued = submit(&store, new_task("store-queue").without_handoff()).await;
    assert_eq!(f.handoff_count().await, 0, "no handoff");
    let brokered = submit(&store, new_task("broker")).await;
    assert_eq!(f.handoff_count().await, 1, "the broker task's handoff");

    let (sent, publish) = recorder();
    store.dispatch(100, publish).await.unwrap();
    assert_eq!(
        *sent.lock().unwrap(),
        [brokered.id],
        "only the broker task is published"
    );
    assert_eq!(
        store.redispatch(&[queued.id]).await.unwrap(),
        0,
        "no handoff to re-send"
    );

    let leases = store.claim_next(ClaimNext::new("w", LEASE, 10)).await.unwrap();
    let mut taken: Vec<_> = leases.iter().map(|l| l.task_id()).collect();
    taken.sort();
    let mut both = vec![queued.id, brokered.id];
    both.sort();
    assert_eq!(taken, both, "a consumer takes both kinds");

    let lease = leases.into_iter().find(|l| l.task_id() == queued.id).unwrap();
    fail_accepted(&store, lease, Failure::permanent("bad input")).await;
    reopen(&store, queued.id).await;
    assert_eq!(
        f.handoff_count().await,
        1,
        "the reopening wrote no handoff either"
    );
    assert!(store.story(queued.id).await.unwrap().unwrap().handoffs.is_empty());
}

/// Every message names its task and the task's assignment version as the
/// dispatcher read it: the outbox's (0 for a task never claimed, the
/// current one for a task claimed meanwhile) and `republish_due`'s.
pub async fn messages_are_stamped_with_the_task_id_and_version<F: OutboxFixture>(f: &F) {
    let store = f.outbox();
    let fresh = submit(&store, new_task("fresh")).await;
    f.advance(Duration::from_millis(1)).await;
    // Taken by a store consumer before its handoff went out (version 1),
    // then its lease runs out and a takeover claims it again (version 2).
    let taken = submit(&store, new_task("taken")).await;
    for _ in 0..2 {
        acquire(&store, taken.id, "w").await;
        f.advance(PAST_LEASE).await;
    }
    let stamps = Mutex::new(Vec::new());
    let round = store
        .dispatch_batches(10, 10, |batch| {
            stamps.lock().unwrap().extend(batch);
            std::future::ready(Ok::<(), std::io::Error>(()))
        })
        .await
        .unwrap();
    assert_eq!(round.published, [fresh.id, taken.id]);
    let stamps = stamps.into_inner().unwrap();
    assert_eq!(stamps, [Stamp::new(fresh.id, 0), Stamp::new(taken.id, 2)]);
    for stamp in &stamps {
        assert_eq!(
            *stamp,
            Stamp::from(&task(&store, stamp.task_id).await),
            "the task's id and version"
        );
    }

    // The lease of assignment 2 ran out: `republish_due` stamps it the same way.
    let mut due = Vec::new();
    republish_due(&store, 10, |stamp| {
        due.push(stamp);
        std::future::ready(Ok::<(), std::io::Error>(()))
    })
    .await
    .unwrap();
    assert_eq!(due, [Stamp::new(taken.id, 2)]);
}

/// `redispatch` writes a fresh handoff for a pending task (none for a
/// running or unknown one), which the next round publishes beside any
/// still pending; bad input is a typed error and writes nothing.
pub async fn redispatch_hands_pending_tasks_to_the_dispatcher_again<F: OutboxFixture>(f: &F) {
    let store = f.outbox();
    let task = submit(&store, new_task("k")).await;
    assert_eq!(first_published_round(&store).await, [task.id]);

    let lease = acquire(&store, task.id, "w").await;
    assert_eq!(
        store.redispatch(&[task.id]).await.unwrap(),
        0,
        "running: no message needed"
    );
    fail_accepted(&store, lease, Failure::permanent("bad")).await;
    reopen(&store, task.id).await;
    assert_eq!(store.redispatch(&[task.id]).await.unwrap(), 1, "pending again");
    assert_eq!(store.redispatch(&[TaskId::new()]).await.unwrap(), 0, "unknown");
    assert_eq!(store.redispatch(&[]).await.unwrap(), 0, "nothing asked");
    let handoffs = f.handoff_count().await;
    let records = f.record_count().await;
    let too_many: Vec<TaskId> = (0..=limits::MAX_BATCH).map(|_| TaskId::new()).collect();
    for bad in [vec![task.id, task.id], too_many] {
        assert!(matches!(
            store.redispatch(&bad).await,
            Err(Error::InvalidInput(_))
        ));
    }
    assert_eq!(
        (f.handoff_count().await, f.record_count().await),
        (handoffs, records),
        "refused input writes nothing"
    );
    let story = store.story(task.id).await.unwrap().unwrap();
    assert_eq!(
        story.handoffs.len(),
        3,
        "the submission's, the reopening's, the redispatch's"
    );
    assert!(story.handoffs[1..].iter().all(|h| h.published_at.is_none()));
    let (sent, publish) = recorder();
    assert_eq!(
        store.dispatch(10, publish).await.unwrap().published,
        [task.id, task.id],
        "each pending handoff once"
    );
    assert_eq!(sent.lock().unwrap().len(), 2);
}

/// Handoffs belong to their task: `purge_expired` deletes them with it,
/// published or not.
pub async fn purge_deletes_the_handoffs_with_their_task<F: OutboxFixture>(f: &F) {
    let store = f.outbox();
    let task = submit(&store, new_task("k").retention(Duration::from_secs(60))).await;
    store.redispatch(&[task.id]).await.unwrap();
    assert_eq!(first_published_round(&store).await.len(), 2);
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
