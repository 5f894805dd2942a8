//! The harness's own tables, in the run's schema next to taskfence's:
//!
//! - `queue`: an at-least-once message queue with SQS-like visibility
//!   timeouts (a received message comes back unless it is acknowledged), and
//!   a receive counter per message;
//! - `provider_calls` / `provider_answers`: the simulated provider's log. Every
//!   call is logged when it starts and every answer *before* it is returned,
//!   so the checker can count answers produced against answers saved;
//! - `deliveries`: each delivery's [`Disposition`](taskfence::runtime::Disposition), for the report.
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
             ends_at    timestamptz NOT NULL
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
