//! Rows to domain values and back: the only place that knows the column types.

use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::PgRow;
use sqlx::postgres::types::PgInterval;

use crate::policy::{AcceptanceRule, OnAmbiguous, RetryPolicy};
use crate::store::{Attempt, AttemptOutcome};
use crate::task::{AttemptId, InputHash, RequestKey, Response, Status, Task, TaskId};

/// A stored value that does not decode into the domain type (a hand-edited row).
#[derive(Debug, thiserror::Error)]
#[error("column {column} holds an unexpected value: {value}")]
struct Corrupt {
    column: &'static str,
    value: String,
}

fn corrupt(column: &'static str, value: impl ToString) -> sqlx::Error {
    sqlx::Error::Decode(Box::new(Corrupt {
        column,
        value: value.to_string(),
    }))
}

/// A duration as PostgreSQL `interval`, in whole microseconds (the server's precision).
pub(crate) fn interval(d: Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
    }
}

/// A duration as nanoseconds, exact (validated durations fit easily).
pub(crate) fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn duration(column: &'static str, ns: i64) -> Result<Duration, sqlx::Error> {
    u64::try_from(ns)
        .map(Duration::from_nanos)
        .map_err(|_| corrupt(column, ns))
}

/// The stored name of [`OnAmbiguous`].
pub(crate) fn on_ambiguous_name(o: OnAmbiguous) -> &'static str {
    match o {
        OnAmbiguous::Retry => "retry",
        OnAmbiguous::Stop => "stop",
    }
}

/// Decodes a row holding the task columns.
pub(crate) fn task(row: &PgRow) -> Result<Task, sqlx::Error> {
    let hash: Vec<u8> = row.try_get("input_hash")?;
    let hash: [u8; 32] = hash
        .try_into()
        .map_err(|h: Vec<u8>| corrupt("input_hash", format!("{} bytes", h.len())))?;
    let status: String = row.try_get("status")?;
    let version: i64 = row.try_get("version")?;
    let max_attempts: i32 = row.try_get("max_attempts")?;
    let on_ambiguous: String = row.try_get("on_ambiguous")?;
    let deadline: Option<i64> = row.try_get("deadline_ns")?;
    let acceptance: String = row.try_get("acceptance")?;
    let policy = RetryPolicy {
        max_attempts: u32::try_from(max_attempts).map_err(|_| corrupt("max_attempts", max_attempts))?,
        initial_backoff: duration("initial_backoff_ns", row.try_get("initial_backoff_ns")?)?,
        max_backoff: duration("max_backoff_ns", row.try_get("max_backoff_ns")?)?,
        multiplier: row.try_get("multiplier")?,
        jitter: row.try_get("jitter")?,
        deadline: deadline.map(|ns| duration("deadline_ns", ns)).transpose()?,
        on_ambiguous: match on_ambiguous.as_str() {
            "retry" => OnAmbiguous::Retry,
            "stop" => OnAmbiguous::Stop,
            other => return Err(corrupt("on_ambiguous", other)),
        },
    };
    Ok(Task {
        id: TaskId::from_uuid(row.try_get("id")?),
        key: RequestKey {
            scope: row.try_get("scope")?,
            operation: row.try_get("operation")?,
            key: row.try_get("request_key")?,
        },
        input_hash: InputHash::from_bytes(hash),
        payload: row.try_get("payload")?,
        status: status.parse::<Status>().map_err(|e| corrupt("status", e))?,
        version: u64::try_from(version).map_err(|_| corrupt("version", version))?,
        policy,
        // Placeholder until the budget columns land: every task's first budget.
        budget_base: 0,
        budget_started_at: row.try_get("created_at")?,
        acceptance: AcceptanceRule::parse(&acceptance).ok_or_else(|| corrupt("acceptance", &acceptance))?,
        lease_until: row.try_get("lease_until")?,
        not_before: row.try_get("not_before")?,
        response: row.try_get::<Option<Vec<u8>>, _>("response")?.map(Response::new),
        last_error: row.try_get("last_error")?,
        created_at: row.try_get("created_at")?,
        finished_at: row.try_get("finished_at")?,
        expires_at: row.try_get("expires_at")?,
    })
}

/// Decodes an attempts row.
pub(crate) fn attempt(row: &PgRow) -> Result<Attempt, sqlx::Error> {
    let number: i32 = row.try_get("number")?;
    let outcome: String = row.try_get("outcome")?;
    Ok(Attempt {
        id: AttemptId::from_uuid(row.try_get("id")?),
        task_id: TaskId::from_uuid(row.try_get("task_id")?),
        number: u32::try_from(number).map_err(|_| corrupt("number", number))?,
        worker: row.try_get("worker")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        outcome: AttemptOutcome::parse(&outcome).ok_or_else(|| corrupt("outcome", &outcome))?,
        operation_id: row.try_get("operation_id")?,
        error: row.try_get("error")?,
    })
}
