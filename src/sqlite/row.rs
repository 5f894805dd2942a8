//! Rows to domain values and back: the only place that knows the column
//! types. Instants are INTEGER nanoseconds since the Unix epoch (UTC), ids
//! 16-byte BLOBs, durations INTEGER nanoseconds.

use std::time::Duration;

use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use time::OffsetDateTime;

use crate::effect::{Effect, EffectState};
use crate::inspect::TaskSummary;
use crate::policy::{AcceptanceRule, OnAmbiguous, RetryPolicy};
use crate::store::{Attempt, AttemptOutcome, Reopening};
use crate::task::{AttemptId, InputHash, RequestKey, Response, Status, Task, TaskId};
use crate::throttle::{BucketState, ConcurrencyKey, RateBucket, TaskLimits};

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

/// An instant as stored: nanoseconds since the Unix epoch. Every instant the
/// store handles lies well within the ±292 years an `i64` spans.
pub(crate) fn at(t: OffsetDateTime) -> i64 {
    i64::try_from(t.unix_timestamp_nanos()).unwrap_or(i64::MAX)
}

/// [`at`] of an optional instant.
pub(crate) fn at_opt(t: Option<OffsetDateTime>) -> Option<i64> {
    t.map(at)
}

fn instant(column: &'static str, ns: i64) -> Result<OffsetDateTime, sqlx::Error> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ns)).map_err(|_| corrupt(column, ns))
}

fn get_at(row: &SqliteRow, column: &'static str) -> Result<OffsetDateTime, sqlx::Error> {
    instant(column, row.try_get(column)?)
}

fn get_at_opt(row: &SqliteRow, column: &'static str) -> Result<Option<OffsetDateTime>, sqlx::Error> {
    row.try_get::<Option<i64>, _>(column)?
        .map(|ns| instant(column, ns))
        .transpose()
}

/// A duration as nanoseconds (validated durations fit easily).
pub(crate) fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn duration(column: &'static str, ns: i64) -> Result<Duration, sqlx::Error> {
    u64::try_from(ns)
        .map(Duration::from_nanos)
        .map_err(|_| corrupt(column, ns))
}

/// A count or version as stored (SQLite integers are signed 64-bit).
pub(crate) fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn unsigned(column: &'static str, n: i64) -> Result<u64, sqlx::Error> {
    u64::try_from(n).map_err(|_| corrupt(column, n))
}

fn small(column: &'static str, n: i64) -> Result<u32, sqlx::Error> {
    u32::try_from(n).map_err(|_| corrupt(column, n))
}

/// The stored name of [`OnAmbiguous`].
pub(crate) fn on_ambiguous_name(o: OnAmbiguous) -> &'static str {
    match o {
        OnAmbiguous::Retry => "retry",
        OnAmbiguous::Stop => "stop",
    }
}

/// Decodes a row holding every task column.
pub(crate) fn task(row: &SqliteRow) -> Result<Task, sqlx::Error> {
    let payload: Vec<u8> = row.try_get("payload")?;
    let response = row.try_get::<Option<Vec<u8>>, _>("response")?.map(Response::new);
    Ok(summary(row)?.into_task(payload, response))
}

/// Decodes a row holding the summary columns (the task's without payload and response).
pub(crate) fn summary(row: &SqliteRow) -> Result<TaskSummary, sqlx::Error> {
    let hash: Vec<u8> = row.try_get("input_hash")?;
    let hash: [u8; 32] = hash
        .try_into()
        .map_err(|h: Vec<u8>| corrupt("input_hash", format!("{} bytes", h.len())))?;
    let status: String = row.try_get("status")?;
    let on_ambiguous: String = row.try_get("on_ambiguous")?;
    let acceptance: String = row.try_get("acceptance")?;
    let deadline: Option<i64> = row.try_get("deadline_ns")?;
    let policy = RetryPolicy {
        max_attempts: small("max_attempts", row.try_get("max_attempts")?)?,
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
    Ok(TaskSummary {
        id: TaskId::from_uuid(row.try_get("id")?),
        key: RequestKey {
            scope: row.try_get("scope")?,
            operation: row.try_get("operation")?,
            key: row.try_get("request_key")?,
        },
        input_hash: InputHash::from_bytes(hash),
        status: status.parse::<Status>().map_err(|e| corrupt("status", e))?,
        version: unsigned("version", row.try_get("version")?)?,
        policy,
        budget_base: unsigned("budget_base", row.try_get("budget_base")?)?,
        budget_started_at: get_at(row, "budget_started_at")?,
        acceptance: AcceptanceRule::parse(&acceptance).ok_or_else(|| corrupt("acceptance", &acceptance))?,
        lease_until: get_at_opt(row, "lease_until")?,
        not_before: get_at_opt(row, "not_before")?,
        last_error: row.try_get("last_error")?,
        created_at: get_at(row, "created_at")?,
        finished_at: get_at_opt(row, "finished_at")?,
        expires_at: get_at(row, "expires_at")?,
        trace_context: row
            .try_get::<Option<String>, _>("trace_context")?
            .map(|cx| cx.parse().map_err(|e| corrupt("trace_context", e)))
            .transpose()?,
        limits: limits(row)?,
    })
}

/// The limits a task row names (its concurrency key with its limit, its rate bucket).
fn limits(row: &SqliteRow) -> Result<TaskLimits, sqlx::Error> {
    let key: Option<String> = row.try_get("concurrency_key")?;
    let limit: Option<i64> = row.try_get("concurrency_limit")?;
    let concurrency = match (key, limit) {
        (Some(key), Some(limit)) => Some(ConcurrencyKey::new(key, small("concurrency_limit", limit)?)),
        (None, None) => None,
        (Some(key), None) => return Err(corrupt("concurrency_limit", format!("NULL for key {key}"))),
        (None, Some(limit)) => return Err(corrupt("concurrency_key", format!("NULL with limit {limit}"))),
    };
    Ok(TaskLimits {
        concurrency,
        bucket: row.try_get("rate_bucket")?,
    })
}

/// Decodes a `buckets` row.
pub(crate) fn bucket(row: &SqliteRow) -> Result<BucketState, sqlx::Error> {
    let name: String = row.try_get("name")?;
    let bucket = RateBucket::new(
        name,
        small("buckets.rate", row.try_get("rate")?)?,
        duration("buckets.period_ns", row.try_get("period_ns")?)?,
    )
    .burst(small("buckets.burst", row.try_get("burst")?)?);
    Ok(BucketState {
        bucket,
        schedule: get_at_opt(row, "schedule")?,
    })
}

/// Decodes an `attempts` row.
pub(crate) fn attempt(row: &SqliteRow) -> Result<Attempt, sqlx::Error> {
    let outcome: String = row.try_get("outcome")?;
    Ok(Attempt {
        id: AttemptId::from_uuid(row.try_get("id")?),
        task_id: TaskId::from_uuid(row.try_get("task_id")?),
        number: small("number", row.try_get("number")?)?,
        worker: row.try_get("worker")?,
        started_at: get_at(row, "started_at")?,
        finished_at: get_at_opt(row, "finished_at")?,
        outcome: AttemptOutcome::parse(&outcome).ok_or_else(|| corrupt("outcome", &outcome))?,
        operation_id: row.try_get("operation_id")?,
        error: row.try_get("error")?,
    })
}

/// Decodes a `reopenings` row.
pub(crate) fn reopening(row: &SqliteRow) -> Result<Reopening, sqlx::Error> {
    let from: String = row.try_get("from_status")?;
    Ok(Reopening {
        task_id: TaskId::from_uuid(row.try_get("task_id")?),
        number: small("reopenings.number", row.try_get("number")?)?,
        at: get_at(row, "at")?,
        by: row.try_get("by")?,
        reason: row.try_get("reason")?,
        from: from.parse::<Status>().map_err(|e| corrupt("from_status", e))?,
        version: unsigned("reopenings.version", row.try_get("version")?)?,
    })
}

/// Decodes a `handoffs` row's times.
pub(crate) fn handoff(row: &SqliteRow) -> Result<crate::inspect::Handoff, sqlx::Error> {
    Ok(crate::inspect::Handoff::new(
        get_at(row, "created_at")?,
        get_at_opt(row, "published_at")?,
    ))
}

/// Decodes an `effects` row.
pub(crate) fn effect(row: &SqliteRow) -> Result<Effect, sqlx::Error> {
    let name: String = row.try_get("name")?;
    let state: String = row.try_get("state")?;
    let mut effect = Effect::intended(
        TaskId::from_uuid(row.try_get("task_id")?),
        &name,
        unsigned("effects.version", row.try_get("version")?)?,
        small("effects.attempt", row.try_get("attempt")?)?,
        get_at(row, "intended_at")?,
    );
    effect.state = EffectState::parse(&state).ok_or_else(|| corrupt("effects.state", &state))?;
    effect.reference = row.try_get("reference")?;
    effect.error = row.try_get("error")?;
    effect.ambiguous = small("effects.ambiguous", row.try_get("ambiguous")?)?;
    effect.created_at = get_at(row, "created_at")?;
    effect.settled_at = get_at_opt(row, "settled_at")?;
    Ok(effect)
}
