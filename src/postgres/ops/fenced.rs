//! The fenced write: a guarded statement, and when it matches no row, one
//! re-read of the row with the store clock, classified by the same
//! [`rules`] function the guard applies.

use sqlx::Row;
use sqlx::postgres::{PgArguments, PgConnection, PgRow};
use time::OffsetDateTime;

use crate::backend::rules::{self, LeaseCheck};
use crate::error::{Error, Result};
use crate::store::{Fenced, Lease, Rejection};
use crate::task::{AttemptId, Task, TaskId};

use crate::postgres::db;
use crate::postgres::row;
use crate::postgres::sql::Statements;

/// How often a write that was refused, then found acceptable on the re-read,
/// is tried again before giving up. Never reached in practice: a refused
/// fenced write cannot become acceptable (versions only grow, the clock only
/// moves forward); it bounds the loop regardless.
pub(super) const RACE_RETRIES: usize = 4;

/// A statement with its parameters bound, ready to run.
pub(super) type Bound<'q> = sqlx::query::Query<'q, sqlx::Postgres, PgArguments>;

/// A fenced write kept missing while its re-read said it should pass.
#[derive(Debug, thiserror::Error)]
#[error("{0}: the row kept changing between the write and its re-read")]
pub(super) struct Raced(pub(super) &'static str);

/// Runs a fenced write of `lease`: `query` builds the statement (again
/// for each try), `accepted` reads the row it returns. Zero rows is not an
/// error: one re-read of the row, classified by [`rules::fence`], says why
/// it was refused; should the fence pass on that read (the row changed
/// between the two), the write is tried again.
pub(super) async fn fenced_write<'q, T>(
    sql: &Statements,
    conn: &mut PgConnection,
    op: &'static str,
    lease: &Lease,
    query: impl Fn() -> Bound<'q> + Send,
    accepted: impl Fn(PgRow) -> Result<T> + Send,
) -> Result<Fenced<T>> {
    checked_write(sql, conn, op, rules::fence, lease, query, accepted).await
}

/// [`fenced_write`] for a write that `check` decides
/// (a completion: [`rules::accept`]), so the re-read classifies a refusal
/// by the same rule the statement's guard applies.
pub(super) async fn checked_write<'q, T>(
    sql: &Statements,
    conn: &mut PgConnection,
    op: &'static str,
    check: LeaseCheck,
    lease: &Lease,
    query: impl Fn() -> Bound<'q> + Send,
    accepted: impl Fn(PgRow) -> Result<T> + Send,
) -> Result<Fenced<T>> {
    for _ in 0..RACE_RETRIES {
        if let Some(row) = query().fetch_optional(&mut *conn).await.map_err(db)? {
            return accepted(row).map(Fenced::Accepted);
        }
        if let Some(rejection) = rejection(sql, conn, check, lease).await? {
            return Ok(Fenced::Rejected(rejection));
        }
    }
    Err(Error::storage(Raced(op)))
}

/// The row and the store clock, read together with a fresh snapshot.
pub(super) async fn read(
    sql: &Statements,
    conn: &mut PgConnection,
    id: TaskId,
) -> Result<Option<(Task, OffsetDateTime)>> {
    let Some(row) = sql
        .read
        .query()
        .bind(id.as_uuid())
        .fetch_optional(conn)
        .await
        .map_err(db)?
    else {
        return Ok(None);
    };
    let task = row::task(&row).map_err(db)?;
    let now = row.try_get("store_now").map_err(db)?;
    Ok(Some((task, now)))
}

/// Why a write of `lease` matched no row: one read (`read_lease`: the row,
/// the store clock and the attempt recorded at the lease's version),
/// classified by `check` and the attempt ([`rules::check_lease`]). `None`
/// means the check passes now (the caller writes again).
pub(super) async fn rejection(
    sql: &Statements,
    conn: &mut PgConnection,
    check: LeaseCheck,
    lease: &Lease,
) -> Result<Option<Rejection>> {
    let row = sql
        .read_lease
        .query()
        .bind(lease.task_id().as_uuid())
        .bind(version(lease))
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)?
        .ok_or(Error::NotFound(lease.task_id()))?;
    let task = row::task(&row).map_err(db)?;
    let now: OffsetDateTime = row.try_get("store_now").map_err(db)?;
    let recorded: Option<uuid::Uuid> = row.try_get("recorded_attempt").map_err(db)?;
    let recorded = recorded.map(AttemptId::from_uuid);
    let rejection = rules::check_lease(check, &task, lease, recorded, now).err();
    if let Some(r) = &rejection {
        tracing::debug!(rejection = %r, "fenced write rejected");
    }
    Ok(rejection)
}

pub(super) fn version(lease: &Lease) -> i64 {
    i64::try_from(lease.version()).unwrap_or(i64::MAX)
}
