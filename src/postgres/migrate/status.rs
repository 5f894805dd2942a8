//! The migration status report: where each embedded migration stands in a
//! schema ([`MigrationStatus`]), read from the schema's history without a
//! lock or any write.

use std::borrow::Cow;

use sha2::{Digest, Sha256};
use sqlx::{AssertSqlSafe, PgPool};
use time::OffsetDateTime;

use super::super::db;
use super::super::schema::Schema;
use super::{ChangedMigration, FILES, HISTORY_TABLE, UpgradeNote, migrator};
use crate::error::{Error, Result};

/// Where one migration stands in a schema.
///
/// ```no_run
/// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
/// use taskfence::postgres::MigrationState;
/// let status = store.migration_status().await?;
/// let applied = status.migrations.iter().filter(|m| matches!(m.state, MigrationState::Applied { .. }));
/// println!("{} applied", applied.count());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MigrationState {
    /// Applied, as shipped.
    Applied {
        /// When.
        at: OffsetDateTime,
    },
    /// Not yet applied: the next `migrate` applies it.
    Pending,
    /// Applied with other contents than this library's file: `migrate`
    /// refuses ([`Error::Migration`]) rather than guess.
    Changed {
        /// When.
        at: OffsetDateTime,
    },
    /// Recorded as failed part-way (sqlx's `success = false`): `migrate`
    /// refuses until someone repairs the schema and its history row.
    Failed {
        /// When it was attempted.
        at: OffsetDateTime,
    },
}

/// One of this library's migrations and where it stands in a schema.
///
/// ```no_run
/// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
/// for m in store.migration_status().await?.pending() {
///     println!("{:04} {} ({} notes)", m.version, m.description, m.notes.len());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Migration {
    /// Its number: `migrations/0007_….sql` is 7.
    pub version: i64,
    /// What it does, in a few words.
    pub description: &'static str,
    /// Applied, pending, changed or failed.
    pub state: MigrationState,
    /// What applying it asks of an operator; empty when nothing.
    pub notes: &'static [UpgradeNote],
    /// Its SQL, as shipped (unqualified names: run with `search_path` set).
    pub sql: &'static str,
}

/// Which of this library's migrations a schema has and which are pending,
/// read without changing anything (no lock, nothing created).
///
/// ```no_run
/// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
/// let status = store.migration_status().await?;
/// status.check()?; // what `migrate` would refuse, refused now
/// if !status.is_up_to_date() {
///     print!("{}", status.pending_sql()); // for review
///     store.migrate().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MigrationStatus {
    /// The schema read.
    pub schema: String,
    /// Every migration of this library, oldest first.
    pub migrations: Vec<Migration>,
    /// Versions in the schema's history that this library does not know:
    /// a newer taskfence migrated it, and `migrate` refuses.
    pub unknown: Vec<i64>,
    /// The history is in the format of taskfence before sqlx 0.9: the next
    /// `migrate` converts it first (in place, under a lock).
    pub old_history: bool,
}

impl MigrationStatus {
    /// The migrations `migrate` would apply, oldest first.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// let pending: Vec<i64> = store.migration_status().await?.pending().map(|m| m.version).collect();
    /// # Ok(()) }
    /// ```
    pub fn pending(&self) -> impl Iterator<Item = &Migration> + '_ {
        self.migrations
            .iter()
            .filter(|m| m.state == MigrationState::Pending)
    }

    /// The migrations applied as shipped, oldest first.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// let applied = store.migration_status().await?.applied().count();
    /// # Ok(()) }
    /// ```
    pub fn applied(&self) -> impl Iterator<Item = &Migration> + '_ {
        self.migrations
            .iter()
            .filter(|m| matches!(m.state, MigrationState::Applied { .. }))
    }

    /// Every migration applied as shipped and nothing else in the history:
    /// this library can use the schema.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// if !store.migration_status().await?.is_up_to_date() {
    ///     store.migrate().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_up_to_date(&self) -> bool {
        self.unknown.is_empty()
            && self
                .migrations
                .iter()
                .all(|m| matches!(m.state, MigrationState::Applied { .. }))
    }

    /// What `migrate` would refuse, as the [`Error::Migration`] it would
    /// return: a migration applied with other contents or failed part-way,
    /// or a version this library does not know. `Ok` when applying the
    /// pending ones can proceed.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// store.migration_status().await?.check()?;
    /// # Ok(()) }
    /// ```
    pub fn check(&self) -> Result<()> {
        let schema = self.schema.clone();
        if let Some(&version) = self.unknown.first() {
            return Err(Error::migration(UnknownMigration { version, schema }));
        }
        for m in &self.migrations {
            match m.state {
                MigrationState::Changed { .. } => {
                    return Err(Error::migration(ChangedMigration {
                        version: m.version,
                        schema,
                    }));
                }
                MigrationState::Failed { .. } => {
                    return Err(Error::migration(FailedMigration {
                        version: m.version,
                        schema,
                    }));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The SQL `migrate` would run, for review: `SET search_path` to the
    /// schema, then each pending file as shipped, its notes as comments.
    /// Running it by hand records nothing in the history (`migrate` does);
    /// a comment says so. With nothing pending, a one-line comment.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// std::fs::write("taskfence-upgrade.sql", store.migration_status().await?.pending_sql()).ok();
    /// # Ok(()) }
    /// ```
    pub fn pending_sql(&self) -> String {
        use std::fmt::Write as _;
        let pending: Vec<&Migration> = self.pending().collect();
        if pending.is_empty() {
            return format!(
                "-- schema {} is up to date: no pending taskfence migration\n",
                self.schema
            );
        }
        let versions: Vec<String> = pending.iter().map(|m| format!("{:04}", m.version)).collect();
        let mut out = format!(
            "-- taskfence migrations pending in schema {}: {}\n\
             -- For review. `taskfence migrate` (or `PgStore::migrate`) applies them, each in its own\n\
             -- transaction, and records them in {}.{HISTORY_TABLE}; running this file does not.\n\
             SET search_path TO \"{}\";\n",
            self.schema,
            versions.join(", "),
            self.schema,
            self.schema
        );
        for m in pending {
            let _ = write!(out, "\n-- ==== {:04}: {} ====\n", m.version, m.description);
            for note in m.notes {
                let _ = writeln!(out, "-- NOTE: {note}");
                for statement in note.statements() {
                    let _ = writeln!(out, "--   {statement}");
                }
            }
            out.push_str(m.sql);
            if !m.sql.ends_with('\n') {
                out.push('\n');
            }
        }
        out
    }
}

/// A history row this library has no file for.
#[derive(Debug, thiserror::Error)]
#[error(
    "schema {schema} has taskfence migration {version}, which this library does not know: a newer taskfence migrated it"
)]
struct UnknownMigration {
    version: i64,
    schema: String,
}

/// A history row recorded as failed part-way.
#[derive(Debug, thiserror::Error)]
#[error(
    "taskfence migration {version} in schema {schema} failed part-way (its history row says so): repair the schema and that row by hand"
)]
struct FailedMigration {
    version: i64,
    schema: String,
}

/// Reads the schema's history, in either format, without a lock or any write.
pub(super) async fn read(pool: &PgPool, schema: &Schema) -> Result<MigrationStatus> {
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2",
    )
    .bind(schema.name())
    .bind(HISTORY_TABLE)
    .fetch_all(pool)
    .await
    .map_err(db)?;
    let old_history = columns.iter().any(|c| c == "applied_at");
    let rows: Vec<(i64, OffsetDateTime, bool, Vec<u8>)> = if columns.is_empty() {
        Vec::new()
    } else {
        let (at, success) = if old_history {
            ("applied_at", "true")
        } else {
            ("installed_on", "success")
        };
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT version, {at}, {success}, checksum FROM {}.{HISTORY_TABLE} ORDER BY version",
            schema.quoted()
        )))
        .fetch_all(pool)
        .await
        .map_err(db)?
    };
    let migrator = migrator(schema);
    let migrations = FILES
        .iter()
        .map(|f| {
            let state = match rows.iter().find(|r| r.0 == f.version) {
                None => MigrationState::Pending,
                Some(&(_, at, false, _)) => MigrationState::Failed { at },
                Some((_, at, true, checksum)) => {
                    let shipped: Cow<'_, [u8]> = if old_history {
                        Cow::Owned(Sha256::digest(f.sql.as_bytes()).to_vec())
                    } else {
                        migrator
                            .iter()
                            .find(|m| m.version == f.version)
                            .map_or(Cow::Borrowed(&[][..]), |m| Cow::Borrowed(m.checksum.as_ref()))
                    };
                    if shipped[..] == checksum[..] {
                        MigrationState::Applied { at: *at }
                    } else {
                        MigrationState::Changed { at: *at }
                    }
                }
            };
            Migration {
                version: f.version,
                description: f.description,
                state,
                notes: f.notes,
                sql: f.sql,
            }
        })
        .collect();
    let unknown = rows
        .iter()
        .map(|r| r.0)
        .filter(|v| !FILES.iter().any(|f| f.version == *v))
        .collect();
    Ok(MigrationStatus {
        schema: schema.name().to_owned(),
        migrations,
        unknown,
        old_history,
    })
}
