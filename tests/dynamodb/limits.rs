//! Concurrency keys and rate buckets decided by `DynamoStore`: the limits
//! suite, each test on a fresh table; and what the suite leaves to each
//! backend: claims of one key racing by id, a limit above this backend's,
//! old items without limits.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use taskfence::testing::{Fixture, InspectFixture, acquire, new_task, race, request};
use taskfence::throttle::{ConcurrencyKey, Throttled};
use taskfence::{Claim, Error, Response, TaskId, TaskStore};
use taskfence_test_support::dynamo;

taskfence::testing::limits_suite!(dynamo::fixture());

/// Claims by id of every task of one key, racing from several tasks at
/// once: no more than the key's limit are granted, each refusal is the
/// key's, and the key's slots are the granted leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claims_by_id_of_one_key_never_pass_its_limit() {
    let f = dynamo::fixture().await;
    let store = f.store();
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(
            store
                .submit(new_task(&format!("t{i}")).concurrency(ConcurrencyKey::new("tenant-acme", 2)))
                .await
                .unwrap()
                .into_task()
                .id,
        );
    }
    let ids = Arc::new(ids);
    let shared = Arc::clone(&store);
    let claims: Vec<Claim> = race(6, move |i| {
        let (store, ids) = (Arc::clone(&shared), Arc::clone(&ids));
        async move { store.claim(ids[i], request(&format!("w{i}"))).await.unwrap() }
    })
    .await;
    let mut granted = Vec::new();
    for claim in claims {
        match claim {
            Claim::Acquired(lease) => granted.push(lease.task_id()),
            Claim::Throttled(Throttled::Concurrency { key, limit }) => {
                assert_eq!((key.as_str(), limit), ("tenant-acme", 2));
            }
            other => panic!("expected a lease or the key's refusal, got {}", other.label()),
        }
    }
    assert_eq!(granted.len(), 2, "the limit, across every racing claim");
    let slots = f.inspector().concurrency("tenant-acme").await.unwrap();
    let running: HashSet<TaskId> = slots.running.into_iter().collect();
    assert_eq!(running, granted.into_iter().collect::<HashSet<_>>());
    assert_eq!(slots.waiting, 4);
}

/// A concurrency limit above this backend's (the key item lists its
/// holders) is a typed error, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_above_this_backends_is_refused() {
    let f = dynamo::fixture().await;
    let store = f.store();
    let before = f.record_count().await;
    let too_high = taskfence::dynamodb::MAX_CONCURRENCY + 1;
    let err = store
        .submit(new_task("a").concurrency(ConcurrencyKey::new("k", too_high)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    assert_eq!(f.record_count().await, before);
    let at_max = ConcurrencyKey::new("k", taskfence::dynamodb::MAX_CONCURRENCY);
    assert!(store.submit(new_task("b").concurrency(at_max)).await.is_ok());
}

/// A purge takes a keyed task's member item with it; the key's order goes
/// on past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_task_leaves_no_member_item() {
    let f = dynamo::fixture().await;
    let store = f.store();
    let key = ConcurrencyKey::new("conversation-7", 1);
    let old = store
        .submit(
            new_task("m1")
                .concurrency(key.clone())
                .retention(Duration::from_secs(60)),
        )
        .await
        .unwrap()
        .into_task()
        .id;
    let lease = acquire(&*store, old, "w").await;
    assert!(
        store
            .complete(lease, Response::from("1"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(f.count("O#").await, 1, "one member item");
    f.advance(Duration::from_secs(120)).await;
    assert_eq!(store.purge_expired(10).await.unwrap(), 1);
    assert_eq!(f.count("O#").await, 0, "purged with its task");
    let young = store
        .submit(new_task("m2").concurrency(key))
        .await
        .unwrap()
        .into_task()
        .id;
    assert!(store.claim(young, request("w")).await.unwrap().is_acquired());
}

/// `with(items)` does not decide limits: a task naming one is refused as
/// unsupported, and neither it nor the application's items are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_items_refuses_a_task_naming_limits() {
    use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
    let f = dynamo::fixture().await;
    let before = f.record_count().await;
    let put = Put::builder()
        .table_name(f.table())
        .item(
            taskfence::dynamodb::PARTITION_KEY,
            AttributeValue::S("app#rows".into()),
        )
        .item(taskfence::dynamodb::SORT_KEY, AttributeValue::S("message".into()))
        .build()
        .unwrap();
    let err = f
        .dynamo_store()
        .with(vec![TransactWriteItem::builder().put(put).build()])
        .submit(new_task("a").concurrency(ConcurrencyKey::new("k", 1)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert_eq!(f.record_count().await, before, "nothing written");
}
