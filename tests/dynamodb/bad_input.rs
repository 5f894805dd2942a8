//! Bad input on DynamoDB: the typed error, and the table's real item counts
//! show nothing was written — for the limits every backend shares, for this
//! backend's own item-size limits, and through the transaction variants.

use std::time::Duration;

use taskfence::dynamodb::{MAX_EXTRA_ITEMS, MAX_PAYLOAD_LEN, MAX_RESPONSE_LEN};
use taskfence::error::InvalidInput;
use taskfence::testing::{DynamoFixture, Fixture, acquire};
use taskfence::{ClaimRequest, Error, Failure, InputHash, NewTask, RequestKey, Response, TaskStore, limits};
use taskfence_test_support::dynamo;

/// (tasks, attempts, dedup records)
async fn items(f: &DynamoFixture) -> (u64, u64, u64) {
    (f.count("T").await, f.count("A#").await, f.count("K").await)
}

fn invalid<T: std::fmt::Debug>(r: taskfence::Result<T>) -> bool {
    matches!(r, Err(Error::InvalidInput(_)))
}

fn too_long<T: std::fmt::Debug>(r: taskfence::Result<T>, field: &str) -> bool {
    matches!(r, Err(Error::InvalidInput(InvalidInput::TooLong { field: f, .. })) if f == field)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_bytes_oversized_and_malformed_values_are_typed_errors_and_write_nothing() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let hash = InputHash::of(["x"]);
    let key = |k: &str| RequestKey::new("user-1", "chat.reply", k);
    let bad = [
        NewTask::new(key("a\0b"), hash),
        NewTask::new(RequestKey::new("user\0", "chat.reply", "k"), hash),
        NewTask::new(key(&"k".repeat(limits::MAX_KEY_LEN + 1)), hash),
        NewTask::new(key("k"), hash).payload(vec![1u8; limits::MAX_PAYLOAD_LEN + 1]),
        NewTask::new(key("k"), hash).retention(Duration::ZERO),
        NewTask::new(key("k"), hash).policy(taskfence::RetryPolicy::default().max_attempts(0)),
        NewTask::new(key("k"), hash).policy(taskfence::RetryPolicy::default().multiplier(f64::INFINITY)),
    ];
    for new in bad {
        assert!(invalid(store.submit(new.clone()).await), "{:?}", new.key);
        assert!(invalid(store.with(Vec::new()).submit(new).await));
        assert_eq!(items(&f).await, (0, 0, 0), "nothing written");
    }

    // NUL bytes are fine where the data is bytes: payloads and responses are `B`.
    let task = store
        .submit(NewTask::new(key("k"), hash).payload(b"a\0b".to_vec()))
        .await
        .unwrap()
        .into_task();
    assert_eq!(store.get(task.id).await.unwrap().unwrap().payload, b"a\0b");
    let lease = acquire(store, task.id, "w").await;
    let before = items(&f).await;
    let snapshot = store.get(task.id).await.unwrap().unwrap();
    assert!(invalid(
        store
            .claim(task.id, ClaimRequest::new("w\0", Duration::from_secs(30)))
            .await
    ));
    assert!(invalid(
        store.claim(task.id, ClaimRequest::new("w", Duration::ZERO)).await
    ));
    assert!(invalid(store.record_operation(&lease, "op\0").await));
    assert!(invalid(
        store.fail(lease.clone(), Failure::retryable("x\0")).await
    ));
    assert!(invalid(store.cancel(task.id, "why\0").await));
    let mut renewing = lease.clone();
    assert!(invalid(store.renew(&mut renewing, Duration::ZERO).await));
    let oversized = Response::new(vec![0u8; limits::MAX_RESPONSE_LEN + 1]);
    assert!(invalid(store.complete(lease.clone(), oversized.clone()).await));
    assert!(invalid(
        store.with(Vec::new()).complete(lease.clone(), oversized).await
    ));
    assert_eq!(items(&f).await, before, "refused writes add no item");
    assert_eq!(
        store.get(task.id).await.unwrap().unwrap(),
        snapshot,
        "and change none"
    );
    assert!(
        store
            .complete(lease, Response::new(b"\0\x01binary".to_vec()))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(
        store.get(task.id).await.unwrap().unwrap().response,
        Some(Response::new(b"\0\x01binary".to_vec()))
    );
}

/// This backend's own limits (the 400 KB item): a payload or a response that
/// every backend's limits allow but a DynamoDB item cannot hold is refused
/// before any request, typed, naming the field; one at the limit is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_and_responses_over_the_item_limit_are_refused_before_writing() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let new = |k: &str| NewTask::new(RequestKey::new("user-1", "chat.reply", k), InputHash::of([k]));
    let big = new("big").payload(vec![7u8; MAX_PAYLOAD_LEN + 1]);
    assert!(big.validate().is_ok(), "within the shared limits");
    assert!(too_long(store.submit(big.clone()).await, "payload"));
    assert!(too_long(store.with(Vec::new()).submit(big).await, "payload"));
    assert_eq!(items(&f).await, (0, 0, 0), "nothing written");
    let extra = vec![aws_sdk_dynamodb::types::TransactWriteItem::builder().build(); MAX_EXTRA_ITEMS + 1];
    assert!(invalid(store.with(extra).submit(new("many")).await));
    assert_eq!(items(&f).await, (0, 0, 0), "nothing written");

    // The largest payload and the largest response fit in one item together.
    let task = store
        .submit(new("max").payload(vec![7u8; MAX_PAYLOAD_LEN]))
        .await
        .unwrap()
        .into_task();
    let lease = acquire(store, task.id, "w").await;
    let before = items(&f).await;
    let too_big = Response::new(vec![1u8; MAX_RESPONSE_LEN + 1]);
    assert!(too_long(store.complete(lease.clone(), too_big).await, "response"));
    assert_eq!(items(&f).await, before);
    assert_eq!(store.get(task.id).await.unwrap().unwrap().response, None);
    let fail_text = "e".repeat(limits::MAX_MESSAGE_LEN);
    let mut renewing = lease.clone();
    assert!(
        store
            .renew(&mut renewing, Duration::from_secs(30))
            .await
            .unwrap()
            .is_accepted()
    );
    // A maximal error text, then the maximal response: still one item.
    assert!(
        store
            .fail(renewing, Failure::retryable(fail_text))
            .await
            .unwrap()
            .is_accepted()
    );
    f.advance(Duration::from_secs(3600)).await;
    let second = acquire(store, task.id, "w").await;
    let max = Response::new(vec![1u8; MAX_RESPONSE_LEN]);
    assert!(store.complete(second, max.clone()).await.unwrap().is_accepted());
    assert_eq!(store.get(task.id).await.unwrap().unwrap().response, Some(max));
}
