//! [`PgFixture`]: the conformance [`Fixture`] for [`PgStore`] on a real
//! PostgreSQL server, one fresh schema per fixture so tests run in parallel.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Row};

use super::Fixture;
use crate::postgres::PgStore;
use crate::store::TaskStore;

/// Schemas created by fixtures start with this; ones older than [`STALE_AFTER`]
/// (left behind by a killed test run) are dropped when a new fixture starts.
const PREFIX: &str = "taskfence_test_";
const STALE_AFTER: Duration = Duration::from_secs(3600);

/// A [`PgStore`] in a fresh, migrated schema of its own, with a movable store
/// clock and a real row count. The schema is dropped when the fixture is.
///
/// The store clock is moved by redefining the schema's `store_clock()`
/// function as `clock_timestamp() + <offset>`: every statement of that schema
/// (and only of that schema) sees the new time at once, still read after the
/// row lock. It is a test hook: production schemas keep `clock_timestamp()`.
///
/// ```no_run
/// # #[tokio::main] async fn main() {
/// use taskfence::testing::{Fixture, PgFixture};
/// let fixture = PgFixture::connect("postgres://postgres@127.0.0.1:5432/test").await;
/// assert_eq!(fixture.record_count().await, 0);
/// fixture.advance(std::time::Duration::from_secs(31)).await; // leases granted before now expired
/// # }
/// ```
#[derive(Debug)]
pub struct PgFixture {
    store: PgStore,
    url: String,
    offset: tokio::sync::Mutex<Duration>,
}

impl PgFixture {
    /// A fixture on the server named by the `DATABASE_URL` environment variable.
    ///
    /// # Panics
    ///
    /// When `DATABASE_URL` is unset or the server cannot be reached: a test
    /// that needs PostgreSQL must not silently pass without it.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() {
    /// let fixture = taskfence::testing::PgFixture::new().await;
    /// # }
    /// ```
    pub async fn new() -> Self {
        let url = std::env::var("DATABASE_URL").expect(
            "DATABASE_URL must name a PostgreSQL server, e.g. postgres://postgres@127.0.0.1:5432/test",
        );
        Self::connect(&url).await
    }

    /// A fixture on the server at `url`, with a pool of up to 16 connections.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() {
    /// let fixture = taskfence::testing::PgFixture::connect("postgres://postgres@127.0.0.1:5432/test").await;
    /// # }
    /// ```
    pub async fn connect(url: &str) -> Self {
        Self::with_pool_options(url, PgPoolOptions::new().max_connections(16)).await
    }

    /// A fixture whose pool is built from `options` (connection count,
    /// timeouts). `test_before_acquire` is turned off, so every operation is
    /// exactly its own statements.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() {
    /// use sqlx::postgres::PgPoolOptions;
    /// let fixture = taskfence::testing::PgFixture::with_pool_options(
    ///     "postgres://postgres@127.0.0.1:5432/test",
    ///     PgPoolOptions::new().max_connections(40),
    /// )
    /// .await;
    /// # }
    /// ```
    pub async fn with_pool_options(url: &str, options: PgPoolOptions) -> Self {
        let connect: PgConnectOptions = url.parse().expect("a valid PostgreSQL URL");
        let connect = connect.disable_statement_logging();
        drop_stale_schemas(&connect).await;
        let pool = options
            .test_before_acquire(false)
            .connect_with(connect)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL at {url}: {e}"));
        let store = PgStore::builder(pool)
            .schema(fresh_schema_name())
            .build()
            .expect("generated schema names are valid");
        store.migrate().await.expect("migrate the fixture's schema");
        Self {
            store,
            url: url.to_owned(),
            offset: tokio::sync::Mutex::new(Duration::ZERO),
        }
    }

    /// The concrete store (for `_in` variants, the dispatcher, the pool).
    ///
    /// ```no_run
    /// # async fn f(fixture: taskfence::testing::PgFixture) {
    /// let pool = fixture.pg_store().pool();
    /// # }
    /// ```
    pub fn pg_store(&self) -> &PgStore {
        &self.store
    }

    /// The fixture's schema name.
    ///
    /// ```no_run
    /// # async fn f(fixture: taskfence::testing::PgFixture) {
    /// assert!(fixture.schema().starts_with("taskfence_test_"));
    /// # }
    /// ```
    pub fn schema(&self) -> &str {
        self.store.schema()
    }

    /// The server URL the fixture was created with.
    ///
    /// ```no_run
    /// # async fn f(fixture: taskfence::testing::PgFixture) {
    /// println!("{}", fixture.url());
    /// # }
    /// ```
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Rows in one of the fixture's tables (`tasks`, `attempts`, `handoffs`).
    ///
    /// ```no_run
    /// # async fn f(fixture: taskfence::testing::PgFixture) {
    /// let unpublished = fixture.count("handoffs").await;
    /// # }
    /// ```
    pub async fn count(&self, table: &str) -> i64 {
        assert!(
            matches!(table, "tasks" | "attempts" | "handoffs"),
            "not a taskfence table: {table}"
        );
        sqlx::query(&format!("SELECT count(*) FROM \"{}\".{table}", self.schema()))
            .fetch_one(self.store.pool())
            .await
            .expect("count rows")
            .get(0)
    }
}

#[async_trait]
impl Fixture for PgFixture {
    fn store(&self) -> Arc<dyn TaskStore> {
        Arc::new(self.store.clone())
    }

    async fn advance(&self, by: Duration) {
        let mut offset = self.offset.lock().await;
        // Round up to the server's microsecond: the clock moves by at least `by`.
        *offset += Duration::from_micros(u64::try_from(by.as_nanos().div_ceil(1000)).unwrap_or(u64::MAX));
        let sql = format!(
            "CREATE OR REPLACE FUNCTION \"{}\".store_clock() RETURNS timestamptz
                 LANGUAGE sql VOLATILE PARALLEL SAFE
                 AS $$ SELECT clock_timestamp() + interval '{} microseconds' $$",
            self.schema(),
            offset.as_micros()
        );
        sqlx::raw_sql(&sql)
            .execute(self.store.pool())
            .await
            .expect("move the store clock");
    }

    async fn record_count(&self) -> u64 {
        let s = self.schema();
        let n: i64 = sqlx::query(&format!(
            "SELECT (SELECT count(*) FROM \"{s}\".tasks) + (SELECT count(*) FROM \"{s}\".attempts)
                  + (SELECT count(*) FROM \"{s}\".handoffs)"
        ))
        .fetch_one(self.store.pool())
        .await
        .expect("count rows")
        .get(0);
        u64::try_from(n).expect("a count is not negative")
    }
}

impl Drop for PgFixture {
    /// Drops the schema on a short-lived thread with its own runtime (Drop
    /// cannot await); a failure leaves it for the stale-schema cleanup.
    fn drop(&mut self) {
        let (url, schema) = (self.url.clone(), self.schema().to_owned());
        let dropper = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let options: PgConnectOptions = url.parse().ok()?;
                let mut conn = options.disable_statement_logging().connect().await.ok()?;
                sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .execute(&mut conn)
                    .await
                    .ok()?;
                conn.close().await.ok()
            })
        });
        let _ = dropper.join();
    }
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn fresh_schema_name() -> String {
    let unique = uuid::Uuid::now_v7().simple().to_string();
    format!("{PREFIX}{}_{}", unix_secs(), &unique[unique.len() - 12..])
}

/// Drops fixture schemas left behind by killed runs (older than [`STALE_AFTER`]).
async fn drop_stale_schemas(options: &PgConnectOptions) {
    let Ok(mut conn) = options.connect().await else {
        return;
    };
    let cutoff = unix_secs().saturating_sub(STALE_AFTER.as_secs());
    let names: Vec<String> = sqlx::query("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)")
        .bind(PREFIX)
        .fetch_all(&mut conn)
        .await
        .map(|rows| rows.iter().map(|r| r.get(0)).collect())
        .unwrap_or_default();
    for name in names {
        let created = name[PREFIX.len()..]
            .split('_')
            .next()
            .and_then(|s| s.parse::<u64>().ok());
        if created.is_some_and(|secs| secs < cutoff) {
            let _ = sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                .execute(&mut conn)
                .await;
        }
    }
    let _ = conn.close().await;
}
