//! `purge_expired` on PostgreSQL takes a task's attempts and handoff with it:
//! no foreign key cascades (migration 0004), so the statement deletes them itself.

use crate::common;

use std::time::Duration;

use sqlx::Row;
use taskfence::testing::{Fixture, PgFixture};
use taskfence::{Failure, Lease, NewTask, Response, RetryPolicy, TaskId, TaskStore};

use common::{acquire, fail_accepted, new_task};

const DAY: Duration = Duration::from_secs(24 * 3600);

async fn submit(f: &PgFixture, task: NewTask) -> TaskId {
    f.pg_store().submit(task).await.unwrap().into_task().id
}

/// Completes `lease` with "ok"; panics unless accepted.
async fn complete(f: &PgFixture, lease: Lease) {
    let saved = f.pg_store().complete(lease, Response::from("ok")).await.unwrap();
    assert!(saved.is_accepted(), "{saved:?}");
}

/// Rows of `table` whose task is gone.
async fn orphans(f: &PgFixture, table: &str) -> i64 {
    let s = f.schema();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{s}\".{table} AS c
         WHERE NOT EXISTS (SELECT 1 FROM \"{s}\".tasks AS t WHERE t.id = c.task_id)"
    )))
    .fetch_one(f.pg_store().pool())
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_leaves_no_orphan_attempts_or_handoffs() {
    let f = common::fixture().await;
    let store = f.pg_store();
    let retry_fast = RetryPolicy::default()
        .jitter(0.0)
        .initial_backoff(Duration::from_secs(1));

    // Expired after a day: completed on its second attempt, completed on its
    // first, failed for good.
    let retried = submit(&f, new_task("retried").retention(DAY).policy(retry_fast)).await;
    fail_accepted(
        store,
        acquire(store, retried, "w").await,
        Failure::retryable("busy"),
    )
    .await;
    f.advance(Duration::from_secs(2)).await;
    complete(&f, acquire(store, retried, "w").await).await;
    let done = submit(&f, new_task("done").retention(DAY)).await;
    complete(&f, acquire(store, done, "w").await).await;
    let failed = submit(&f, new_task("failed").retention(DAY)).await;
    fail_accepted(store, acquire(store, failed, "w").await, Failure::permanent("no")).await;
    // Kept: retention not over, and live work.
    let kept = submit(&f, new_task("kept").retention(30 * DAY)).await;
    complete(&f, acquire(store, kept, "w").await).await;
    let pending = submit(&f, new_task("pending").retention(DAY)).await;
    // Each task's latest attempt is in its row; the journal holds the
    // retried task's first.
    assert_eq!(
        (
            f.count("tasks").await,
            f.count("attempts").await,
            f.count("handoffs").await
        ),
        (5, 1, 5)
    );

    f.advance(DAY + Duration::from_secs(1)).await;
    assert_eq!(store.purge_expired(2).await.unwrap(), 2, "the limit holds");
    assert_eq!(
        store.purge_expired(100).await.unwrap(),
        1,
        "the third expired task"
    );
    assert_eq!(store.purge_expired(100).await.unwrap(), 0);

    assert_eq!(
        (orphans(&f, "attempts").await, orphans(&f, "handoffs").await),
        (0, 0)
    );
    for id in [retried, done, failed] {
        assert!(store.get(id).await.unwrap().is_none());
        assert!(store.attempts(id).await.unwrap().is_empty());
    }
    assert_eq!(
        store.attempts(kept).await.unwrap().len(),
        1,
        "other tasks' rows stay"
    );
    assert!(store.get(pending).await.unwrap().is_some());
    assert_eq!(
        (
            f.count("tasks").await,
            f.count("attempts").await,
            f.count("handoffs").await
        ),
        (2, 0, 2)
    );
}
