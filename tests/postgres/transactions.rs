//! `PgStore::on(&mut tx)`: every operation inside the application's own transaction: the application's
//! rows and the task's rows commit together or roll back together.

use crate::common;

use std::time::Duration;

use sqlx::Row;
use taskfence::testing::{Fixture, PgFixture};
use taskfence::{ClaimRequest, Fenced, Response, Status, TaskStore};

async fn host_table(f: &PgFixture, table: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE \"{}\".{table} (id bigint PRIMARY KEY, body text NOT NULL)",
        f.schema()
    )))
    .execute(f.pg_store().pool())
    .await
    .unwrap();
}

/// One row of the application's own, written on its transaction.
async fn host_row(f: &PgFixture, conn: &mut sqlx::PgConnection, table: &str, body: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{}\".{table} VALUES (1, $1)",
        f.schema()
    )))
    .bind(body)
    .execute(conn)
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
    host_row(&f, &mut tx, "messages", "question").await;
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
    host_row(&f, &mut tx, "messages", "question").await;
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
    let lease = common::acquire(store, task.id, "w").await;
    let mut tx = store.pool().begin().await.unwrap();
    host_row(&f, &mut tx, "replies", "answer").await;
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
    let lease = common::acquire(store, task.id, "w").await;
    let mut tx = store.pool().begin().await.unwrap();
    host_row(&f, &mut tx, "replies", "answer").await;
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
    let lease = common::acquire(&store, task.id, "w").await;
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

/// What a rollback must leave exactly as it was: the task row, its attempts,
/// its story (reopenings, handoffs) and every table's row count.
async fn snapshot(f: &PgFixture, id: taskfence::TaskId) -> String {
    use taskfence::inspect::Inspect;
    let store = f.pg_store();
    let counts: Vec<i64> = futures_counts(f).await;
    format!(
        "{:?}\n{:?}\n{counts:?}",
        store.get(id).await.unwrap(),
        store.story(id).await.unwrap()
    )
}

async fn futures_counts(f: &PgFixture) -> Vec<i64> {
    let mut counts = Vec::new();
    for table in ["tasks", "attempts", "handoffs", "reopenings"] {
        counts.push(f.count(table).await);
    }
    counts
}

/// Runs `op` on the caller's transaction (`on`: `store.on(&mut tx)`), where
/// it must take effect (`check` reads its answer and the task as the
/// transaction sees it), rolls back, and checks the store is exactly as before.
macro_rules! rolls_back {
    ($f:expr, $id:expr, $name:literal, |$on:ident| $op:expr, |$answer:pat_param, $task:ident| $check:expr) => {{
        let before = snapshot($f, $id).await;
        let store = $f.pg_store();
        let mut tx = store.pool().begin().await.unwrap();
        let answer = {
            let $on = store.on(&mut tx);
            $op.await.unwrap_or_else(|e| panic!("{}: {e}", $name))
        };
        let $task = store.on(&mut tx).get($id).await.unwrap();
        let $answer = &answer;
        assert!($check, "{}: took effect inside the transaction", $name);
        tx.rollback().await.unwrap();
        assert_eq!(
            snapshot($f, $id).await,
            before,
            "{}: rolled back with the transaction",
            $name
        );
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_on_the_callers_transaction_rolls_back_with_it() {
    use taskfence::store::ReopenRequest;
    use taskfence::{Failure, Retry, RetryPolicy};

    let f = common::fixture().await;
    let store = f.pg_store();
    let lease_for = Duration::from_secs(30);
    let request = || ClaimRequest::new("w", lease_for);

    // submit: the new task (and its handoff) is gone after the rollback.
    let ghost = {
        let mut tx = store.pool().begin().await.unwrap();
        let task = store
            .on(&mut tx)
            .submit(new_task("rolled-back"))
            .await
            .unwrap()
            .into_task();
        assert!(
            store.on(&mut tx).get(task.id).await.unwrap().is_some(),
            "submit: visible inside"
        );
        assert!(
            store.on(&mut tx).find(&task.key).await.unwrap().is_some(),
            "find: visible inside"
        );
        tx.rollback().await.unwrap();
        task
    };
    assert!(store.get(ghost.id).await.unwrap().is_none(), "submit rolled back");
    assert_eq!(
        futures_counts(&f).await,
        [0, 0, 0, 0],
        "nothing of the submission stays"
    );

    // claim, then claim_many
    let pending = store
        .submit(new_task("pending").policy(RetryPolicy::default().max_attempts(2)))
        .await
        .unwrap()
        .into_task();
    rolls_back!(
        &f,
        pending.id,
        "claim",
        |on| on.claim(pending.id, request()),
        |c, t| { c.is_acquired() && t.is_some_and(|t| t.version == 1) }
    );
    rolls_back!(
        &f,
        pending.id,
        "claim_many",
        |on| on.claim_many(&[pending.id], request()),
        |c, t| { c[0].is_acquired() && t.is_some_and(|t| t.version == 1) }
    );
    rolls_back!(
        &f,
        pending.id,
        "claim_next",
        |on| on.claim_next(taskfence::ClaimNext::new("w", lease_for, 4)),
        |c, t| { c.len() == 1 && t.is_some_and(|t| t.version == 1) }
    );

    // the fenced writes of a held lease
    let lease = common::acquire(store, pending.id, "w").await;
    let mut renewed = lease.clone();
    rolls_back!(
        &f,
        pending.id,
        "renew",
        |on| on.renew(&mut renewed, Duration::from_secs(600)),
        |r, t| { r.is_accepted() && t.is_some_and(|t| t.lease_until == Some(renewed.expires_at())) }
    );
    let mut held = [lease.clone()];
    rolls_back!(
        &f,
        pending.id,
        "renew_many",
        |on| on.renew_many(&mut held, Duration::from_secs(900)),
        |r, t| { r[0].is_accepted() && t.is_some_and(|t| t.lease_until == Some(held[0].expires_at())) }
    );
    rolls_back!(
        &f,
        pending.id,
        "record_operation",
        |on| on.record_operation(&lease, "op-1"),
        |r, _t| { r.is_accepted() }
    );
    rolls_back!(
        &f,
        pending.id,
        "complete",
        |on| on.complete(lease.clone(), Response::from("a")),
        |r, t| { r.is_accepted() && t.is_some_and(|t| t.status == Status::Completed) }
    );
    rolls_back!(
        &f,
        pending.id,
        "complete_many",
        |on| on.complete_many(vec![(lease.clone(), Response::from("a"))]),
        |r, t| {
            matches!(&r[0], Ok(x) if x.is_accepted()) && t.is_some_and(|t| t.status == Status::Completed)
        }
    );
    rolls_back!(
        &f,
        pending.id,
        "fail",
        |on| on.fail(lease.clone(), Failure::retryable("429")),
        |r, t| {
            matches!(r, Fenced::Accepted(Retry::Scheduled { .. }))
                && t.is_some_and(|t| t.status == Status::Pending)
        }
    );
    rolls_back!(
        &f,
        pending.id,
        "release",
        |on| on.release(lease.clone()),
        |r, t| { r.is_accepted() && t.is_some_and(|t| t.status == Status::Pending) }
    );
    rolls_back!(
        &f,
        pending.id,
        "cancel",
        |on| on.cancel(pending.id, "stop"),
        |r, t| { r.is_accepted() && t.is_some_and(|t| t.status == Status::Cancelled) }
    );

    // reopen a cancelled task; redispatch a never-claimed one
    let cancelled = store.submit(new_task("cancelled")).await.unwrap().into_task();
    assert!(store.cancel(cancelled.id, "stop").await.unwrap().is_accepted());
    rolls_back!(
        &f,
        cancelled.id,
        "reopen",
        |on| on.reopen(cancelled.id, ReopenRequest::new("ops", "again")),
        |r, t| { r.is_accepted() && t.is_some_and(|t| t.status == Status::Pending) }
    );
    let waiting = store.submit(new_task("waiting")).await.unwrap().into_task();
    let handoffs = f.count("handoffs").await;
    rolls_back!(
        &f,
        waiting.id,
        "redispatch",
        |on| on.redispatch(&[waiting.id]),
        |n, _t| *n == 1
    );
    assert_eq!(f.count("handoffs").await, handoffs);

    // purge_expired: a terminal task past its retention, purged inside only
    let expiring = store
        .submit(new_task("expiring").retention(Duration::from_secs(1)))
        .await
        .unwrap()
        .into_task();
    assert!(store.cancel(expiring.id, "stop").await.unwrap().is_accepted());
    f.advance(Duration::from_secs(2)).await;
    rolls_back!(
        &f,
        expiring.id,
        "purge_expired",
        |on| on.purge_expired(10),
        |n, t| *n == 1 && t.is_none()
    );

    // The reads see the transaction's own writes; the lease still saves afterwards.
    assert!(
        store
            .complete(lease, Response::from("kept"))
            .await
            .unwrap()
            .is_accepted()
    );
}
