//! The operator's reads, bounded: each runs in its own read-only transaction
//! under `SET LOCAL statement_timeout` (a timeout is
//! [`Error::ReadTimeout`], not a hang), listings decode summaries (no
//! payloads), and counts stop at a cap.

use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{Connection, PgConnection, Postgres, Row, Transaction};

use crate::error::{Error, Result};
use crate::inspect::{CappedCounts, Count, STATUSES, TaskSummary};
use crate::task::Status;

use super::sql::Statements;
use super::{db, row};

/// How long one operator read may run by default: an overview or a page
/// answers in milliseconds on an index; five seconds is a scan gone wrong.
///
/// ```
/// assert_eq!(taskfence::postgres::DEFAULT_READ_TIMEOUT, std::time::Duration::from_secs(5));
/// ```
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// PostgreSQL's `query_canceled`: a statement timeout (or a cancel request).
const QUERY_CANCELED: &str = "57014";

/// Opens the read's transaction on `conn`, with `limit` as its
/// statement timeout (`SET LOCAL`: it ends with the transaction, so the
/// pooled connection keeps its own setting).
pub(super) async fn begin(conn: &mut PgConnection, limit: Duration) -> Result<Transaction<'_, Postgres>> {
    let mut tx = conn.begin().await.map_err(db)?;
    sqlx::query("SELECT set_config('statement_timeout', $1, true)")
        .bind(format!("{}ms", limit.as_millis().max(1)))
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    Ok(tx)
}

/// Ends the read: commits after an answer; after a failure, lets the
/// transaction roll back and names a statement timeout as such.
pub(super) async fn finish<T>(
    tx: Transaction<'_, Postgres>,
    answer: Result<T>,
    limit: Duration,
) -> Result<T> {
    match answer {
        Ok(value) => {
            tx.commit().await.map_err(db)?;
            Ok(value)
        }
        Err(err) => Err(timed_out(err, limit)),
    }
}

/// [`Error::ReadTimeout`] for a statement the server cancelled; any other error as it is.
fn timed_out(err: Error, limit: Duration) -> Error {
    let canceled = match &err {
        Error::Storage(source) => source
            .downcast_ref::<sqlx::Error>()
            .and_then(|e| e.as_database_error())
            .and_then(|e| e.code())
            .is_some_and(|code| code == QUERY_CANCELED),
        _ => false,
    };
    if canceled {
        Error::ReadTimeout { limit }
    } else {
        err
    }
}

/// A listing's rows as summaries.
pub(super) fn summaries(rows: &[PgRow]) -> Result<Vec<TaskSummary>> {
    rows.iter().map(|r| row::summary(r).map_err(db)).collect()
}

/// [`Inspect::counts_up_to`](crate::inspect::Inspect::counts_up_to): all
/// scopes from `tasks_status_id` (each status up to `cap`), one scope from
/// its newest `cap` tasks in `tasks_scope_id` (every status
/// [`Count::AtLeast`] when the scope holds `cap` or more).
pub(super) async fn counts_up_to(
    sql: &Statements,
    conn: &mut PgConnection,
    scope: Option<&str>,
    cap: u64,
) -> Result<CappedCounts> {
    let limit = i64::try_from(cap).unwrap_or(i64::MAX);
    let rows = match scope {
        Some(scope) => sql.counts_up_to_scope.query().bind(scope).bind(limit),
        None => sql.counts_up_to.query().bind(limit),
    }
    .fetch_all(conn)
    .await
    .map_err(db)?;
    let mut found = [0u64; 5];
    for row in rows {
        let status: String = row.try_get("status").map_err(db)?;
        let n: i64 = row.try_get("n").map_err(db)?;
        let status = status
            .parse::<Status>()
            .map_err(|e| Error::storage(sqlx::Error::Decode(Box::new(e))))?;
        let slot = STATUSES.iter().position(|s| *s == status).unwrap_or_default();
        found[slot] = u64::try_from(n).unwrap_or_default();
    }
    let mut counts = CappedCounts::default();
    // One scope is sampled as a whole: its newest `cap` tasks. When the
    // sample is full, every status may have more beyond it.
    let sample_full = scope.is_some() && found.iter().sum::<u64>() >= cap;
    for (status, n) in STATUSES.into_iter().zip(found) {
        let count = if sample_full {
            Count::AtLeast(n)
        } else {
            Count::up_to(n, cap)
        };
        counts.set(status, count);
    }
    Ok(counts)
}
