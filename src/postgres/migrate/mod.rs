//! The embedded migrations, applied by sqlx's own migrator into the crate's
//! schema, with their history in a table of that schema
//! (`<schema>.taskfence_migrations`, sqlx's format), so they never meet the
//! host application's `sqlx::migrate!` history (`_sqlx_migrations`) or any
//! other tool's.
//!
//! Why sqlx's migrator: since sqlx 0.9 it takes a history table name and
//! schema of our choosing, so the application and taskfence keep two
//! histories side by side in one database, each applied by the same code.
//! The migration files are plain SQL with unqualified names (any tool can run
//! them with `search_path` set); the migrator runs them on a connection of its
//! own whose `search_path` is the store's schema, so their checksums are those
//! of the files as shipped.
//!
//! Before sqlx 0.9 the crate had a runner of its own whose history table had
//! the same name and another shape; [`run`] converts such a table once (under
//! a lock, checking every recorded file is unchanged) before the migrator reads it.
//!
//! Each file carries its [`UpgradeNote`]s here, beside it: what applying it
//! asks of an operator (stop the old workers first, build an index
//! concurrently first, expect a lock). [`PgStore::migration_status`] reports
//! them with each pending migration, and the CHANGELOG's "Upgrading" section
//! is checked against them by this module's tests, so the two never disagree.

use std::borrow::Cow;

use sha2::{Digest, Sha256};
use sqlx::migrate::{MigrateError, Migration as SqlxMigration, MigrationType, Migrator};
use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Executor, PgPool, Row, SqlStr};

use super::PgStore;
use super::db;
use super::schema::{DEFAULT_SCHEMA, Schema};
use crate::error::Result;
use crate::error::{Error, InvalidInput};

mod notes;
mod status;

pub use notes::UpgradeNote;
pub use status::{Migration, MigrationState, MigrationStatus};

/// One embedded migration file.
struct File {
    version: i64,
    description: &'static str,
    sql: &'static str,
    /// What applying it asks of an operator; empty when nothing.
    notes: &'static [UpgradeNote],
}

/// Every migration of this crate version, oldest first.
const FILES: &[File] = &[
    File {
        version: 1,
        description: "tasks, attempts, handoffs, store_clock",
        sql: include_str!("../../../migrations/0001_tasks.sql"),
        notes: &[],
    },
    File {
        version: 2,
        description: "acceptance rule",
        sql: include_str!("../../../migrations/0002_acceptance_rule.sql"),
        notes: &[UpgradeNote::LocksTables {
            tables: &["tasks", "attempts"],
            why: "checks its new CHECK constraints against every row (a scan, no rewrite)",
        }],
    },
    File {
        version: 3,
        description: "retry budgets, reopenings, operator query indexes",
        sql: include_str!("../../../migrations/0003_operations.sql"),
        notes: &[UpgradeNote::BuildIndexesConcurrently {
            table: "tasks",
            statements: &[
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_status_id ON tasks (status, id);",
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_scope_id ON tasks (scope, id) INCLUDE (status);",
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_unclaimed ON tasks (created_at, id) WHERE status = 'pending' AND version = 0;",
            ],
        }],
    },
    File {
        version: 4,
        description: "no foreign keys to tasks",
        sql: include_str!("../../../migrations/0004_lifecycle.sql"),
        notes: &[],
    },
    File {
        version: 5,
        description: "the latest attempt in its task row",
        sql: include_str!("../../../migrations/0005_latest_attempt.sql"),
        notes: &[UpgradeNote::StopOldWorkers {
            why: "it moves running attempts into their task rows; a worker of an older release keeps writing them to `attempts`, and its library still accepts the schema",
        }],
    },
    File {
        version: 6,
        description: "handoffs keyed by their task",
        sql: include_str!("../../../migrations/0006_handoffs_by_task.sql"),
        notes: &[UpgradeNote::LocksTables {
            tables: &["handoffs"],
            why: "rebuilds its primary key as (task_id, id), so submits wait",
        }],
    },
    File {
        version: 7,
        description: "tasks without a handoff",
        sql: include_str!("../../../migrations/0007_optional_handoff.sql"),
        notes: &[],
    },
    File {
        version: 8,
        description: "the submitter's trace context",
        sql: include_str!("../../../migrations/0008_trace_context.sql"),
        notes: &[],
    },
    File {
        version: 9,
        description: "the effect journal",
        sql: include_str!("../../../migrations/0009_effects.sql"),
        notes: &[],
    },
    File {
        version: 10,
        description: "listings by operation from an index",
        sql: include_str!("../../../migrations/0010_operation_index.sql"),
        notes: &[UpgradeNote::BuildIndexesConcurrently {
            table: "tasks",
            statements: &[
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_operation_id ON tasks (operation, id);",
            ],
        }],
    },
    File {
        version: 11,
        description: "attempts given back before their work began",
        sql: include_str!("../../../migrations/0011_returned_unstarted.sql"),
        notes: &[UpgradeNote::LocksTables {
            tables: &["attempts"],
            why: "checks its widened CHECK constraint against every row (a scan, no rewrite)",
        }],
    },
    File {
        version: 12,
        description: "concurrency keys and rate buckets",
        sql: include_str!("../../../migrations/0012_limits.sql"),
        notes: &[
            UpgradeNote::StopOldWorkers {
                why: "a worker of an older release claims tasks without deciding their limits, so a task naming a concurrency key or a rate bucket could run past them",
            },
            UpgradeNote::BuildIndexesConcurrently {
                table: "tasks",
                statements: &[
                    "CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_key_lease ON tasks (concurrency_key, lease_until) WHERE status = 'running' AND concurrency_key IS NOT NULL;",
                    "CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_limited_unfinished ON tasks (concurrency_key, key_order) WHERE status IN ('pending', 'running') AND (concurrency_key IS NOT NULL OR rate_bucket IS NOT NULL);",
                    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS tasks_key_order ON tasks (concurrency_key, key_order) WHERE concurrency_key IS NOT NULL;",
                ],
            },
        ],
    },
];

/// The newest migration this library needs: a store whose history ends
/// before it is [`Error::NotMigrated`].
pub(crate) const LATEST: i64 = FILES[FILES.len() - 1].version;

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

/// The migrator for `schema`: every file, history in `<schema>.taskfence_migrations`,
/// the schema created first.
fn migrator(schema: &Schema) -> Migrator {
    let mut migrator = Migrator::with_migrations(
        FILES
            .iter()
            .map(|f| {
                SqlxMigration::new(
                    f.version,
                    Cow::Borrowed(f.description),
                    MigrationType::Simple,
                    SqlStr::from_static(f.sql),
                    false,
                )
            })
            .collect(),
    );
    let q = schema.quoted();
    migrator.dangerous_set_table_name(format!("{q}.{HISTORY_TABLE}"));
    migrator.create_schema(q);
    migrator
}

/// Applies the pending migrations to `schema`. sqlx's migrator holds its
/// advisory lock for the run (the application's migrator takes the same one,
/// so the two never interleave) and applies each file once, in its own
/// transaction: replicas starting at once are safe.
pub(crate) async fn run(pool: &PgPool, schema: &Schema) -> Result<()> {
    apply(pool, schema, None).await
}

/// [`run`], up to and including `target` when given.
async fn apply(pool: &PgPool, schema: &Schema, target: Option<i64>) -> Result<()> {
    // A connection of its own, whose search_path is the schema from its
    // start-up on; closed after the run, so no pooled connection of the
    // application's ever has that setting.
    let options = (*pool.connect_options())
        .clone()
        .options([("search_path", schema.quoted())]);
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .map_err(db)?;
    let result = async {
        adopt_old_history(&mut *own.acquire().await.map_err(db)?, schema).await?;
        let migrator = migrator(schema);
        match target {
            Some(target) => migrator.run_to(target, &own).await,
            None => migrator.run(&own).await,
        }
        .map_err(|e| migration_error(e, schema))
    }
    .await;
    own.close().await;
    result
}

/// A migration failure: a failed statement or a lost connection is a storage
/// error (retryable); a history that disagrees with this library is not.
fn migration_error(err: MigrateError, schema: &Schema) -> Error {
    match err {
        MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _) => db(e),
        MigrateError::VersionMismatch(version) => Error::migration(ChangedMigration {
            version,
            schema: schema.name().to_owned(),
        }),
        other => Error::migration(other),
    }
}

/// Converts the history table of the runner taskfence had before sqlx 0.9
/// (`version, description, checksum = SHA-256 of the file, applied_at`) to
/// sqlx's shape, once, under a lock; a file recorded with other contents
/// stops it. Does nothing when there is no such table.
async fn adopt_old_history(conn: &mut PgConnection, schema: &Schema) -> Result<()> {
    let q = schema.quoted();
    let mut tx = conn.begin().await.map_err(db)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(format!("taskfence.migrate.{}", schema.name()))
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    let old_shape: bool = sqlx::query(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns
                         WHERE table_schema = $1 AND table_name = $2 AND column_name = 'applied_at')",
    )
    .bind(schema.name())
    .bind(HISTORY_TABLE)
    .fetch_one(&mut *tx)
    .await
    .map_err(db)?
    .get(0);
    if !old_shape {
        return Ok(());
    }
    let applied = sqlx::query(AssertSqlSafe(format!(
        "SELECT version, description, checksum, applied_at FROM {q}.{HISTORY_TABLE} ORDER BY version"
    )))
    .fetch_all(&mut *tx)
    .await
    .map_err(db)?;
    tracing::info!(
        schema = schema.name(),
        versions = applied.len(),
        "converting the taskfence migration history to sqlx's format"
    );
    tx.execute(AssertSqlSafe(format!(
        "ALTER TABLE {q}.{HISTORY_TABLE} RENAME TO {HISTORY_TABLE}_before_sqlx;
         CREATE TABLE {q}.{HISTORY_TABLE} (
             version BIGINT PRIMARY KEY,
             description TEXT NOT NULL,
             installed_on TIMESTAMPTZ NOT NULL DEFAULT now(),
             success BOOLEAN NOT NULL,
             checksum BYTEA NOT NULL,
             execution_time BIGINT NOT NULL
         );"
    )))
    .await
    .map_err(db)?;
    let migrator = migrator(schema);
    for row in &applied {
        let version: i64 = row.try_get("version").map_err(db)?;
        let checksum: Vec<u8> = row.try_get("checksum").map_err(db)?;
        let file = FILES.iter().find(|f| f.version == version);
        let unchanged = file.is_some_and(|f| Sha256::digest(f.sql.as_bytes())[..] == checksum[..]);
        let migration = migrator.iter().find(|m| m.version == version);
        let (true, Some(migration)) = (unchanged, migration) else {
            return Err(Error::migration(ChangedMigration {
                version,
                schema: schema.name().to_owned(),
            }));
        };
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {q}.{HISTORY_TABLE} (version, description, installed_on, success, checksum, execution_time)
             VALUES ($1, $2, $3, true, $4, 0)"
        )))
        .bind(version)
        .bind(migration.description.as_ref())
        .bind(row.try_get::<time::OffsetDateTime, _>("applied_at").map_err(db)?)
        .bind(migration.checksum.as_ref())
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    }
    tx.execute(AssertSqlSafe(format!(
        "DROP TABLE {q}.{HISTORY_TABLE}_before_sqlx"
    )))
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)
}

/// Applies the embedded migrations to the [`DEFAULT_SCHEMA`] schema.
///
/// Safe to run from every replica at start-up: sqlx's advisory lock
/// serializes concurrent runs and each file is applied once, recorded in
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

/// Migration status and staged upgrades (the rest of `PgStore` is in `store.rs`).
impl PgStore {
    /// Which of this library's migrations the store's schema has applied and
    /// which are pending, each with its [`UpgradeNote`]s: what `migrate`
    /// would do, read without changing anything. A schema that does not
    /// exist yet has every migration pending.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// let status = store.migration_status().await?;
    /// for m in status.pending() {
    ///     let notes: Vec<String> = m.notes.iter().map(|n| n.summary()).collect();
    ///     println!("pending {:04} {} {}", m.version, m.description, notes.join("; "));
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn migration_status(&self) -> Result<MigrationStatus> {
        status::read(&self.pool, &self.schema).await
    }

    /// Applies the pending migrations up to and including `version`, never
    /// past it and never back: a staged upgrade (apply what old workers can
    /// run beside, stop them, apply the rest with [`migrate`](Self::migrate)).
    /// A version this library does not have is
    /// [`InvalidInput::OutOfRange`] and applies nothing.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// store.migrate_to(4).await?; // old workers keep running
    /// // … stop them (0005 asks for it) …
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn migrate_to(&self, version: i64) -> Result<()> {
        if !FILES.iter().any(|f| f.version == version) {
            return Err(InvalidInput::OutOfRange {
                field: "migration version",
                value: version.to_string(),
                min: FILES[0].version.to_string(),
                max: LATEST.to_string(),
            }
            .into());
        }
        apply(&self.pool, &self.schema, Some(version)).await
    }
}

/// The CHANGELOG's list of the migrations that ask something of an
/// operator, as it must read (`tests::the_changelog_lists_every_note`).
#[cfg(test)]
fn changelog_notes() -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for f in FILES.iter().filter(|f| !f.notes.is_empty()) {
        for note in f.notes {
            let _ = writeln!(out, "- **{:04}** ({}): {note}.", f.version, f.description);
            if !note.statements().is_empty() {
                out.push_str("\n  ```sql\n");
                for statement in note.statements() {
                    let _ = writeln!(out, "  {statement}");
                }
                out.push_str("  ```\n\n");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_changelog_lists_every_note() {
        let changelog = include_str!("../../../CHANGELOG.md");
        let expected = changelog_notes();
        assert!(
            changelog.contains(&expected),
            "CHANGELOG.md's Upgrading section must list the migrations' notes exactly as:\n{expected}"
        );
    }

    #[test]
    fn concurrent_index_statements_match_their_migration() {
        for f in FILES {
            for statement in f.notes.iter().flat_map(UpgradeNote::statements) {
                let plain = statement.replace("CONCURRENTLY ", "");
                assert!(
                    f.sql.contains(&plain),
                    "{:04} does not contain {plain:?}: the note would build another index",
                    f.version
                );
            }
        }
    }

    #[test]
    fn versions_are_increasing_and_match_the_files() {
        for pair in FILES.windows(2) {
            assert!(pair[0].version < pair[1].version);
        }
        for f in FILES {
            assert!(
                f.sql.starts_with(&format!("-- taskfence {:04}", f.version)),
                "{:04}",
                f.version
            );
        }
    }
}
