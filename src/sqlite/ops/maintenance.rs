//! Scans and the outbox: due, purge_expired, redispatch, and the
//! dispatcher's take and mark.

use sqlx::{Row, SqliteConnection};
use time::OffsetDateTime;

use crate::error::Result;
use crate::task::TaskId;
use crate::wire::Stamp;

use super::super::{db, row, sql};

/// Tasks whose lease expired or whose backoff passed at `now`, by when.
pub(crate) async fn due(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    limit: usize,
) -> Result<Vec<TaskId>> {
    sqlx::query(sql::DUE)
        .bind(row::at(now))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(conn)
        .await
        .map_err(db)?
        .iter()
        .map(|r| r.try_get(0).map(TaskId::from_uuid))
        .collect::<Result<_, _>>()
        .map_err(db)
}

/// Removes up to `limit` terminal tasks past their retention, with every row of theirs.
pub(crate) async fn purge_expired(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    limit: usize,
) -> Result<u64> {
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar(sql::EXPIRED)
        .bind(row::at(now))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?;
    for id in &ids {
        for statement in sql::PURGE {
            sqlx::query(statement)
                .bind(id)
                .execute(&mut *conn)
                .await
                .map_err(db)?;
        }
    }
    Ok(ids.len() as u64)
}

/// A fresh handoff for each of `ids` still pending that goes out through the outbox.
pub(crate) async fn redispatch(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    ids: &[TaskId],
) -> Result<u64> {
    let mut written = 0;
    for id in ids {
        written += sqlx::query(sql::REDISPATCH)
            .bind(id.as_uuid())
            .bind(row::at(now))
            .execute(&mut *conn)
            .await
            .map_err(db)?
            .rows_affected();
    }
    Ok(written)
}

/// Up to `limit` unpublished handoffs, oldest first, each with its stamp.
pub(crate) async fn take_handoffs(conn: &mut SqliteConnection, limit: usize) -> Result<Vec<(Stamp, i64)>> {
    sqlx::query(sql::TAKE_HANDOFFS)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(conn)
        .await
        .map_err(db)?
        .iter()
        .map(|r| {
            let id = TaskId::from_uuid(r.try_get(1)?);
            // No task (a stray handoff): version 0, and the claim finds nothing.
            let version = r.try_get::<Option<i64>, _>(2)?.unwrap_or(0);
            Ok((Stamp::new(id, u64::try_from(version).unwrap_or(0)), r.try_get(0)?))
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(db)
}

/// Marks the handoffs published at `now`.
pub(crate) async fn mark_published(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    ids: &[i64],
) -> Result<()> {
    for id in ids {
        sqlx::query(sql::MARK_PUBLISHED)
            .bind(id)
            .bind(row::at(now))
            .execute(&mut *conn)
            .await
            .map_err(db)?;
    }
    Ok(())
}
