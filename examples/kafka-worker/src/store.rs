//! Store setup: the PostgreSQL pool and the migrated [`PgStore`].
//!
//! TLS: the URL's own parameters apply (sqlx with rustls), so
//! `postgres://user@host/db?sslmode=verify-full&sslrootcert=/etc/ssl/rds-ca.pem`
//! works as RDS and most managed servers require; `sslmode=require` encrypts
//! without checking the certificate.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use taskfence::PgStore;

use crate::config::Settings;

/// Why the store could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database URL does not parse.
    #[error("DATABASE_URL: {0}")]
    Url(#[source] sqlx::Error),
    /// No connection could be opened.
    #[error("connecting to PostgreSQL: {0}")]
    Connect(#[source] sqlx::Error),
    /// The schema name is invalid, or migrating it failed.
    #[error(transparent)]
    Store(#[from] taskfence::Error),
}

/// Connects to `settings.database_url`, opens the store in
/// `settings.schema` and applies the embedded migrations (idempotent; safe
/// with several workers starting at once).
pub async fn connect(settings: &Settings) -> Result<PgStore, StoreError> {
    let options = PgConnectOptions::from_str(&settings.database_url)
        .map_err(StoreError::Url)?
        .application_name(&settings.worker_id);
    let pool = PgPoolOptions::new()
        .max_connections(settings.db_max_connections)
        // One round trip per store operation: no ping before each one. A dead
        // connection fails the operation, which the worker retries.
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(StoreError::Connect)?;
    let store = PgStore::builder(pool).schema(&settings.schema).build()?;
    store.migrate().await?;
    Ok(store)
}
