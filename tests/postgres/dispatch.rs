//! The dispatch suite (the outbox and its dispatcher) against `PgStore` on a
//! real PostgreSQL server, and what only PostgreSQL's outbox does: a round
//! holds its handoffs' row locks, so concurrent dispatchers skip each
//! other's; a task without a handoff is one row.

use crate::common;

use taskfence::TaskStore;
use taskfence::testing::Fixture;
use taskfence::wire::Stamp;

use common::new_task;

taskfence::testing::dispatch_suite!(common::fixture());

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
    let second = store
        .dispatch(10, |_| std::future::ready(Ok::<(), std::io::Error>(())))
        .await
        .unwrap();
    assert_eq!(second.published, [b]);
    finish_tx.send(()).unwrap();
    assert_eq!(slow.await.unwrap().published, [a]);
}

/// A task for the store's own consumers writes its row alone (the suite's
/// `tasks_without_a_handoff_…` checks the rest of its outbox story).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_without_a_handoff_is_one_row() {
    let f = common::fixture().await;
    f.pg_store()
        .submit(new_task("store-queue").without_handoff())
        .await
        .unwrap();
    assert_eq!(
        (f.count("tasks").await, f.count("handoffs").await),
        (1, 0),
        "one row"
    );
    assert_eq!(f.record_count().await, 1);
}

/// A store built `without_handoffs` writes no handoff row, whatever the
/// task says: an application without a dispatcher accumulates nothing. The
/// default store writes one per submission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_handoffs_writes_no_handoff_row_and_the_default_one_does() {
    let f = common::fixture().await;
    let plain = taskfence::PgStore::builder(f.pg_store().pool().clone())
        .schema(f.schema())
        .without_handoffs()
        .build()
        .unwrap();
    plain.submit(new_task("no-outbox")).await.unwrap();
    let mut tx = f.pg_store().pool().begin().await.unwrap();
    plain
        .on(&mut tx)
        .submit(new_task("no-outbox-in-tx"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!((f.count("tasks").await, f.count("handoffs").await), (2, 0));
    f.pg_store().submit(new_task("outbox")).await.unwrap();
    assert_eq!((f.count("tasks").await, f.count("handoffs").await), (3, 1));
}
