//! The handoff (transactional outbox) and its dispatcher on the real server.

use crate::common;

use std::time::Duration;

use taskfence::testing::Fixture;
use taskfence::wire::Stamp;
use taskfence::{Claim, ClaimRequest, TaskId, TaskStore};

use common::new_task;
use taskfence::dispatch::dispatch_due;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submitted_tasks_are_published_once_in_order_and_marked() {
    let f = common::fixture().await;
    let store = f.pg_store();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            store
                .submit(new_task(&format!("k{i}")))
                .await
                .unwrap()
                .into_task()
                .id,
        );
    }
    // A duplicate submit records no second handoff.
    assert!(!store.submit(new_task("k0")).await.unwrap().is_created());
    let (sent, publish) = recorder();
    let round = store.dispatch(100, publish).await.unwrap();
    assert_eq!(round.published, ids);
    assert!(round.failed.is_none());
    assert_eq!(*sent.lock().unwrap(), ids);
    let (sent, publish) = recorder();
    let again = store.dispatch(100, publish).await.unwrap();
    assert!(
        again.published.is_empty() && sent.lock().unwrap().is_empty(),
        "marked published"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_publish_and_mark_republishes_the_same_task() {
    let f = common::fixture().await;
    let store = f.pg_store().clone();
    let id = store.submit(new_task("k")).await.unwrap().into_task().id;
    // The dispatcher publishes, then dies before marking (its task is aborted
    // mid-round: the transaction never commits).
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
    // The aborted round's locks go with its rolled-back transaction; then the
    // next round publishes the same task id again.
    let republished = common::eventually(Duration::from_secs(10), || {
        let store = store.clone();
        async move {
            let (_, publish) = recorder();
            let round = store.dispatch(10, publish).await.unwrap();
            (!round.published.is_empty()).then_some(round.published)
        }
    })
    .await;
    assert_eq!(
        republished,
        [id],
        "at least once, and every copy is the same task"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_dispatchers_skip_each_others_handoffs() {
    let f = common::fixture().await;
    let store = f.pg_store().clone();
    let a = store.submit(new_task("a")).await.unwrap().into_task().id;
    let b = store.submit(new_task("b")).await.unwrap().into_task().id;
    // Dispatcher 1 takes one handoff and is slow to publish it.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let slow = tokio::spawn({
        let store = store.clone();
        let mut started = Some(started_tx);
        let mut finish = Some(finish_rx);
        async move {
            store
                .dispatch(1, move |stamp: Stamp| {
                    let id = stamp.task_id;
                    started.take().unwrap().send(id).unwrap();
                    let finish = finish.take().unwrap();
                    async move {
                        finish.await.unwrap();
                        Ok::<(), std::io::Error>(())
                    }
                })
                .await
                .unwrap()
        }
    });
    let first = started_rx.await.unwrap();
    assert_eq!(first, a);
    // Dispatcher 2 does not wait for it: SKIP LOCKED hands it the other one.
    let (_, publish) = recorder();
    let second = store.dispatch(10, publish).await.unwrap();
    assert_eq!(second.published, [b]);
    finish_tx.send(()).unwrap();
    assert_eq!(slow.await.unwrap().published, [a]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_publish_stops_the_round_and_stays_pending() {
    let f = common::fixture().await;
    let store = f.pg_store();
    let a = store.submit(new_task("a")).await.unwrap().into_task().id;
    let b = store.submit(new_task("b")).await.unwrap().into_task().id;
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
async fn expired_leases_and_passed_backoffs_are_redispatched() {
    let f = common::fixture().await;
    let store = f.pg_store();
    let crashed = store.submit(new_task("crashed")).await.unwrap().into_task().id;
    let live = store.submit(new_task("live")).await.unwrap().into_task().id;
    for id in [crashed, live] {
        assert!(matches!(
            store
                .claim(id, ClaimRequest::new("w", Duration::from_secs(30)))
                .await
                .unwrap(),
            Claim::Acquired(_)
        ));
    }
    let (sent, publish) = recorder();
    assert!(
        dispatch_due(store, 10, publish)
            .await
            .unwrap()
            .published
            .is_empty()
    );
    assert!(
        sent.lock().unwrap().is_empty(),
        "nothing due while leases are live"
    );
    f.advance(Duration::from_secs(31)).await;
    let Claim::Acquired(_) = store
        .claim(live, ClaimRequest::new("w2", Duration::from_secs(30)))
        .await
        .unwrap()
    else {
        panic!("expired: taken over")
    };
    let (sent, publish) = recorder();
    assert_eq!(
        dispatch_due(store, 10, publish).await.unwrap().published,
        [crashed]
    );
    assert_eq!(*sent.lock().unwrap(), [crashed]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_publish_a_round_in_chunks_and_a_failed_batch_stays_pending_whole() {
    let f = common::fixture().await;
    let store = f.pg_store();
    let mut ids = Vec::new();
    for i in 0..23 {
        ids.push(
            store
                .submit(new_task(&format!("k{i}")))
                .await
                .unwrap()
                .into_task()
                .id,
        );
    }
    let batches = std::sync::Mutex::new(Vec::new());
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
    assert!(matches!(
        store
            .dispatch_batches(10, 0, |_| std::future::ready(Ok::<(), std::io::Error>(())))
            .await,
        Err(taskfence::Error::InvalidInput(_))
    ));
}

/// A task for the store's own consumers writes its row alone: no handoff at
/// submission, reopening or redispatch, so the dispatcher never publishes
/// it; a broker task beside it in the same schema keeps its outbox, and
/// `claim_next` takes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_without_a_handoff_write_one_row_and_share_the_schema_with_broker_tasks() {
    use taskfence::store::ReopenRequest;
    let f = common::fixture().await;
    let store = f.pg_store();
    let queued = store
        .submit(new_task("store-queue").without_handoff())
        .await
        .unwrap()
        .into_task();
    assert_eq!(
        (f.count("tasks").await, f.count("handoffs").await),
        (1, 0),
        "one row"
    );
    let brokered = store.submit(new_task("broker")).await.unwrap().into_task();
    assert_eq!(f.count("handoffs").await, 1, "the broker task's handoff");

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
    let next = taskfence::ClaimNext::new("w", Duration::from_secs(30), 10);
    let leases = store.claim_next(next).await.unwrap();
    let mut taken: Vec<_> = leases.iter().map(|l| l.task_id()).collect();
    taken.sort();
    let mut both = vec![queued.id, brokered.id];
    both.sort();
    assert_eq!(taken, both, "a consumer takes both kinds");

    let lease = leases.into_iter().find(|l| l.task_id() == queued.id).unwrap();
    assert!(
        store
            .fail(lease, taskfence::Failure::permanent("bad input"))
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
    assert_eq!(
        f.count("handoffs").await,
        1,
        "the reopening wrote no handoff either"
    );
}

/// Every message names its task and the task's assignment version as the
/// dispatcher read it: the outbox's (0 for a task never claimed, the current
/// one for a task `claim_next` took meanwhile) and `dispatch_due`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_stamped_with_the_task_id_and_version() {
    let f = common::fixture().await;
    let store = f.pg_store();
    let fresh = store.submit(new_task("fresh")).await.unwrap().into_task();
    // Taken by a store consumer before its handoff went out (version 1),
    // then its lease runs out and a takeover claims it again (version 2).
    let taken = store.submit(new_task("taken")).await.unwrap().into_task();
    for _ in 0..2 {
        let Claim::Acquired(_) = store
            .claim(taken.id, ClaimRequest::new("w", Duration::from_secs(30)))
            .await
            .unwrap()
        else {
            panic!("claimed")
        };
        f.advance(Duration::from_secs(31)).await;
    }
    let stamps = std::sync::Mutex::new(Vec::new());
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
        let task = store.get(stamp.task_id).await.unwrap().unwrap();
        assert_eq!(*stamp, Stamp::from(&task), "the task's id and version");
    }

    // The lease of assignment 2 ran out: `dispatch_due` stamps it the same way.
    let mut due = Vec::new();
    dispatch_due(store, 10, |stamp| {
        due.push(stamp);
        std::future::ready(Ok::<(), std::io::Error>(()))
    })
    .await
    .unwrap();
    assert_eq!(due, [Stamp::new(taken.id, 2)]);
}
