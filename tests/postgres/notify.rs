//! `PgStoreBuilder::notify_on_submit`: a submission that creates a task
//! without a handoff notifies the store's channel with its operation, in the
//! submit statement itself; nothing else does.

use crate::common;

use std::time::Duration;

use common::new_task;
use sqlx::postgres::PgListener;
use taskfence::{PgStore, TaskStore};

/// The next notification within a second, if any.
async fn next(listener: &mut PgListener) -> Option<String> {
    tokio::time::timeout(Duration::from_secs(1), listener.recv())
        .await
        .ok()
        .map(|n| n.expect("the listener's connection").payload().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_created_task_without_a_handoff_notifies_its_operation() {
    let f = common::fixture().await;
    let store = PgStore::builder(f.pg_store().pool().clone())
        .schema(f.schema())
        .notify_on_submit()
        .build()
        .unwrap();
    let channel = store.notify_channel().expect("a notifying store").to_owned();
    assert_eq!(channel, format!("{}_submitted", f.schema()));
    let mut listener = PgListener::connect_with(store.pool()).await.unwrap();
    listener.listen(&channel).await.unwrap();

    let queued = new_task("queued").without_handoff();
    let operation = queued.key.operation.clone();
    assert!(store.submit(queued.clone()).await.unwrap().is_created());
    assert_eq!(
        next(&mut listener).await,
        Some(operation),
        "a created queue task notifies"
    );

    assert!(!store.submit(queued).await.unwrap().is_created());
    assert!(store.submit(new_task("brokered")).await.unwrap().is_created());
    assert_eq!(
        next(&mut listener).await,
        None,
        "neither a repeated submission nor a task with a handoff notifies"
    );

    // A store built without the option never notifies.
    f.pg_store()
        .submit(new_task("plain").without_handoff())
        .await
        .unwrap();
    assert_eq!(next(&mut listener).await, None);
}

/// `submit_many` notifies as `submit` does: each created task without a
/// handoff, in the batch's one statement; a repeated or brokered one does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_notifies_for_its_created_tasks_without_a_handoff() {
    let f = common::fixture().await;
    let store = PgStore::builder(f.pg_store().pool().clone())
        .schema(f.schema())
        .notify_on_submit()
        .build()
        .unwrap();
    let channel = store.notify_channel().expect("a notifying store").to_owned();
    let mut listener = PgListener::connect_with(store.pool()).await.unwrap();
    listener.listen(&channel).await.unwrap();

    let queued = new_task("queued").without_handoff();
    let operation = queued.key.operation.clone();
    let answers = store
        .submit_many(vec![queued.clone(), new_task("brokered")])
        .await
        .unwrap();
    assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|s| s.is_created())));
    assert_eq!(
        next(&mut listener).await,
        Some(operation),
        "the queue task notifies"
    );
    assert_eq!(next(&mut listener).await, None, "the brokered one does not");

    assert!(
        store.submit_many(vec![queued]).await.unwrap()[0]
            .as_ref()
            .is_ok_and(|s| !s.is_created())
    );
    assert_eq!(next(&mut listener).await, None, "a repeated submission does not");
}
