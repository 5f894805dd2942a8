//! Guarantees 2, 3 and 4: a request key names one piece of work, bound to its inputs, within its scope.

use super::*;
use crate::error::Error;
use crate::task::{InputHash, NewTask, RequestKey, Response, Status};
use crate::testing::{Fixture, race};

/// Guarantee 2: the same key with the same inputs is the existing task, and nothing new is written.
pub async fn duplicate_submit_returns_same_task(f: &dyn Fixture) {
    let store = f.store();
    let first = store.submit(new_task("send-1")).await.expect("submit");
    assert!(first.is_created(), "first submission creates the task");
    let records = f.record_count().await;
    let second = store.submit(new_task("send-1")).await.expect("resubmit");
    assert!(!second.is_created(), "a repeated submission is not new work");
    assert_eq!(second.task().id, first.task().id, "same task");
    assert_eq!(
        f.record_count().await,
        records,
        "a repeated submission writes nothing"
    );
    let found = store.find(&key("send-1")).await.expect("find").expect("found");
    assert_eq!(found.id, first.task().id);
}

/// Guarantee 3: a reused key with different inputs is a typed error naming the task; nothing is written.
pub async fn key_reuse_with_other_inputs_conflicts_and_writes_nothing(f: &dyn Fixture) {
    let store = f.store();
    let original = submit(&*store, new_task("send-1")).await;
    let records = f.record_count().await;
    let other_inputs = NewTask::new(
        key("send-1"),
        InputHash::of(["conversation-1", "another question"]),
    );
    match store.submit(other_inputs).await {
        Err(Error::KeyConflict { existing }) => assert_eq!(existing, original.id),
        other => panic!("expected KeyConflict, got {other:?}"),
    }
    assert_eq!(
        f.record_count().await,
        records,
        "a conflicting submission writes nothing"
    );
    assert_eq!(
        task(&*store, original.id).await,
        original,
        "the original task is untouched"
    );
}

/// Request keys are scoped: the same key under another scope or operation is independent.
pub async fn same_key_in_another_scope_or_operation_is_independent(f: &dyn Fixture) {
    let store = f.store();
    let hash = InputHash::of(["same inputs"]);
    let a = submit(
        &*store,
        NewTask::new(RequestKey::new("user-a", "chat.reply", "k"), hash),
    )
    .await;
    let b = submit(
        &*store,
        NewTask::new(RequestKey::new("user-b", "chat.reply", "k"), hash),
    )
    .await;
    let c = submit(
        &*store,
        NewTask::new(RequestKey::new("user-a", "doc.index", "k"), hash),
    )
    .await;
    assert_ne!(a.id, b.id, "another scope is another task");
    assert_ne!(a.id, c.id, "another operation is another task");
    // And a different input hash in another scope is no conflict either.
    let d = store
        .submit(NewTask::new(
            RequestKey::new("user-c", "chat.reply", "k"),
            InputHash::of(["other"]),
        ))
        .await
        .expect("no conflict across scopes");
    assert!(d.is_created());
}

/// Guarantee 4: a new key with identical inputs (Regenerate) is a new task.
pub async fn regenerate_with_new_key_is_new_work(f: &dyn Fixture) {
    let store = f.store();
    let hash = InputHash::of(["conversation-1", "message-7"]);
    let first = submit(&*store, NewTask::new(key("send-7"), hash)).await;
    let lease = acquire(&*store, first.id, "w").await;
    assert!(
        store
            .complete(lease, Response::from("first answer"))
            .await
            .unwrap()
            .is_accepted()
    );
    let regenerated = store
        .submit(NewTask::new(key("regenerate-7"), hash))
        .await
        .expect("submit");
    assert!(
        regenerated.is_created(),
        "regenerate is never deduplicated by input hash"
    );
    assert_ne!(regenerated.task().id, first.id);
    assert_eq!(regenerated.task().status, Status::Pending);
    assert_eq!(
        task(&*store, first.id).await.response,
        Some(Response::from("first answer")),
        "first reply unchanged"
    );
}

/// Guarantee 2 under a race: many concurrent duplicate submits make one task.
pub async fn concurrent_duplicate_submits_create_one_task(f: &dyn Fixture) {
    let store = f.store();
    let results = race(RACERS, |_| {
        let store = store.clone();
        async move { store.submit(new_task("send-race")).await.expect("submit") }
    })
    .await;
    let created = results.iter().filter(|s| s.is_created()).count();
    assert_eq!(created, 1, "exactly one submission creates the task");
    let id = results[0].task().id;
    assert!(
        results.iter().all(|s| s.task().id == id),
        "every submission sees the same task"
    );
}

/// One scope can never find, claim-by-key or complete another scope's task by key.
pub async fn scopes_are_isolated(f: &dyn Fixture) {
    let store = f.store();
    let hash = InputHash::of(["private question"]);
    let alice = submit(
        &*store,
        NewTask::new(RequestKey::new("alice", "chat.reply", "k-1"), hash),
    )
    .await;
    assert!(
        store
            .find(&RequestKey::new("bob", "chat.reply", "k-1"))
            .await
            .unwrap()
            .is_none(),
        "bob cannot find alice's key"
    );
    assert!(
        store
            .find(&RequestKey::new("Alice", "chat.reply", "k-1"))
            .await
            .unwrap()
            .is_none(),
        "scopes are exact"
    );
    // Bob submitting alice's key and inputs gets his own task, never hers.
    let bob = submit(
        &*store,
        NewTask::new(RequestKey::new("bob", "chat.reply", "k-1"), hash),
    )
    .await;
    assert_ne!(bob.id, alice.id);
    let lease = acquire(&*store, bob.id, "w").await;
    assert!(
        store
            .complete(lease, Response::from("bob's reply"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(
        task(&*store, alice.id).await.status,
        Status::Pending,
        "alice's task untouched"
    );
    assert_eq!(
        store.find(&alice.key).await.unwrap().map(|t| t.id),
        Some(alice.id)
    );
}
