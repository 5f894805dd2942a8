//! The dashboard's reads are bounded: the overview's counts stop at a cap
//! and say so, a page beyond the concurrent-read limit is refused at once
//! (503 with `Retry-After`), a read past the store's timeout is 503 (not a
//! hang), and a page size beyond the limit is 400 — on PostgreSQL, with a
//! real lock held on the tasks table to make reads wait.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{StatusCode, header};
use common::*;
use taskfence::PgStore;
use taskfence::testing::{Fixture, InspectFixture, MemoryFixture, PgFixture};

/// A fresh schema on the test server.
async fn pg() -> PgFixture {
    taskfence_test_support::fixture().await
}

/// A store on `f`'s schema whose reads may run `limit`.
fn store_with_timeout(f: &PgFixture, limit: Duration) -> Arc<PgStore> {
    Arc::new(
        PgStore::builder(f.pg_store().pool().clone())
            .schema(f.schema())
            .read_timeout(limit)
            .build()
            .unwrap(),
    )
}

/// Another session's exclusive lock on the fixture's `tasks`: every read waits for it.
async fn lock_tasks(f: &PgFixture) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = f.pg_store().pool().begin().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE \"{}\".tasks IN ACCESS EXCLUSIVE MODE",
        f.schema()
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx
}

#[tokio::test]
async fn the_overview_says_at_least_when_a_count_reaches_its_cap() {
    let f = MemoryFixture::new();
    let store = f.store();
    for k in ["a", "b", "c"] {
        pending(&*store, "t", k).await;
    }
    completed(&*store, "t", "d", b"ok").await;
    let router = dashboard(f.inspector()).count_cap(2).router();
    get(&router, "/", None)
        .await
        .page(StatusCode::OK, r#"data-status="pending">2+<"#)
        .page(StatusCode::OK, r#"data-status="completed">1<"#);
    let roomy = dashboard(f.inspector()).router();
    get(&roomy, "/", None)
        .await
        .page(StatusCode::OK, r#"data-status="pending">3<"#);
}

#[tokio::test]
async fn a_page_size_beyond_the_limit_is_400() {
    let f = MemoryFixture::new();
    let router = dashboard(f.inspector()).router();
    for limit in ["0", "1001", "1000000", "-1", "many"] {
        get(&router, &format!("/tasks?limit={limit}"), None)
            .await
            .page(StatusCode::BAD_REQUEST, "limit");
    }
    get(&router, "/tasks?limit=1000", None)
        .await
        .page(StatusCode::OK, "Tasks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_past_the_store_timeout_is_503_with_retry_after() {
    let f = pg().await;
    pending(&*f.store(), "t", "a").await;
    let router = dashboard(store_with_timeout(&f, Duration::from_millis(300))).router();
    let locker = lock_tasks(&f).await;
    for path in ["/", "/tasks", "/tasks?operation=chat.reply", "/stranded"] {
        let answer = tokio::time::timeout(Duration::from_secs(10), get(&router, path, None))
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer after 10 s"));
        answer.page(StatusCode::SERVICE_UNAVAILABLE, "busy");
        assert_eq!(answer.headers[header::RETRY_AFTER], "1", "{path}");
    }
    locker.rollback().await.unwrap();
    get(&router, "/tasks", None)
        .await
        .page(StatusCode::OK, "chat.reply");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_beyond_the_concurrent_read_limit_are_refused_at_once() {
    let f = pg().await;
    pending(&*f.store(), "t", "a").await;
    let store = store_with_timeout(&f, Duration::from_secs(30));
    let router = dashboard(store).max_concurrent_reads(1).router();
    let locker = lock_tasks(&f).await;
    // The first page takes the only permit and waits on the lock.
    let first = tokio::spawn({
        let router = router.clone();
        async move { get(&router, "/tasks", None).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!first.is_finished(), "the first page waits for the lock");
    for path in ["/", "/tasks", "/stranded"] {
        let refused = tokio::time::timeout(Duration::from_secs(2), get(&router, path, None))
            .await
            .unwrap_or_else(|_| panic!("{path}: queued behind the first page instead of refused"));
        refused.page(StatusCode::SERVICE_UNAVAILABLE, "busy");
        assert_eq!(refused.headers[header::RETRY_AFTER], "1", "{path}");
    }
    // A page that reads no tasks is not gated.
    assert_eq!(get(&router, "/login", None).await.status, StatusCode::OK);
    locker.rollback().await.unwrap();
    first.await.unwrap().page(StatusCode::OK, "chat.reply");
    // The permit is back.
    get(&router, "/tasks", None)
        .await
        .page(StatusCode::OK, "chat.reply");
}
