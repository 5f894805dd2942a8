//! One task's reads.

use sqlx::SqliteConnection;

use crate::error::Result;
use crate::store::Attempt;
use crate::task::{RequestKey, Task, TaskId};

use super::super::{db, row, sql};

/// The task, if there is one.
pub(crate) async fn get(conn: &mut SqliteConnection, id: TaskId) -> Result<Option<Task>> {
    super::row_io::load(conn, id).await
}

/// The task submitted under `key`, if there is one.
pub(crate) async fn find(conn: &mut SqliteConnection, key: &RequestKey) -> Result<Option<Task>> {
    sqlx::query(sql::TASK_BY_KEY)
        .bind(&key.scope)
        .bind(&key.operation)
        .bind(&key.key)
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .map(|r| row::task(&r))
        .transpose()
        .map_err(db)
}

/// The task's attempts, oldest first.
pub(crate) async fn attempts(conn: &mut SqliteConnection, id: TaskId) -> Result<Vec<Attempt>> {
    sqlx::query(sql::ATTEMPTS)
        .bind(id.as_uuid())
        .fetch_all(conn)
        .await
        .map_err(db)?
        .iter()
        .map(row::attempt)
        .collect::<Result<_, _>>()
        .map_err(db)
}
