//! Deterministic refusals on DynamoDB are typed and never retryable: a
//! reopening whose request key newer work has taken, and a table that does
//! not exist. (The application's own refused item: `transactions.rs`.)

use taskfence::store::ReopenRequest;
use taskfence::testing::{Fixture, new_task};
use taskfence::{DynamoStore, Error, Rejection, Status, TaskStore};
use taskfence_test_support::dynamo;

/// DynamoDB's TTL removes a cancelled task's dedup record; a new submission
/// takes the key; reopening the old task would give one key two live tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopening_whose_key_names_newer_work_is_rejected_with_the_newer_task() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let old = store.submit(new_task("send-1")).await.unwrap().into_task();
    assert!(
        store
            .cancel(old.id, "user deleted the message")
            .await
            .unwrap()
            .is_accepted()
    );
    f.expire_dedup_record(&old.key).await;
    let newer = store.submit(new_task("send-1")).await.unwrap();
    assert!(
        newer.is_created(),
        "after the record's expiry the key is new work"
    );
    let newer = newer.into_task();
    let before = f.record_count().await;

    let answer = store
        .reopen(old.id, ReopenRequest::new("ops", "reopen the old one"))
        .await
        .expect("a refusal, not an error");
    assert_eq!(
        answer.rejection(),
        Some(&Rejection::KeyReused { current: newer.id })
    );
    assert_eq!(f.record_count().await, before, "nothing was written");
    assert_eq!(
        store.get(old.id).await.unwrap().unwrap().status,
        Status::Cancelled
    );
    assert_eq!(store.find(&old.key).await.unwrap().map(|t| t.id), Some(newer.id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_a_typed_error_naming_the_fix() {
    let table = format!("never_created_{}", taskfence::TaskId::new().as_uuid().simple());
    let store = DynamoStore::new(dynamo::client(), table).unwrap();
    for err in [
        store.submit(new_task("k")).await.unwrap_err(),
        store.get(taskfence::TaskId::new()).await.unwrap_err(),
    ] {
        assert!(matches!(err, Error::NotMigrated { .. }), "{err:?}");
        assert!(!err.is_retryable());
        assert!(err.to_string().contains("create_table"), "{err}");
    }
}
