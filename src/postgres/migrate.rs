//! The embedded migration runner: the SQL files of `migrations/`, applied in
//! order into the crate's own schema, with its own history table there, so it
//! never meets the host application's `sqlx migrate` history (`_sqlx_migrations`)
//! or any other tool's.

use sha2::{Digest, Sha256};
use sqlx::postgres::PgConnection;
use sqlx::{Executor, PgPool, Row};

use super::db;
use super::schema::{DEFAULT_SCHEMA, Schema};
use crate::store::Result;

/// One embedded migration file.
struct Migration {
    version: i64,
    description: &'static str,
    sql: &'static str,
}

/// Every migration of this crate version, oldest first.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "tasks, attempts, handoffs, store_clock",
        sql: include_str!("../../migrations/0001_tasks.sql"),
    },
    Migration {
        version: 2,
        description: "acceptance rule",
        sql: include_str!("../../migrations/0002_acceptance_rule.sql"),
    },
    Migration {
        version: 3,
        description: "retry budgets, reopenings, operator query indexes",
        sql: include_str!("../../migrations/0003_operations.sql"),
    },
    Migration {
        version: 4,
        description: "no foreign keys to tasks",
        sql: include_str!("../../migrations/0004_lifecycle.sql"),
    },
    Migration {
        version: 5,
        description: "the latest attempt in its task row",
        sql: include_str!("../../migrations/0005_latest_attempt.sql"),
    },
    Migration {
        version: 6,
        description: "handoffs keyed by their task",
        sql: include_str!("../../migrations/0006_handoffs_by_task.sql"),
    },
];

/// The history table, inside the crate's schema.
pub(crate) const HISTORY_TABLE: &str = "taskfence_migrations";

/// An applied migration whose file has changed since: refuse to guess.
#[derive(Debug, thiserror::Error)]
#[error(
    "taskfence migration {version} in schema {schema} was applied with other contents (checksum mismatch)"
)]
struct ChangedMigration {
    version: i64,
    schema: String,
}

/// Applies the pending migrations to `schema`, in one transaction, holding an
/// advisory lock so concurrent migrators (several replicas starting at once)
/// apply each file exactly once.
pub(crate) async fn run(pool: &PgPool, schema: &Schema) -> Result<()> {
    let q = schema.quoted();
    let mut tx = pool.begin().await.map_err(db)?;
    let conn: &mut PgConnection = &mut tx;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(format!("taskfence.migrate.{}", schema.name()))
        .execute(&mut *conn)
        .await
        .map_err(db)?;
    let setup = format!(
        "CREATE SCHEMA IF NOT EXISTS {q};
         CREATE TABLE IF NOT EXISTS {q}.{HISTORY_TABLE} (
             version     bigint PRIMARY KEY,
             description text NOT NULL,
             checksum    bytea NOT NULL,
             applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
         );"
    );
    // Several statements: the simple-query protocol (an `&str` without arguments).
    conn.execute(setup.as_str()).await.map_err(db)?;
    let applied: Vec<(i64, Vec<u8>)> =
        sqlx::query(&format!("SELECT version, checksum FROM {q}.{HISTORY_TABLE}"))
            .fetch_all(&mut *conn)
            .await
            .map_err(db)?
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(db)?;
    for migration in MIGRATIONS {
        let checksum = Sha256::digest(migration.sql.as_bytes()).to_vec();
        match applied.iter().find(|(v, _)| *v == migration.version) {
            Some((_, done)) if *done == checksum => continue,
            Some(_) => {
                return Err(crate::Error::storage(ChangedMigration {
                    version: migration.version,
                    schema: schema.name().to_owned(),
                }));
            }
            None => {}
        }
        tracing::info!(
            schema = schema.name(),
            version = migration.version,
            "applying taskfence migration"
        );
        // SET LOCAL ends with the transaction: the host's search_path is untouched.
        let script = format!("SET LOCAL search_path TO {q};\n{}", migration.sql);
        conn.execute(script.as_str()).await.map_err(db)?;
        sqlx::query(&format!(
            "INSERT INTO {q}.{HISTORY_TABLE} (version, description, checksum) VALUES ($1, $2, $3)"
        ))
        .bind(migration.version)
        .bind(migration.description)
        .bind(checksum)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
    }
    tx.commit().await.map_err(db)
}

/// Applies the embedded migrations to the [`DEFAULT_SCHEMA`] schema.
///
/// Safe to run from every replica at start-up: an advisory lock serializes
/// concurrent runs and each file is applied once, recorded in
/// `taskfence.taskfence_migrations` (never in the host's `_sqlx_migrations`).
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> taskfence::Result<()> {
/// taskfence::postgres::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn migrate(pool: &PgPool) -> Result<()> {
    run(pool, &Schema::new(DEFAULT_SCHEMA)?).await
}
