//! The harness's own tables, in the run's schema next to taskfence's:
//!
//! - `queue`: an at-least-once message queue with SQS-like visibility
//!   timeouts (a received message comes back unless it is acknowledged), and
//!   a receive counter per message;
//! - `provider_calls` / `provider_answers`: the simulated provider's log. Every
//!   call is logged when it starts and every answer *before* it is returned,
//!   so the checker can count answers produced against answers saved;
//! - `deliveries`: each delivery's [`Disposition`](taskfence::runtime::Disposition), for the report;
//! - `task_limits` / `limit_buckets` (the limits mode, `--limits`): each
//!   task's concurrency key, limit and rate bucket by request key, and each
//!   bucket's definition, as the orchestrator chose them, so the checker
//!   knows them without trusting the store's columns; `provider_refusals`:
//!   calls a worker did not make because its lease did not cover them.
//!
//! Every statement reads time with `clock_timestamp()`: the same server clock
//! as the store's, so visibility and leases are on one clock.

use std::time::Duration;

use sqlx::{PgPool, Row};
use uuid::Uuid;

/// The tables' DDL (run once per schema).
pub async fn setup(pool: &PgPool, schema: &str) -> sqlx::Result<()> {
    let s = quote(schema);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA IF NOT EXISTS {s};
         CREATE TABLE {s}.queue (
             id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             task_id    uuid NOT NULL,
             visible_at timestamptz NOT NULL DEFAULT clock_timestamp(),
             receives   integer NOT NULL DEFAULT 0,
             acked_at   timestamptz
         );
         CREATE INDEX queue_visible ON {s}.queue (visible_at) WHERE acked_at IS NULL;
         CREATE TABLE {s}.provider_calls (
             id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             task_id    uuid NOT NULL,
             version    bigint NOT NULL,
             worker     text NOT NULL,
             pid        integer NOT NULL,
             started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
             -- when the call will answer (the provider picks its latency first)
             ends_at    timestamptz NOT NULL,
             -- the limits mode: the task's key and bucket, from task_limits
             concurrency_key text,
             rate_bucket     text
         );
         CREATE INDEX provider_calls_started ON {s}.provider_calls (started_at);
         CREATE TABLE {s}.provider_answers (
             id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             task_id     uuid NOT NULL,
             version     bigint NOT NULL,
             worker      text NOT NULL,
             answer      text NOT NULL,
             produced_at timestamptz NOT NULL DEFAULT clock_timestamp()
         );
         CREATE INDEX provider_answers_task ON {s}.provider_answers (task_id, version);
         CREATE TABLE {s}.deliveries (
             id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             task_id     uuid NOT NULL,
             worker      text NOT NULL,
             disposition text NOT NULL
         );
         CREATE TABLE {s}.task_limits (
             request_key       text PRIMARY KEY,
             -- the submission order (the orchestrator submits one task at a time)
             submitted         bigint NOT NULL UNIQUE,
             concurrency_key   text NOT NULL,
             concurrency_limit integer NOT NULL,
             rate_bucket       text NOT NULL
         );
         CREATE TABLE {s}.limit_buckets (
             name      text PRIMARY KEY,
             rate      bigint NOT NULL,
             period_ms bigint NOT NULL,
             burst     bigint NOT NULL
         );
         CREATE TABLE {s}.provider_refusals (
             id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             task_id    uuid NOT NULL,
             version    bigint NOT NULL,
             worker     text NOT NULL,
             planned_ms double precision NOT NULL,
             at         timestamptz NOT NULL DEFAULT clock_timestamp()
         );"
    )))
    .execute(pool)
    .await
    .map(drop)
}

/// `"schema"`, for names built into SQL text (schema names are generated, never user input).
pub fn quote(schema: &str) -> String {
    format!("\"{}\"", schema.replace('"', "\"\""))
}

/// The queue and provider statements of one schema.
#[derive(Debug, Clone)]
pub struct Queue {
    pool: PgPool,
    schema: String,
}

/// One received message.
#[derive(Debug, Clone, Copy)]
pub struct Message {
    /// The queue row.
    pub id: i64,
    /// The task it carries.
    pub task_id: Uuid,
}

impl Queue {
    /// The queue of `schema` on `pool`.
    pub fn new(pool: PgPool, schema: impl Into<String>) -> Self {
        Self {
            pool,
            schema: schema.into(),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Enqueues `copies` messages for `task_id` (a duplicating publisher).
    pub async fn publish(&self, task_id: Uuid, copies: i32) -> sqlx::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.queue (task_id) SELECT $1 FROM generate_series(1, $2)",
            quote(&self.schema)
        )))
        .bind(task_id)
        .bind(copies)
        .execute(&self.pool)
        .await
        .map(drop)
    }

    /// Receives up to `limit` visible messages and hides them for `visibility`.
    pub async fn receive(&self, limit: i64, visibility: Duration) -> sqlx::Result<Vec<Message>> {
        let s = quote(&self.schema);
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {s}.queue SET visible_at = clock_timestamp() + $2 * interval '1 millisecond',
                                 receives = receives + 1
             WHERE id IN (SELECT id FROM {s}.queue
                          WHERE acked_at IS NULL AND visible_at <= clock_timestamp()
                          ORDER BY visible_at LIMIT $1 FOR UPDATE SKIP LOCKED)
             RETURNING id, task_id"
        )))
        .bind(limit)
        .bind(millis(visibility))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Message {
                    id: r.try_get(0)?,
                    task_id: r.try_get(1)?,
                })
            })
            .collect()
    }

    /// Acknowledges (the message never comes back).
    pub async fn ack(&self, id: i64) -> sqlx::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {}.queue SET acked_at = clock_timestamp() WHERE id = $1",
            quote(&self.schema)
        )))
        .bind(id)
        .execute(&self.pool)
        .await
        .map(drop)
    }

    /// Makes the message visible again after `delay` (from now).
    pub async fn retry_after(&self, id: i64, delay: Duration) -> sqlx::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {}.queue SET visible_at = clock_timestamp() + $2 * interval '1 millisecond'
             WHERE id = $1 AND acked_at IS NULL",
            quote(&self.schema)
        )))
        .bind(id)
        .bind(millis(delay))
        .execute(&self.pool)
        .await
        .map(drop)
    }

    /// Keeps the message hidden until `until` (the renewed lease's expiry, store clock).
    pub async fn hide_until(&self, id: i64, until: time::OffsetDateTime) -> sqlx::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {}.queue SET visible_at = greatest(visible_at, $2) WHERE id = $1 AND acked_at IS NULL",
            quote(&self.schema)
        )))
        .bind(id)
        .bind(until)
        .execute(&self.pool)
        .await
        .map(drop)
    }

    /// The provider logs a call as it starts, with how long it will take, so
    /// the orchestrator can find a worker that is mid-call.
    pub async fn call_started(
        &self,
        task_id: Uuid,
        version: u64,
        worker: &str,
        takes: Duration,
    ) -> sqlx::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.provider_calls (task_id, version, worker, pid, ends_at)
             VALUES ($1, $2, $3, $4, clock_timestamp() + $5 * interval '1 millisecond')",
            quote(&self.schema)
        )))
        .bind(task_id)
        .bind(i64::try_from(version).unwrap_or(i64::MAX))
        .bind(worker)
        .bind(i32::try_from(std::process::id()).unwrap_or(i32::MAX))
        .bind(millis(takes))
        .execute(&self.pool)
        .await
        .map(drop)
    }

    /// The limits mode's provider call log, fenced: logs the call (with the
    /// task's concurrency key and rate bucket from `task_limits`) and answers
    /// `true` only if the task's row in the store still holds assignment
    /// `version`, running, with a lease that outlives the whole call
    /// (`lease_until > store_clock() + takes`, one clock reading for the
    /// check and the call's start). Otherwise nothing is logged, the call
    /// must not be made, and the refusal is logged in `provider_refusals`.
    pub async fn call_started_fenced(
        &self,
        task_id: Uuid,
        version: u64,
        worker: &str,
        takes: Duration,
    ) -> sqlx::Result<bool> {
        let s = quote(&self.schema);
        let version = i64::try_from(version).unwrap_or(i64::MAX);
        let made = sqlx::query(sqlx::AssertSqlSafe(format!(
            "WITH clock AS (SELECT {s}.store_clock() AS now)
             INSERT INTO {s}.provider_calls
                 (task_id, version, worker, pid, started_at, ends_at, concurrency_key, rate_bucket)
             SELECT t.id, t.version, $3, $4, c.now, c.now + $5 * interval '1 millisecond',
                    l.concurrency_key, l.rate_bucket
             FROM clock AS c, {s}.tasks AS t
             LEFT JOIN {s}.task_limits AS l ON l.request_key = t.request_key
             WHERE t.id = $1 AND t.version = $2 AND t.status = 'running'
               AND t.lease_until > c.now + $5 * interval '1 millisecond'"
        )))
        .bind(task_id)
        .bind(version)
        .bind(worker)
        .bind(i32::try_from(std::process::id()).unwrap_or(i32::MAX))
        .bind(millis(takes))
        .execute(&self.pool)
        .await?
        .rows_affected()
            == 1;
        if !made {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {s}.provider_refusals (task_id, version, worker, planned_ms)
                 VALUES ($1, $2, $3, $4)"
            )))
            .bind(task_id)
            .bind(version)
            .bind(worker)
            .bind(millis(takes))
            .execute(&self.pool)
            .await?;
        }
        Ok(made)
    }

    /// Records the limits the orchestrator gives the task of `request_key`,
    /// the `submitted`-th submission (before it is submitted; a repeat is a no-op).
    pub async fn record_limits(
        &self,
        request_key: &str,
        submitted: i64,
        key: &taskfence::throttle::ConcurrencyKey,
        bucket: &str,
    ) -> sqlx::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.task_limits (request_key, submitted, concurrency_key, concurrency_limit, rate_bucket)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (request_key) DO NOTHING",
            quote(&self.schema)
        )))
        .bind(request_key)
        .bind(submitted)
        .bind(key.name())
        .bind(i32::try_from(key.limit()).unwrap_or(i32::MAX))
        .bind(bucket)
        .execute(&self.pool)
        .await
        .map(drop)
    }

    /// Records a bucket's definition (a repeat is a no-op).
    pub async fn record_bucket(&self, bucket: &taskfence::throttle::RateBucket) -> sqlx::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.limit_buckets (name, rate, period_ms, burst)
             VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING",
            quote(&self.schema)
        )))
        .bind(bucket.name())
        .bind(i64::from(bucket.rate()))
        .bind(i64::try_from(bucket.period().as_millis()).unwrap_or(i64::MAX))
        .bind(i64::from(bucket.burst_size()))
        .execute(&self.pool)
        .await
        .map(drop)
    }

    /// The provider logs an answer before it returns it.
    pub async fn answer_produced(
        &self,
        task_id: Uuid,
        version: u64,
        worker: &str,
        answer: &str,
    ) -> sqlx::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.provider_answers (task_id, version, worker, answer) VALUES ($1, $2, $3, $4)",
            quote(&self.schema)
        )))
        .bind(task_id)
        .bind(i64::try_from(version).unwrap_or(i64::MAX))
        .bind(worker)
        .bind(answer)
        .execute(&self.pool)
        .await
        .map(drop)
    }

    /// The process id of a worker among `pids` that is in the middle of a
    /// provider call right now (at least 50 ms of it left), if any.
    pub async fn worker_mid_call(&self, pids: &[i32]) -> sqlx::Result<Option<i32>> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT pid FROM {}.provider_calls
             WHERE pid = ANY($1) AND started_at > clock_timestamp() - interval '10 seconds'
               AND clock_timestamp() + interval '50 milliseconds' < ends_at
             ORDER BY random() LIMIT 1",
            quote(&self.schema)
        )))
        .bind(pids)
        .fetch_optional(&self.pool)
        .await
    }

    /// Logs one delivery's disposition (for the report only).
    pub async fn delivered(&self, task_id: Uuid, worker: &str, disposition: &str) -> sqlx::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.deliveries (task_id, worker, disposition) VALUES ($1, $2, $3)",
            quote(&self.schema)
        )))
        .bind(task_id)
        .bind(worker)
        .bind(disposition)
        .execute(&self.pool)
        .await
        .map(drop)
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
