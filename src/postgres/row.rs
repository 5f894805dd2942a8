//! Rows to domain values and back: the only place that knows the column types.

use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::PgRow;
use sqlx::postgres::types::PgInterval;
use time::OffsetDateTime;

use crate::effect::{Effect, EffectState};
use crate::inspect::{Handoff, Story, TaskSummary};
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
    let payload: Vec<u8> = row.try_get("payload")?;
    let response = row.try_get::<Option<Vec<u8>>, _>("response")?.map(Response::new);
    Ok(summary(row)?.into_task(payload, response))
}

/// Decodes a row holding the summary columns (the task's without payload and response).
pub(crate) fn summary(row: &PgRow) -> Result<TaskSummary, sqlx::Error> {
    let hash: Vec<u8> = row.try_get("input_hash")?;
    let hash: [u8; 32] = hash
        .try_into()
        .map_err(|h: Vec<u8>| corrupt("input_hash", format!("{} bytes", h.len())))?;
    let status: String = row.try_get("status")?;
    let version: i64 = row.try_get("version")?;
    let budget_base: i64 = row.try_get("budget_base")?;
    let max_attempts: i32 = row.try_get("max_attempts")?;
    let on_ambiguous: String = row.try_get("on_ambiguous")?;
    let deadline: Option<i64> = row.try_get("deadline_ns")?;
    let acceptance: String = row.try_get("acceptance")?;
    let created_at: OffsetDateTime = row.try_get("created_at")?;
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
    Ok(TaskSummary {
        id: TaskId::from_uuid(row.try_get("id")?),
        key: RequestKey {
            scope: row.try_get("scope")?,
            operation: row.try_get("operation")?,
            key: row.try_get("request_key")?,
        },
        input_hash: InputHash::from_bytes(hash),
        status: status.parse::<Status>().map_err(|e| corrupt("status", e))?,
        version: u64::try_from(version).map_err(|_| corrupt("version", version))?,
        policy,
        budget_base: u64::try_from(budget_base).map_err(|_| corrupt("budget_base", budget_base))?,
        // NULL on rows written before migration 0003: their first budget.
        budget_started_at: row
            .try_get::<Option<OffsetDateTime>, _>("budget_started_at")?
            .unwrap_or(created_at),
        acceptance: AcceptanceRule::parse(&acceptance).ok_or_else(|| corrupt("acceptance", &acceptance))?,
        lease_until: row.try_get("lease_until")?,
        not_before: row.try_get("not_before")?,
        last_error: row.try_get("last_error")?,
        created_at,
        finished_at: row.try_get("finished_at")?,
        expires_at: row.try_get("expires_at")?,
        // NULL on rows written before migration 0008, and for tasks submitted outside a trace.
        trace_context: row
            .try_get::<Option<String>, _>("trace_context")?
            .map(|cx| cx.parse().map_err(|e| corrupt("trace_context", e)))
            .transpose()?,
        limits: limits(row)?,
    })
}

/// The limits a task row names (its concurrency key with its limit, its rate bucket).
pub(crate) fn limits(row: &PgRow) -> Result<TaskLimits, sqlx::Error> {
    let key: Option<String> = row.try_get("concurrency_key")?;
    let limit: Option<i32> = row.try_get("concurrency_limit")?;
    let concurrency = match (key, limit) {
        (Some(key), Some(limit)) => Some(ConcurrencyKey::new(
            key,
            u32::try_from(limit).map_err(|_| corrupt("concurrency_limit", limit))?,
        )),
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
pub(crate) fn bucket(row: &PgRow) -> Result<BucketState, sqlx::Error> {
    let count = |column: &'static str| -> Result<u32, sqlx::Error> {
        let n: i64 = row.try_get(column)?;
        u32::try_from(n).map_err(|_| corrupt(column, n))
    };
    let bucket = RateBucket::new(
        row.try_get::<String, _>("name")?,
        count("rate")?,
        duration("period_ns", row.try_get("period_ns")?)?,
    )
    .burst(count("burst")?);
    let schedule = row
        .try_get::<Option<i64>, _>("schedule_ns")?
        .map(|ns| instant("schedule_ns", ns))
        .transpose()?;
    Ok(BucketState { bucket, schedule })
}

/// An instant as nanoseconds since the Unix epoch: exact, as the rules'
/// arithmetic is (a `timestamptz` keeps microseconds).
pub(crate) fn epoch_nanos(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos()).unwrap_or(i64::MAX)
}

fn instant(column: &'static str, ns: i64) -> Result<OffsetDateTime, sqlx::Error> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ns)).map_err(|_| corrupt(column, ns))
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

/// An array column of the story statement: `NULL` (no rows) is empty.
fn array<T>(row: &PgRow, column: &'static str) -> Result<Vec<T>, sqlx::Error>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + sqlx::postgres::PgHasArrayType,
{
    Ok(row.try_get::<Option<Vec<T>>, _>(column)?.unwrap_or_default())
}

/// Decodes the story statement's row: the task, then its children from
/// parallel arrays (one array per column, in the same order).
pub(crate) fn story(row: &PgRow) -> Result<Story, sqlx::Error> {
    let task = task(row)?;
    let a_id: Vec<uuid::Uuid> = array(row, "a_id")?;
    let a_number: Vec<i32> = array(row, "a_number")?;
    let a_worker: Vec<String> = array(row, "a_worker")?;
    let a_started_at: Vec<time::OffsetDateTime> = array(row, "a_started_at")?;
    let a_finished_at: Vec<Option<time::OffsetDateTime>> = array(row, "a_finished_at")?;
    let a_outcome: Vec<String> = array(row, "a_outcome")?;
    let a_operation_id: Vec<Option<String>> = array(row, "a_operation_id")?;
    let a_error: Vec<Option<String>> = array(row, "a_error")?;
    let mut attempts = Vec::with_capacity(a_id.len());
    for i in 0..a_id.len() {
        let (number, outcome) = (a_number[i], &a_outcome[i]);
        attempts.push(Attempt {
            id: AttemptId::from_uuid(a_id[i]),
            task_id: task.id,
            number: u32::try_from(number).map_err(|_| corrupt("number", number))?,
            worker: a_worker[i].clone(),
            started_at: a_started_at[i],
            finished_at: a_finished_at[i],
            outcome: AttemptOutcome::parse(outcome).ok_or_else(|| corrupt("outcome", outcome))?,
            operation_id: a_operation_id[i].clone(),
            error: a_error[i].clone(),
        });
    }
    let r_number: Vec<i32> = array(row, "r_number")?;
    let r_at: Vec<time::OffsetDateTime> = array(row, "r_at")?;
    let r_by: Vec<String> = array(row, "r_by")?;
    let r_reason: Vec<String> = array(row, "r_reason")?;
    let r_from: Vec<String> = array(row, "r_from")?;
    let r_version: Vec<i64> = array(row, "r_version")?;
    let mut reopenings = Vec::with_capacity(r_number.len());
    for i in 0..r_number.len() {
        let (number, version) = (r_number[i], r_version[i]);
        reopenings.push(Reopening {
            task_id: task.id,
            number: u32::try_from(number).map_err(|_| corrupt("reopenings.number", number))?,
            at: r_at[i],
            by: r_by[i].clone(),
            reason: r_reason[i].clone(),
            from: r_from[i]
                .parse::<Status>()
                .map_err(|e| corrupt("from_status", e))?,
            version: u64::try_from(version).map_err(|_| corrupt("reopenings.version", version))?,
        });
    }
    let h_created_at: Vec<time::OffsetDateTime> = array(row, "h_created_at")?;
    let h_published_at: Vec<Option<time::OffsetDateTime>> = array(row, "h_published_at")?;
    let handoffs = h_created_at
        .into_iter()
        .zip(h_published_at)
        .map(|(created_at, published_at)| Handoff {
            created_at,
            published_at,
        })
        .collect();
    let e_name: Vec<String> = array(row, "e_name")?;
    let e_state: Vec<String> = array(row, "e_state")?;
    let e_version: Vec<i64> = array(row, "e_version")?;
    let e_attempt: Vec<i32> = array(row, "e_attempt")?;
    let e_reference: Vec<Option<String>> = array(row, "e_reference")?;
    let e_error: Vec<Option<String>> = array(row, "e_error")?;
    let e_ambiguous: Vec<i32> = array(row, "e_ambiguous")?;
    let e_created_at: Vec<time::OffsetDateTime> = array(row, "e_created_at")?;
    let e_intended_at: Vec<time::OffsetDateTime> = array(row, "e_intended_at")?;
    let e_settled_at: Vec<Option<time::OffsetDateTime>> = array(row, "e_settled_at")?;
    let mut effects = Vec::with_capacity(e_name.len());
    for i in 0..e_name.len() {
        effects.push(effect_of(EffectColumns {
            task_id: task.id,
            name: &e_name[i],
            state: &e_state[i],
            version: e_version[i],
            attempt: e_attempt[i],
            reference: e_reference[i].clone(),
            error: e_error[i].clone(),
            ambiguous: e_ambiguous[i],
            created_at: e_created_at[i],
            intended_at: e_intended_at[i],
            settled_at: e_settled_at[i],
        })?);
    }
    Ok(Story {
        task,
        attempts,
        reopenings,
        handoffs,
        effects,
    })
}

/// One `effects` row's columns, as read.
struct EffectColumns<'a> {
    task_id: TaskId,
    name: &'a str,
    state: &'a str,
    version: i64,
    attempt: i32,
    reference: Option<String>,
    error: Option<String>,
    ambiguous: i32,
    created_at: time::OffsetDateTime,
    intended_at: time::OffsetDateTime,
    settled_at: Option<time::OffsetDateTime>,
}

fn effect_of(c: EffectColumns<'_>) -> Result<Effect, sqlx::Error> {
    let mut effect = Effect::intended(
        c.task_id,
        c.name,
        u64::try_from(c.version).map_err(|_| corrupt("effects.version", c.version))?,
        u32::try_from(c.attempt).map_err(|_| corrupt("effects.attempt", c.attempt))?,
        c.intended_at,
    );
    effect.state = EffectState::parse(c.state).ok_or_else(|| corrupt("effects.state", c.state))?;
    effect.reference = c.reference;
    effect.error = c.error;
    effect.ambiguous = u32::try_from(c.ambiguous).map_err(|_| corrupt("effects.ambiguous", c.ambiguous))?;
    effect.created_at = c.created_at;
    effect.settled_at = c.settled_at;
    Ok(effect)
}

/// An `effects` row (`SELECT *`), or `None` when its columns are null (the
/// outer join of `effect_read` found no record).
pub(crate) fn effect(row: &PgRow) -> Result<Option<Effect>, sqlx::Error> {
    let Some(task_id) = row.try_get::<Option<uuid::Uuid>, _>("task_id")? else {
        return Ok(None);
    };
    let (name, state): (String, String) = (row.try_get("name")?, row.try_get("state")?);
    effect_of(EffectColumns {
        task_id: TaskId::from_uuid(task_id),
        name: &name,
        state: &state,
        version: row.try_get("version")?,
        attempt: row.try_get("attempt")?,
        reference: row.try_get("reference")?,
        error: row.try_get("error")?,
        ambiguous: row.try_get("ambiguous")?,
        created_at: row.try_get("created_at")?,
        intended_at: row.try_get("intended_at")?,
        settled_at: row.try_get("settled_at")?,
    })
    .map(Some)
}
