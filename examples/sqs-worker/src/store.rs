//! The task store: a PostgreSQL pool and the [`PgStore`] on it.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use taskfence::PgStore;

use crate::BoxError;

/// Connects to `url` and returns the store on the tables in `schema`.
///
/// The URL's TLS parameters apply: `?sslmode=require`, or `verify-full` with
/// `sslrootcert=/path/to/global-bundle.pem` as RDS recommends (rustls).
/// `max_connections` should cover the worker's concurrency plus the renewals
/// and the dispatcher running beside it.
pub async fn connect(url: &str, schema: &str, max_connections: u32) -> Result<PgStore, BoxError> {
    let options = PgConnectOptions::from_str(url)?.application_name("sqs-worker");
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        // One round trip per store operation: sqlx would otherwise ping first.
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await?;
    Ok(PgStore::builder(pool).schema(schema).build()?)
}
