//! Stranded tasks end to end on PostgreSQL: a queue that acknowledges and
//! delivers nothing loses the messages; `stranded` finds exactly those tasks
//! once they are old enough, `redispatch` hands them off again, the running
//! dispatcher publishes them to a working queue, a worker completes them.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::new_task;
use taskfence::error::InvalidInput;
use taskfence::inspect::Inspect;
use taskfence::store::ReopenRequest;
use taskfence::testing::{Fixture, request};
use taskfence::wire::Stamp;
use taskfence::{Claim, ClaimRequest, Error, Response, TaskId, TaskStore, limits};

const THRESHOLD: Duration = Duration::from_secs(600);

async fn stranded_ids(store: &dyn Inspect) -> Vec<TaskId> {
    store
        .stranded(THRESHOLD, 100)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_messages_are_found_redispatched_and_completed() {
    let f = common::fixture().await;
    let store = f.pg_store();
    let submit = |key: &'static str| async move { store.submit(new_task(key)).await.unwrap().into_task() };
    let lost_1 = submit("lost-1").await;
    let lost_2 = submit("lost-2").await;
    let claimed = submit("claimed").await;

    // A queue that acknowledges every message and delivers none.
    let round = store.dispatch(100, |_| async { Ok::<(), ()>(()) }).await.unwrap();
    assert_eq!(round.published, [lost_1.id, lost_2.id, claimed.id]);
    // One task reaches a worker anyway (another delivery path): claimed, not stranded.
    let long = ClaimRequest::new("w0", THRESHOLD * 2);
    let Claim::Acquired(held) = store.claim(claimed.id, long).await.unwrap() else {
        panic!("a fresh task is available");
    };
    // Submitted while the dispatcher is down: its handoff is never published,
    // so it counts from its submission.
    let unpublished = submit("unpublished").await;

    assert!(stranded_ids(store).await.is_empty(), "nothing is old enough yet");
    f.advance(THRESHOLD + Duration::from_secs(1)).await;
    let young = submit("young").await;
    assert_eq!(
        stranded_ids(store).await,
        [lost_1.id, lost_2.id, unpublished.id],
        "exactly the never-claimed tasks handed off before the threshold, oldest first"
    );

    // The operator hands them off again; the claimed task is skipped.
    let written = store
        .redispatch(&[lost_1.id, lost_2.id, unpublished.id, claimed.id])
        .await
        .unwrap();
    assert_eq!(written, 3, "a fresh handoff for each still-pending task only");
    assert_eq!(
        stranded_ids(store).await,
        [lost_1.id, lost_2.id, unpublished.id],
        "still stranded until the dispatcher publishes the new handoffs"
    );

    // The next round publishes them to a working queue; a worker completes what it receives.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let round = store
        .dispatch(100, |stamp: Stamp| {
            let id = stamp.task_id;
            let tx = tx.clone();
            async move { tx.send(id).map_err(|_| "queue closed") }
        })
        .await
        .unwrap();
    assert!(round.failed.is_none());
    drop(tx);
    let mut completed = BTreeSet::new();
    let mut duplicates = 0;
    while let Some(id) = rx.recv().await {
        match store.claim(id, request("w1")).await.unwrap() {
            Claim::Acquired(lease) => {
                assert!(
                    store
                        .complete(lease, Response::from("done"))
                        .await
                        .unwrap()
                        .is_accepted()
                );
                completed.insert(id);
            }
            // The unpublished task had two handoffs: its second message finds it done.
            Claim::Completed(_) => duplicates += 1,
            other => panic!("unexpected claim of {id}: {other:?}"),
        }
    }
    assert_eq!(
        completed,
        BTreeSet::from([lost_1.id, lost_2.id, unpublished.id, young.id]),
        "the redispatched tasks (and the young one's first handoff) reach the worker"
    );
    assert_eq!(
        duplicates, 1,
        "one extra message, answered from the saved response"
    );
    assert!(stranded_ids(store).await.is_empty());

    let story = store.story(lost_1.id).await.unwrap().unwrap();
    assert_eq!(
        story.handoffs.len(),
        2,
        "the lost handoff and the redispatched one"
    );
    assert!(story.handoffs.iter().all(|h| h.published_at.is_some()));
    assert!(
        store
            .complete(held, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recent_publication_is_not_stranded() {
    let f = common::fixture().await;
    let store = f.pg_store();
    let task = store.submit(new_task("old")).await.unwrap().into_task();
    f.advance(THRESHOLD * 2).await;
    // Submitted long ago, but its message went out only now (the dispatcher was down).
    let round = store.dispatch(100, |_| async { Ok::<(), ()>(()) }).await.unwrap();
    assert_eq!(round.published, [task.id]);
    assert!(
        stranded_ids(store).await.is_empty(),
        "its last publication is recent: the queue may still deliver it"
    );
    f.advance(THRESHOLD + Duration::from_secs(1)).await;
    assert_eq!(stranded_ids(store).await, [task.id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_task_is_handed_off_again() {
    let f = common::fixture().await;
    let store = f.pg_store();
    let task = store.submit(new_task("send")).await.unwrap().into_task();
    store.dispatch(100, |_| async { Ok::<(), ()>(()) }).await.unwrap();
    assert!(
        store
            .cancel(task.id, "wrong recipient")
            .await
            .unwrap()
            .is_accepted()
    );
    let handoffs = f.count("handoffs").await;

    // Inside the operator's transaction, rolled back: nothing stays.
    let mut tx = store.pool().begin().await.unwrap();
    let reopened = store
        .on(&mut tx)
        .reopen(task.id, ReopenRequest::new("ops", "recipient fixed"))
        .await
        .unwrap();
    assert!(reopened.is_accepted());
    tx.rollback().await.unwrap();
    assert_eq!(f.count("handoffs").await, handoffs);
    assert_eq!(f.count("reopenings").await, 0);

    let reopened = store
        .reopen(task.id, ReopenRequest::new("ops", "recipient fixed"))
        .await
        .unwrap()
        .accepted()
        .unwrap();
    assert_eq!(
        f.count("handoffs").await,
        handoffs + 1,
        "a fresh handoff with the reopening"
    );
    let round = store.dispatch(100, |_| async { Ok::<(), ()>(()) }).await.unwrap();
    assert_eq!(
        round.published,
        [task.id],
        "the dispatcher publishes the reopened task"
    );
    let story = store.story(task.id).await.unwrap().unwrap();
    assert_eq!(story.reopenings.len(), 1);
    assert_eq!(story.handoffs.len(), 2);
    assert_eq!(story.handoffs[1].created_at, reopened.budget_started_at);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_redispatch_batches_are_refused_and_write_nothing() {
    let f = common::fixture().await;
    let store = f.pg_store();
    let task = store.submit(new_task("a")).await.unwrap().into_task();
    let before = f.record_count().await;
    assert!(matches!(
        store.redispatch(&[task.id, task.id]).await,
        Err(Error::InvalidInput(InvalidInput::DuplicateInBatch { .. }))
    ));
    let too_many: Vec<TaskId> = (0..=limits::MAX_BATCH).map(|_| TaskId::new()).collect();
    assert!(matches!(
        store.redispatch(&too_many).await,
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(store.redispatch(&[]).await.unwrap(), 0);
    assert_eq!(
        store.redispatch(&[TaskId::new()]).await.unwrap(),
        0,
        "unknown ids are skipped"
    );
    assert_eq!(f.record_count().await, before);
}
