//! The database: the pool, and both migration histories at start-up.
//!
//! Two migrators share the database and never meet:
//!
//! - taskfence's ([`PgStore::migrate`]) writes its tables and its history
//!   table `taskfence_migrations` into its own schema (`TASKFENCE_SCHEMA`),
//!   with qualified names;
//! - the app's ([`MIGRATOR`], `migrations/` embedded by `sqlx::migrate!`)
//!   writes unqualified names, so its tables and its `_sqlx_migrations` land in
//!   the first schema of the connection's `search_path`: the app schema.
//!
//! Each takes its own lock (taskfence an advisory lock per schema, sqlx one per
//! database), so replicas starting at once apply every file exactly once.

use sqlx::PgPool;
use taskfence::PgStore;
use taskfence::config::ConnectError;

/// The app's migrations (`migrations/*.sql`), embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// Why the schemas could not be brought up to date.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrateError {
    /// taskfence's migrations or its schema name.
    #[error("taskfence migrations: {0}")]
    Taskfence(#[from] taskfence::Error),
    /// The app's migrations (`migrations/`).
    #[error("app migrations: {0}")]
    App(#[from] sqlx::migrate::MigrateError),
}

/// A pool on `url` (TLS as its `sslmode` says) of up to `max_connections`,
/// its sessions named `chat-api`.
///
/// With `app_schema`, that schema is created if missing and every connection's
/// `search_path` is set to it at connect time ([`taskfence::config::connect_pool`]),
/// so the app's unqualified SQL — its queries and its migrations — always means
/// that schema, on every connection, including ones opened after a failover.
/// Without it the server's default `search_path` (normally `public`) applies.
pub async fn connect(
    url: &str,
    app_schema: Option<&str>,
    max_connections: u32,
) -> Result<PgPool, ConnectError> {
    taskfence::config::connect_pool(url, app_schema, max_connections, "chat-api").await
}

/// Applies taskfence's migrations to `store`'s schema, then the app's
/// [`MIGRATOR`] to the pool's `search_path`. Idempotent: a second start (or a
/// replica) finds both histories complete and changes nothing.
pub async fn migrate(store: &PgStore) -> Result<(), MigrateError> {
    store.migrate().await?;
    MIGRATOR.run(store.pool()).await?;
    Ok(())
}
