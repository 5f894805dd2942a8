//! The embedded migrations (the crate's `migrations-sqlite/` files, plain
//! SQL any tool can run), applied in one `BEGIN IMMEDIATE` transaction with
//! their history in `taskfence_migrations` — never in the application's own
//! `_sqlx_migrations`, so the two histories live side by side in one file.
//!
//! Why a runner of its own rather than sqlx's migrator: on SQLite that
//! migrator takes no lock, and its deferred transactions can fail with a
//! busy file when two processes start at once. Here the whole run — the
//! history read, every pending file, their history rows — is one write
//! transaction: a second process waits for the first, then finds nothing
//! to do. A file applied before and changed since, or a history from a
//! newer library, is refused ([`Error::Migration`]), nothing applied.

use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::{Connection, Row, SqlitePool};

use crate::error::{Error, Result};

use super::db;
use super::site::Busy;

/// One embedded migration file.
struct File {
    version: i64,
    description: &'static str,
    sql: &'static str,
}

/// Every migration of this crate version, oldest first.
const FILES: &[File] = &[
    File {
        version: 1,
        description: "tasks, attempts, reopenings, handoffs, effects",
        sql: include_str!("../../migrations-sqlite/0001_tasks.sql"),
    },
    File {
        version: 2,
        description: "concurrency keys and rate buckets",
        sql: include_str!("../../migrations-sqlite/0002_limits.sql"),
    },
];

/// The newest migration this library needs: a file whose history ends
/// before it is [`Error::NotMigrated`].
pub(crate) const LATEST: i64 = FILES[FILES.len() - 1].version;

const HISTORY: &str = "CREATE TABLE IF NOT EXISTS taskfence_migrations (
    version     INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    checksum    BLOB NOT NULL,
    applied_at  INTEGER NOT NULL)";

/// A recorded migration this library cannot accept.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("taskfence SQLite migration {0} was applied with other contents (checksum mismatch)")]
    Changed(i64),
    #[error("the file holds taskfence SQLite migration {0}, newer than this library's {LATEST}")]
    Newer(i64),
}

/// Applies the pending migrations to the file `pool` opens, in one write
/// transaction (waiting up to 30 s for another writer). Stores made with
/// [`SqliteStore::migrate`](super::SqliteStore::migrate) need not call it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let path = std::env::temp_dir().join(format!("taskfence-doc-{}.db", uuid::Uuid::now_v7()));
/// let pool = sqlx::SqlitePool::connect_with(taskfence::SqliteStore::connect_options(&path)).await?;
/// taskfence::sqlite::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn migrate(pool: &SqlitePool) -> Result<()> {
    run(pool, super::SqliteStore::DEFAULT_BUSY_BUDGET).await
}

/// [`migrate`] within `budget` of waiting for a busy file.
pub(crate) async fn run(pool: &SqlitePool, budget: Duration) -> Result<()> {
    let mut busy = Busy::new(budget);
    loop {
        match apply(pool).await {
            Err(Error::Busy { .. }) if busy.again().await => continue,
            Err(Error::Busy { .. }) => {
                return Err(Error::Busy {
                    waited: busy.waited(),
                });
            }
            other => return other,
        }
    }
}

fn checksum(sql: &str) -> Vec<u8> {
    Sha256::digest(sql.as_bytes()).to_vec()
}

async fn apply(pool: &SqlitePool) -> Result<()> {
    let mut conn = pool.acquire().await.map_err(db)?;
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(db)?;
    sqlx::raw_sql(HISTORY).execute(&mut *tx).await.map_err(db)?;
    let applied = sqlx::query("SELECT version, checksum FROM taskfence_migrations ORDER BY version")
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
    let mut done = Vec::with_capacity(applied.len());
    for row in &applied {
        let version: i64 = row.try_get(0).map_err(db)?;
        let sum: Vec<u8> = row.try_get(1).map_err(db)?;
        match FILES.iter().find(|f| f.version == version) {
            None => return Err(Error::migration(Refused::Newer(version))),
            Some(file) if checksum(file.sql) != sum => {
                return Err(Error::migration(Refused::Changed(version)));
            }
            Some(_) => done.push(version),
        }
    }
    let now = super::row::at(time::OffsetDateTime::now_utc());
    for file in FILES.iter().filter(|f| !done.contains(&f.version)) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(file.sql))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query("INSERT INTO taskfence_migrations (version, description, checksum, applied_at) VALUES (?1, ?2, ?3, ?4)")
            .bind(file.version)
            .bind(file.description)
            .bind(checksum(file.sql))
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
    }
    tx.commit().await.map_err(db)
}
