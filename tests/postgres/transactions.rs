//! `_in` variants inside the application's own transaction: the application's
//! rows and the task's rows commit together or roll back together.

use crate::common;

use std::time::Duration;

use sqlx::Row;
use taskfence::testing::PgFixture;
use taskfence::{Claim, ClaimRequest, Fenced, Response, Status, TaskStore};

async fn host_table(f: &PgFixture, table: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE \"{}\".{table} (id bigint PRIMARY KEY, body text NOT NULL)",
        f.schema()
    )))
    .execute(f.pg_store().pool())
    .await
    .unwrap();
}

async fn host_rows(f: &PgFixture, table: &str) -> i64 {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\".{table}",
        f.schema()
    )))
    .fetch_one(f.pg_store().pool())
    .await
    .unwrap()
    .get(0)
}

use common::new_task;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_and_task_commit_together() {
    let f = common::fixture().await;
    host_table(&f, "messages").await;
    let store = f.pg_store();
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{}\".messages VALUES (1, 'question')",
        f.schema()
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let task = store
        .on(&mut tx)
        .submit(new_task("k1"))
        .await
        .unwrap()
        .into_task();
    // Not visible outside the transaction before it commits.
    assert!(store.get(task.id).await.unwrap().is_none());
    tx.commit().await.unwrap();
    assert_eq!(host_rows(&f, "messages").await, 1);
    assert_eq!(store.get(task.id).await.unwrap().unwrap().status, Status::Pending);
    assert_eq!(
        f.count("handoffs").await,
        1,
        "the handoff committed with the task"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_and_task_roll_back_together() {
    let f = common::fixture().await;
    host_table(&f, "messages").await;
    let store = f.pg_store();
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{}\".messages VALUES (1, 'question')",
        f.schema()
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let task = store
        .on(&mut tx)
        .submit(new_task("k1"))
        .await
        .unwrap()
        .into_task();
    tx.rollback().await.unwrap();
    assert_eq!(host_rows(&f, "messages").await, 0);
    assert!(store.get(task.id).await.unwrap().is_none());
    assert_eq!(f.count("tasks").await + f.count("handoffs").await, 0);
    // The key is free again: the next press of Send creates the task.
    assert!(store.submit(new_task("k1")).await.unwrap().is_created());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_and_completion_commit_together() {
    let f = common::fixture().await;
    host_table(&f, "replies").await;
    let store = f.pg_store();
    let task = store.submit(new_task("k1")).await.unwrap().into_task();
    let Claim::Acquired(lease) = store
        .claim(task.id, ClaimRequest::new("w", Duration::from_secs(30)))
        .await
        .unwrap()
    else {
        panic!("fresh task")
    };
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{}\".replies VALUES (1, 'answer')",
        f.schema()
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let done = store
        .on(&mut tx)
        .complete(lease, Response::from("answer"))
        .await
        .unwrap();
    assert!(done.is_accepted());
    tx.commit().await.unwrap();
    assert_eq!(host_rows(&f, "replies").await, 1);
    let saved = store.get(task.id).await.unwrap().unwrap();
    assert_eq!(
        (saved.status, saved.response),
        (Status::Completed, Some(Response::from("answer")))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_and_completion_roll_back_together() {
    let f = common::fixture().await;
    host_table(&f, "replies").await;
    let store = f.pg_store();
    let task = store.submit(new_task("k1")).await.unwrap().into_task();
    let Claim::Acquired(lease) = store
        .claim(task.id, ClaimRequest::new("w", Duration::from_secs(30)))
        .await
        .unwrap()
    else {
        panic!("fresh task")
    };
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{}\".replies VALUES (1, 'answer')",
        f.schema()
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    assert!(
        store
            .on(&mut tx)
            .complete(lease.clone(), Response::from("answer"))
            .await
            .unwrap()
            .is_accepted()
    );
    tx.rollback().await.unwrap();
    assert_eq!(host_rows(&f, "replies").await, 0);
    let after = store.get(task.id).await.unwrap().unwrap();
    assert_eq!(
        (after.status, after.response, after.version),
        (Status::Running, None, 1),
        "the completion rolled back with the reply"
    );
    let attempts = store.attempts(task.id).await.unwrap();
    assert_eq!(attempts[0].outcome, taskfence::store::AttemptOutcome::Running);
    // The lease is still the current one: the worker can still save.
    assert!(
        store
            .complete(lease, Response::from("answer"))
            .await
            .unwrap()
            .is_accepted()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_completion_holds_the_row_until_the_caller_commits() {
    let f = common::fixture().await;
    let store = f.pg_store().clone();
    let task = store.submit(new_task("k1")).await.unwrap().into_task();
    let Claim::Acquired(lease) = store
        .claim(task.id, ClaimRequest::new("w", Duration::from_secs(30)))
        .await
        .unwrap()
    else {
        panic!("fresh task")
    };
    let mut tx = store.pool().begin().await.unwrap();
    assert!(
        store
            .on(&mut tx)
            .complete(lease.clone(), Response::from("in tx"))
            .await
            .unwrap()
            .is_accepted()
    );
    // A duplicate completion from elsewhere must wait for the row, then see the saved answer.
    let competitor = tokio::spawn({
        let store = store.clone();
        async move { store.complete(lease, Response::from("competitor")).await.unwrap() }
    });
    common::wait_until_blocked(&f, "SELECT 'completed'").await;
    assert!(
        !competitor.is_finished(),
        "the competitor waits for the caller's transaction"
    );
    tx.commit().await.unwrap();
    match competitor.await.unwrap() {
        Fenced::Rejected(taskfence::Rejection::AlreadyCompleted(t)) => {
            assert_eq!(t.response, Some(Response::from("in tx")));
        }
        other => panic!("expected AlreadyCompleted, got {other:?}"),
    }
}
