//! The store's invariants, checked from the database file itself (a
//! connection of its own, plain SQL): what must hold after any run, a
//! crash included.

use std::path::Path;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

/// Panics naming the first invariant the file breaks.
pub(crate) async fn check(path: &Path) {
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .connect()
        .await
        .expect("open the file");
    let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(integrity, "ok", "PRAGMA integrity_check");
    for (what, sql) in [
        (
            "every claim started one attempt (version = attempts)",
            "SELECT count(*) FROM tasks AS t WHERE t.version != (SELECT count(*) FROM attempts AS a WHERE a.task_id = t.id)",
        ),
        (
            "a running task's current attempt is running",
            "SELECT count(*) FROM tasks AS t WHERE t.status = 'running' AND NOT EXISTS
                 (SELECT 1 FROM attempts AS a WHERE a.task_id = t.id AND a.number = t.version AND a.outcome = 'running')",
        ),
        (
            "at most one attempt of a task is running",
            "SELECT count(*) FROM (SELECT task_id FROM attempts WHERE outcome = 'running' GROUP BY task_id HAVING count(*) > 1)",
        ),
        (
            "a completed task has its response and exactly one completed attempt",
            "SELECT count(*) FROM tasks AS t WHERE t.status = 'completed' AND (t.response IS NULL OR
                 (SELECT count(*) FROM attempts AS a WHERE a.task_id = t.id AND a.outcome = 'completed') != 1)",
        ),
        (
            "only a completed task has a response or a completed attempt",
            "SELECT count(*) FROM tasks AS t WHERE t.status != 'completed' AND (t.response IS NOT NULL OR
                 EXISTS (SELECT 1 FROM attempts AS a WHERE a.task_id = t.id AND a.outcome = 'completed'))",
        ),
        (
            "a task that goes out through the outbox has its handoff",
            "SELECT count(*) FROM tasks AS t WHERE t.handoff = 1 AND NOT EXISTS (SELECT 1 FROM handoffs AS h WHERE h.task_id = t.id)",
        ),
        (
            "no attempt, handoff or effect without its task",
            "SELECT (SELECT count(*) FROM attempts WHERE task_id NOT IN (SELECT id FROM tasks))
                  + (SELECT count(*) FROM handoffs WHERE task_id NOT IN (SELECT id FROM tasks))
                  + (SELECT count(*) FROM effects WHERE task_id NOT IN (SELECT id FROM tasks))",
        ),
    ] {
        let broken: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(broken, 0, "{what}: {broken} rows break it");
    }
    conn.close().await.unwrap();
}
