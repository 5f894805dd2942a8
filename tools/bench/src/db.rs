//! Schemas, the raw-SQL ceiling, bulk loads and the server's settings.

use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::PgPool;
use taskfence::{InputHash, PgStore};
use taskfence_test_support::TempSchema;
use uuid::Uuid;

use crate::{Config, Res};

/// PgStore's schemas of this harness start with this, the ceiling's with
/// [`RAW_PREFIX`]; ones older than an hour (left by a killed run) are dropped
/// when the next one is made ([`TempSchema`]).
const PREFIX: &str = "taskfence_bench_";
const RAW_PREFIX: &str = "taskfence_bench_raw_";

/// The payload every benchmarked task carries, and the saved response.
pub(crate) const PAYLOAD: [u8; 64] = [0xab; 64];
pub(crate) const RESPONSE: [u8; 256] = [b'o'; 256];

/// A fresh, migrated schema of its own: a [`PgStore`] on it, and the same
/// `tasks` table shape (`LIKE … INCLUDING ALL`: columns, checks, indexes) in a
/// second schema for the hand-written ceiling. Both are dropped when it is.
pub(crate) struct BenchSchema {
    pub store: PgStore,
    pub pool: PgPool,
    // Each dropped (`DROP SCHEMA … CASCADE`) when the value is.
    schema: TempSchema,
    raw: TempSchema,
}

impl BenchSchema {
    pub(crate) async fn create(cfg: &Config, pool: &PgPool) -> Res<Self> {
        let schema = TempSchema::new(&cfg.url, PREFIX).await;
        let raw = TempSchema::new(&cfg.url, RAW_PREFIX).await;
        let name = schema.name();
        let store = PgStore::builder(pool.clone()).schema(name).build()?;
        store.migrate().await?;
        let raw_name = raw.name();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE SCHEMA \"{raw_name}\";
             CREATE TABLE \"{raw_name}\".tasks (LIKE \"{name}\".tasks INCLUDING ALL);"
        )))
        .execute(pool)
        .await?;
        eprintln!("[bench] created schemas {name} and {raw_name}");
        Ok(Self {
            store,
            pool: pool.clone(),
            schema,
            raw,
        })
    }

    /// The store's schema.
    pub(crate) fn name(&self) -> &str {
        self.schema.name()
    }

    /// `"schema"`, quoted.
    pub(crate) fn q(&self) -> String {
        format!("\"{}\"", self.name())
    }

    /// The ceiling's schema, quoted.
    pub(crate) fn raw(&self) -> String {
        format!("\"{}\"", self.raw.name())
    }

    /// One of the store's statements by name (`PgStore::statements`).
    pub(crate) fn statement(&self, name: &str) -> String {
        self.store
            .statements()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, sql)| sql.to_owned())
            .unwrap_or_else(|| panic!("PgStore has no statement named {name}"))
    }

    /// Loads `n` tasks shaped like a live table: 70 % completed (10 % of all
    /// rows past their retention), 10 % pending (1 in 20 backing off, 1 in
    /// 2000 due), 10 % running (1 in 1000 with an expired lease), 10 % failed;
    /// each task's one attempt in its row (where `PgStore` keeps a task's
    /// latest attempt), one handoff per task (0.1 % of handoffs unpublished);
    /// 64-byte payloads and 256-byte responses. Then `ANALYZE`.
    pub(crate) async fn fill(&self, n: u64) -> Res<()> {
        let s = self.q();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {s}.tasks (id, scope, operation, request_key, input_hash, payload, status, version,
                 max_attempts, initial_backoff_ns, max_backoff_ns, multiplier, jitter, on_ambiguous,
                 lease_until, not_before, response, created_at, finished_at, expires_at,
                 attempt_id, attempt_worker, attempt_started_at, attempt_finished_at, attempt_outcome)
             SELECT gen_random_uuid(), 'scope-' || (i % 1000), 'chat.reply', 'bulk-' || i,
                    sha256(i::text::bytea), decode(repeat('ab', 64), 'hex'), st, 1, 5,
                    1000000000, 300000000000, 2, 0.2, 'retry',
                    CASE WHEN st = 'running'
                         THEN now() + CASE WHEN i % 1000 = 8 THEN '-1 hour' ELSE '1 hour' END::interval END,
                    CASE WHEN st = 'pending' AND i % 20 = 7
                         THEN now() + CASE WHEN i % 2000 = 7 THEN '-1 hour' ELSE '1 hour' END::interval END,
                    CASE WHEN st = 'completed' THEN decode(repeat('6f', 256), 'hex') END,
                    now() - interval '1 day',
                    CASE WHEN st IN ('completed', 'failed') THEN now() - interval '23 hours' END,
                    now() + CASE WHEN i % 10 = 0 THEN '-1 day' ELSE '6 days' END::interval,
                    gen_random_uuid(), 'w', now() - interval '1 day',
                    CASE WHEN st IN ('completed', 'failed') THEN now() - interval '23 hours'
                         WHEN st = 'pending' THEN now() - interval '1 day' END,
                    CASE st WHEN 'running' THEN 'running' WHEN 'completed' THEN 'completed'
                            ELSE 'expired' END
             FROM (SELECT i, CASE WHEN i % 10 < 7 THEN 'completed' WHEN i % 10 = 7 THEN 'pending'
                                  WHEN i % 10 = 8 THEN 'running' ELSE 'failed' END AS st
                   FROM generate_series(1, $1) AS i) AS g"
        )))
        .bind(i64::try_from(n)?)
        .execute(&self.pool)
        .await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {s}.handoffs (task_id, created_at, published_at)
             SELECT id, created_at, CASE WHEN random() < 0.999 THEN now() END FROM {s}.tasks;
             ANALYZE {s}.tasks; ANALYZE {s}.handoffs;"
        )))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The estimated total cost of `EXPLAIN <statement>` for a representative
    /// call (the plan the server would run, at this table size).
    pub(crate) async fn plan_cost(&self, name: &str, id: Uuid) -> Res<f64> {
        let sql = self.statement(name);
        let lease = sqlx::postgres::types::PgInterval {
            months: 0,
            days: 0,
            microseconds: 30_000_000,
        };
        let explain = format!("EXPLAIN {sql}");
        let q = sqlx::query(sqlx::AssertSqlSafe(explain.as_str()));
        let q = match name {
            "claim" | "claim_fresh" => q
                .bind(id)
                .bind(Uuid::now_v7())
                .bind(lease)
                .bind("w")
                .bind("exhausted")
                .bind("deadline")
                .bind(false),
            "complete" | "complete_current" => {
                q.bind(id).bind(1_i64).bind(&RESPONSE[..]).bind(Uuid::now_v7())
            }
            "due" | "purge_expired" => q.bind(100_i64),
            other => panic!("no parameters known for {other}"),
        };
        // EXPLAIN only plans: nothing runs, nothing is written. The first
        // line is the root node: `… (cost=0.42..8.45 rows=1 width=…)`.
        let top: String = q.fetch_one(&self.pool).await?.try_get(0)?;
        top.split("..")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|cost| cost.parse().ok())
            .ok_or_else(|| format!("no cost in the plan line {top:?}").into())
    }
}

/// The input hash every benchmark binds for `key` (computed client-side by
/// ours and by the ceiling alike).
pub(crate) fn input_hash(key: &str) -> InputHash {
    InputHash::of(["conversation-1", key])
}

/// The hand-written ceiling: the same three steps, one autocommit statement each.
pub(crate) struct Raw {
    submit: String,
    claim: String,
    complete: String,
    claim_batch: String,
    complete_batch: String,
}

impl Raw {
    pub(crate) fn new(schema: &BenchSchema) -> Self {
        let r = schema.raw();
        Self {
            submit: format!(
                "INSERT INTO {r}.tasks (id, scope, operation, request_key, input_hash, payload, status, version,
                     max_attempts, initial_backoff_ns, max_backoff_ns, multiplier, jitter, on_ambiguous,
                     created_at, expires_at)
                 VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, 5, 1000000000, 300000000000, 2, 0.2, 'retry',
                         clock_timestamp(), clock_timestamp() + interval '7 days')
                 ON CONFLICT (scope, operation, request_key) DO NOTHING
                 RETURNING id"
            ),
            claim: format!(
                "UPDATE {r}.tasks SET version = version + 1, status = 'running',
                     lease_until = clock_timestamp() + $2, not_before = NULL
                 WHERE id = $1
                   AND ((status = 'pending' AND (not_before IS NULL OR not_before <= clock_timestamp()))
                     OR (status = 'running' AND lease_until <= clock_timestamp()))
                 RETURNING version"
            ),
            complete: format!(
                "UPDATE {r}.tasks SET status = 'completed', response = $3, lease_until = NULL,
                     finished_at = clock_timestamp()
                 WHERE id = $1 AND version = $2 AND status = 'running' AND lease_until > clock_timestamp()
                 RETURNING id"
            ),
            // A batched queue's fetch: up to $2 of the oldest pending tasks in
            // one statement, skipping locked rows.
            claim_batch: format!(
                "UPDATE {r}.tasks AS t SET version = t.version + 1, status = 'running',
                     lease_until = clock_timestamp() + $1, not_before = NULL
                 FROM (SELECT id FROM {r}.tasks WHERE status = 'pending'
                       ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) AS p
                 WHERE t.id = p.id
                 RETURNING t.id, t.version"
            ),
            // Its bulk completion: every (id, version) of the batch, each row
            // still guarded on its version and lease.
            complete_batch: format!(
                "UPDATE {r}.tasks AS t SET status = 'completed', response = $3, lease_until = NULL,
                     finished_at = clock_timestamp()
                 FROM unnest($1::uuid[], $2::int8[]) AS r(id, version)
                 WHERE t.id = r.id AND t.version = r.version AND t.status = 'running'
                   AND t.lease_until > clock_timestamp()"
            ),
        }
    }

    /// Up to `n` of the oldest pending tasks, claimed in one statement.
    pub(crate) async fn claim_batch(&self, pool: &PgPool, n: usize) -> Res<Vec<(Uuid, i64)>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(self.claim_batch.as_str()))
            .bind(lease_interval())
            .bind(i64::try_from(n)?)
            .fetch_all(pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| Ok::<_, sqlx::Error>((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, _>>()?)
    }

    /// Completes a claimed batch in one statement; errors if any was fenced out.
    pub(crate) async fn complete_batch(&self, pool: &PgPool, batch: &[(Uuid, i64)]) -> Res<()> {
        let done = sqlx::query(sqlx::AssertSqlSafe(self.complete_batch.as_str()))
            .bind(batch.iter().map(|(id, _)| *id).collect::<Vec<_>>())
            .bind(batch.iter().map(|(_, v)| *v).collect::<Vec<_>>())
            .bind(&RESPONSE[..])
            .execute(pool)
            .await?
            .rows_affected();
        if done != batch.len() as u64 {
            return Err(format!("raw batch completion: {done} of {} saved", batch.len()).into());
        }
        Ok(())
    }

    /// Submit, claim and complete one task; errors if a step is refused.
    pub(crate) async fn lifecycle(&self, pool: &PgPool, key: &str) -> Res<()> {
        let id = self.submit(pool, key).await?;
        let version = self.claim(pool, id).await?;
        self.complete(pool, id, version).await
    }

    pub(crate) async fn submit(&self, pool: &PgPool, key: &str) -> Res<Uuid> {
        let row = sqlx::query(sqlx::AssertSqlSafe(self.submit.as_str()))
            .bind(Uuid::now_v7())
            .bind("user-1")
            .bind("chat.reply")
            .bind(key)
            .bind(&input_hash(key).as_bytes()[..])
            .bind(&PAYLOAD[..])
            .fetch_optional(pool)
            .await?
            .ok_or("raw submit: key already used")?;
        Ok(row.try_get(0)?)
    }

    pub(crate) async fn claim(&self, pool: &PgPool, id: Uuid) -> Res<i64> {
        Ok(self
            .try_claim(pool, id)
            .await?
            .ok_or("raw claim: not claimable")?)
    }

    /// The claim; `None` when the task is not claimable (no row updated).
    pub(crate) async fn try_claim(&self, pool: &PgPool, id: Uuid) -> Res<Option<i64>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(self.claim.as_str()))
            .bind(id)
            .bind(lease_interval())
            .fetch_optional(pool)
            .await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    pub(crate) async fn complete(&self, pool: &PgPool, id: Uuid, version: i64) -> Res<()> {
        sqlx::query(sqlx::AssertSqlSafe(self.complete.as_str()))
            .bind(id)
            .bind(version)
            .bind(&RESPONSE[..])
            .fetch_optional(pool)
            .await?
            .ok_or("raw complete: fenced out")?;
        Ok(())
    }
}

/// [`LEASE`] as a PostgreSQL interval.
fn lease_interval() -> sqlx::postgres::types::PgInterval {
    sqlx::postgres::types::PgInterval {
        months: 0,
        days: 0,
        microseconds: 30_000_000,
    }
}

/// The machine and the server, for the report.
pub(crate) async fn describe(pool: &PgPool) -> Res<Vec<(String, String)>> {
    let mut out = vec![
        (
            "client cores (nproc)".to_owned(),
            std::thread::available_parallelism()
                .map_or(0, |n| n.get())
                .to_string(),
        ),
        ("memory".to_owned(), meminfo_total()),
    ];
    let version: String = sqlx::query("SELECT version()").fetch_one(pool).await?.get(0);
    out.push((
        "PostgreSQL".into(),
        version.split(" on ").next().unwrap_or(&version).to_owned(),
    ));
    for setting in [
        "shared_buffers",
        "synchronous_commit",
        "fsync",
        "wal_level",
        "jit",
        "jit_above_cost",
        "max_connections",
        "shared_preload_libraries",
    ] {
        let v: String = sqlx::query(sqlx::AssertSqlSafe(format!("SHOW {setting}")))
            .fetch_one(pool)
            .await?
            .get(0);
        out.push((setting.to_owned(), if v.is_empty() { "(none)".into() } else { v }));
    }
    Ok(out)
}

fn meminfo_total() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        })
        .map_or_else(
            || "unknown".into(),
            |kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0),
        )
}

/// `/proc/loadavg`'s first three fields (1, 5, 15 minutes).
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// A fixed 30 s lease.
pub(crate) const LEASE: Duration = Duration::from_secs(30);
