//! Bad input on PostgreSQL: the typed error, and the real row counts of every
//! table show nothing was written — through the pool and inside a caller's transaction.

use crate::common;

use std::time::Duration;

use taskfence::testing::PgFixture;
use taskfence::{ClaimRequest, Error, Failure, InputHash, NewTask, RequestKey, Response, TaskStore, limits};

async fn rows(f: &PgFixture) -> (i64, i64, i64) {
    (
        f.count("tasks").await,
        f.count("attempts").await,
        f.count("handoffs").await,
    )
}

fn invalid<T: std::fmt::Debug>(r: taskfence::Result<T>) -> bool {
    matches!(r, Err(Error::InvalidInput(_)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_bytes_oversized_and_malformed_values_are_typed_errors_and_write_nothing() {
    let f = common::fixture().await;
    let store = f.pg_store();
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
    for new in bad.clone() {
        assert!(invalid(store.submit(new.clone()).await), "{:?}", new.key);
        let mut tx = store.pool().begin().await.unwrap();
        assert!(invalid(store.on(&mut tx).submit(new).await));
        tx.commit().await.unwrap();
        assert_eq!(rows(&f).await, (0, 0, 0), "nothing written");
    }

    // NUL bytes are fine where the data is bytes: payloads and responses are bytea.
    let task = store
        .submit(NewTask::new(key("k"), hash).payload(b"a\0b".to_vec()))
        .await
        .unwrap()
        .into_task();
    assert_eq!(store.get(task.id).await.unwrap().unwrap().payload, b"a\0b");
    let lease = common::acquire(store, task.id, "w").await;
    let before = rows(&f).await;
    let snapshot = store.get(task.id).await.unwrap().unwrap();
    assert!(invalid(
        store
            .claim(task.id, ClaimRequest::new("w\0", Duration::from_secs(30)))
            .await
    ));
    assert!(invalid(store.record_operation(&lease, "op\0").await));
    assert!(invalid(
        store.fail(lease.clone(), Failure::retryable("x\0")).await
    ));
    assert!(invalid(store.cancel(task.id, "why\0").await));
    let mut tx = store.pool().begin().await.unwrap();
    let oversized = Response::new(vec![0u8; limits::MAX_RESPONSE_LEN + 1]);
    assert!(invalid(
        store.on(&mut tx).complete(lease.clone(), oversized).await
    ));
    assert!(invalid(
        store
            .on(&mut tx)
            .fail(lease.clone(), Failure::retryable("y\0"))
            .await
    ));
    assert!(invalid(store.on(&mut tx).cancel(task.id, "z\0").await));
    assert!(invalid(
        store
            .on(&mut tx)
            .claim(task.id, ClaimRequest::new("w", Duration::ZERO))
            .await
    ));
    tx.commit().await.unwrap();
    assert_eq!(rows(&f).await, before, "refused writes add no row");
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
