//! [`PgFixture`]: the conformance [`Fixture`] for [`PgStore`] on a real
//! PostgreSQL server, one fresh schema per fixture so tests run in parallel;
//! [`PgTxFixture`], the same store on one transaction (`PgStore::on`); and
//! [`TempSchema`], the schema that drops itself, which they are built on.
//! Re-exported from [`crate::testing`] (features `postgres` and `testing`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Row};

use crate::inspect::Inspect;
use crate::postgres::site::Site;
use crate::postgres::{PgConnStore, PgStore};
use crate::store::{Claim, ClaimRequest, Fenced, Lease, TaskStore};
use crate::task::TaskId;
use crate::testing::{FencedWritesFixture, Fixture, InspectFixture, OutboxFixture, RollbackFixture};

/// Schemas created by fixtures start with this.
const PREFIX: &str = "taskfence_test_";
/// Temporary schemas older than this (left behind by a killed test run) are
/// dropped when a new one with the same prefix is made.
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
    offset: tokio::sync::Mutex<Duration>,
    // Last: dropped after the store's handle, it drops the schema.
    schema: TempSchema,
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
        let pool = options
            .test_before_acquire(false)
            .connect_with(connect)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL at {url}: {e}"));
        Self::on_pool(url, pool).await
    }

    /// A fixture in a fresh schema on an existing `pool` (to the server at
    /// `url`, which the fixture uses to drop its schema). Many fixtures can
    /// share one pool: a property test that creates hundreds of them then
    /// pays for a schema each, not for a pool each.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() {
    /// let url = "postgres://postgres@127.0.0.1:5432/test";
    /// let pool = sqlx::PgPool::connect(url).await.unwrap();
    /// let a = taskfence::testing::PgFixture::on_pool(url, pool.clone()).await;
    /// let b = taskfence::testing::PgFixture::on_pool(url, pool).await;
    /// assert_ne!(a.schema(), b.schema());
    /// # }
    /// ```
    pub async fn on_pool(url: &str, pool: sqlx::PgPool) -> Self {
        let schema = TempSchema::new(url, PREFIX).await;
        let store = PgStore::builder(pool)
            .schema(schema.name())
            .build()
            .expect("generated schema names are valid");
        store.migrate().await.expect("migrate the fixture's schema");
        Self {
            store,
            offset: tokio::sync::Mutex::new(Duration::ZERO),
            schema,
        }
    }

    /// The concrete store (for `PgStore::on`, the dispatcher, the pool).
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
        self.schema.url()
    }

    /// Rows in one of the fixture's tables (`tasks`, `attempts`, `handoffs`, `reopenings`).
    ///
    /// ```no_run
    /// # async fn f(fixture: taskfence::testing::PgFixture) {
    /// let unpublished = fixture.count("handoffs").await;
    /// # }
    /// ```
    pub async fn count(&self, table: &str) -> i64 {
        assert!(
            matches!(table, "tasks" | "attempts" | "handoffs" | "reopenings"),
            "not a taskfence table: {table}"
        );
        sqlx::query(AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{}\".{table}",
            self.schema()
        )))
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
        *offset += round_up_to_micros(by);
        sqlx::raw_sql(AssertSqlSafe(clock_at(self.schema(), *offset)))
            .execute(self.store.pool())
            .await
            .expect("move the store clock");
    }

    async fn record_count(&self) -> u64 {
        let s = self.schema();
        let n: i64 = sqlx::query(AssertSqlSafe(format!(
            "SELECT (SELECT count(*) FROM \"{s}\".tasks) + (SELECT count(*) FROM \"{s}\".attempts)
                  + (SELECT count(*) FROM \"{s}\".handoffs) + (SELECT count(*) FROM \"{s}\".reopenings)
                  + (SELECT count(*) FROM \"{s}\".effects)"
        )))
        .fetch_one(self.store.pool())
        .await
        .expect("count rows")
        .get(0);
        u64::try_from(n).expect("a count is not negative")
    }
}

impl InspectFixture for PgFixture {
    fn inspector(&self) -> Arc<dyn Inspect> {
        Arc::new(self.store.clone())
    }
}

/// The outbox is the schema's `handoffs` table.
#[async_trait]
impl OutboxFixture for PgFixture {
    type Store = PgStore;

    fn outbox(&self) -> PgStore {
        self.store.clone()
    }

    async fn handoff_count(&self) -> u64 {
        u64::try_from(self.count("handoffs").await).expect("a count is not negative")
    }
}

/// The application's rows live in `app_rows` of the fixture's schema,
/// written in one transaction with [`fence`](crate::postgres::PgConnStore::fence):
/// the row goes first, so a refused fence shows the rollback.
#[async_trait]
impl FencedWritesFixture for PgFixture {
    async fn write_fenced(&self, lease: &Lease, row: &str) -> crate::Result<Fenced<()>> {
        let s = self.schema();
        let db = crate::Error::storage;
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS \"{s}\".app_rows (row text NOT NULL)"
        )))
        .execute(self.store.pool())
        .await
        .map_err(db)?;
        let mut tx = self.store.pool().begin().await.map_err(db)?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{s}\".app_rows (row) VALUES ($1)"
        )))
        .bind(row)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        let fenced = self.store.on(&mut tx).fence(lease).await?;
        if fenced.is_accepted() {
            tx.commit().await.map_err(db)?;
        }
        Ok(fenced)
    }

    async fn rows(&self) -> Vec<String> {
        let s = self.schema();
        sqlx::query_scalar(AssertSqlSafe(format!("SELECT row FROM \"{s}\".app_rows")))
            .fetch_all(self.store.pool())
            .await
            .unwrap_or_default()
    }
}

/// The claim runs on `on(&mut tx)` of a transaction of the pool, which is
/// then rolled back.
#[async_trait]
impl RollbackFixture for PgFixture {
    async fn claim_rolled_back(&self, id: TaskId, request: ClaimRequest) -> Claim {
        let mut tx = self.store.pool().begin().await.expect("begin a transaction");
        let claim = self
            .store
            .on(&mut tx)
            .claim(id, request)
            .await
            .expect("claim in the transaction");
        tx.rollback().await.expect("roll the transaction back");
        claim
    }

    async fn fence_in_transaction(&self, lease: &Lease) -> crate::Result<Fenced<()>> {
        let mut tx = self.store.pool().begin().await.map_err(crate::Error::storage)?;
        let fenced = self.store.on(&mut tx).fence(lease).await;
        tx.rollback().await.map_err(crate::Error::storage)?;
        fenced
    }
}

/// A [`Fixture`] whose store is a [`PgFixture`]'s store on one open
/// transaction ([`PgStore::on`]): every operation of a suite runs as
/// statements of that transaction, which is never committed (dropping the
/// fixture closes its connection, which rolls it back). The record count is
/// read inside the transaction too, so a suite's "nothing written" checks see
/// its uncommitted writes, and the clock is moved inside it.
///
/// ```no_run
/// # #[tokio::main] async fn main() {
/// use taskfence::testing::{Fixture, PgFixture, PgTxFixture};
/// let fixture = PgTxFixture::new(PgFixture::connect("postgres://postgres@127.0.0.1:5432/test").await).await;
/// assert_eq!(fixture.record_count().await, 0);
/// # }
/// ```
pub struct PgTxFixture {
    // First: dropped before the schema, it closes the connection (a rollback).
    store: Arc<PgConnStore<'static>>,
    offset: tokio::sync::Mutex<Duration>,
    base: PgFixture,
}

impl std::fmt::Debug for PgTxFixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTxFixture")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl PgTxFixture {
    /// `base`'s store on a connection of its own, in a transaction begun now.
    ///
    /// # Panics
    ///
    /// When the connection cannot be made or the transaction begun.
    pub async fn new(base: PgFixture) -> Self {
        let options: PgConnectOptions = base.url().parse().expect("a valid PostgreSQL URL");
        let conn = options
            .disable_statement_logging()
            .connect()
            .await
            .expect("connect the transaction fixture");
        let store = PgConnStore::owning(base.pg_store().clone(), conn)
            .await
            .expect("begin the transaction");
        Self {
            store: Arc::new(store),
            offset: tokio::sync::Mutex::new(Duration::ZERO),
            base,
        }
    }

    /// The fixture the store and its schema come from (its pool sees only
    /// what the transaction has not yet written).
    pub fn base(&self) -> &PgFixture {
        &self.base
    }
}

#[async_trait]
impl Fixture for PgTxFixture {
    fn store(&self) -> Arc<dyn TaskStore> {
        self.store.clone()
    }

    /// Moves the clock inside the transaction: a connection that already
    /// holds its locks does not take in another session's redefinition of
    /// `store_clock()` until its transaction ends, and this one never ends.
    async fn advance(&self, by: Duration) {
        let mut offset = self.offset.lock().await;
        *offset += round_up_to_micros(by);
        let mut conn = self.store.conn().await.expect("the transaction's connection");
        sqlx::raw_sql(AssertSqlSafe(clock_at(self.base.schema(), *offset)))
            .execute(&mut *conn)
            .await
            .expect("move the store clock");
    }

    async fn record_count(&self) -> u64 {
        let s = self.base.schema();
        let mut conn = self.store.conn().await.expect("the transaction's connection");
        let n: i64 = sqlx::query(AssertSqlSafe(format!(
            "SELECT (SELECT count(*) FROM \"{s}\".tasks) + (SELECT count(*) FROM \"{s}\".attempts)
                  + (SELECT count(*) FROM \"{s}\".handoffs) + (SELECT count(*) FROM \"{s}\".reopenings)
                  + (SELECT count(*) FROM \"{s}\".effects)"
        )))
        .fetch_one(&mut *conn)
        .await
        .expect("count rows")
        .get(0);
        u64::try_from(n).expect("a count is not negative")
    }
}

/// The fixture's transaction stays open: the claim runs inside a savepoint
/// of it, which is then rolled back.
#[async_trait]
impl RollbackFixture for PgTxFixture {
    async fn claim_rolled_back(&self, id: TaskId, request: ClaimRequest) -> Claim {
        self.savepoint("SAVEPOINT rolled_back_claim").await;
        let claim = self
            .store
            .claim(id, request)
            .await
            .expect("claim in the savepoint");
        self.savepoint("ROLLBACK TO SAVEPOINT rolled_back_claim").await;
        claim
    }

    async fn fence_in_transaction(&self, lease: &Lease) -> crate::Result<Fenced<()>> {
        self.store.fence(lease).await
    }
}

impl PgTxFixture {
    async fn savepoint(&self, statement: &'static str) {
        let mut conn = self.store.conn().await.expect("the transaction's connection");
        sqlx::raw_sql(statement)
            .execute(&mut *conn)
            .await
            .expect("a savepoint of the transaction");
    }
}

impl InspectFixture for PgTxFixture {
    fn inspector(&self) -> Arc<dyn Inspect> {
        self.store.clone()
    }
}

/// A schema with a fresh unique name that is dropped (with everything in it)
/// when this value is dropped: for a test's or a harness run's own tables.
///
/// Its name is `<prefix><unix seconds>_<unique>`; making one also drops the
/// schemas with the same prefix that are over an hour old, left behind by
/// runs that were killed before they could clean up. The schema itself is
/// not created: the first migration or `CREATE SCHEMA` does that.
///
/// ```no_run
/// # #[tokio::main] async fn main() {
/// use taskfence::testing::TempSchema;
/// let schema = TempSchema::new("postgres://postgres@127.0.0.1:5432/test", "app_test_").await;
/// assert!(schema.name().starts_with("app_test_"));
/// // … CREATE SCHEMA, tables, the test …
/// drop(schema); // DROP SCHEMA … CASCADE
/// # }
/// ```
#[derive(Debug)]
pub struct TempSchema {
    name: String,
    url: String,
}

impl TempSchema {
    /// A fresh name under `prefix` (a lowercase identifier ending in `_`) on
    /// the server at `url`; stale schemas under the same prefix are dropped.
    ///
    /// # Panics
    ///
    /// When `prefix` is not a lowercase SQL identifier.
    pub async fn new(url: &str, prefix: &str) -> Self {
        assert!(
            prefix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "not a lowercase identifier prefix: {prefix}"
        );
        if let Ok(options) = url.parse::<PgConnectOptions>() {
            drop_stale_schemas(&options.disable_statement_logging(), prefix).await;
        }
        let unique = uuid::Uuid::now_v7().simple().to_string();
        Self {
            name: format!("{prefix}{}_{}", unix_secs(), &unique[unique.len() - 12..]),
            url: url.to_owned(),
        }
    }

    /// The schema's name (use it quoted or as is: it is a plain identifier).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server URL the schema lives on.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Keeps the schema (for inspection after a run): it is not dropped, and
    /// its name is returned. A later [`TempSchema::new`] under the same prefix
    /// drops it once it is over an hour old.
    ///
    /// ```no_run
    /// # async fn f(schema: taskfence::testing::TempSchema) {
    /// let kept: String = schema.keep();
    /// println!("left {kept} for inspection");
    /// # }
    /// ```
    pub fn keep(mut self) -> String {
        std::mem::take(&mut self.name)
    }
}

impl Drop for TempSchema {
    /// Drops the schema on a short-lived thread with its own runtime (Drop
    /// cannot await); a failure leaves it for the stale-schema cleanup. A lock
    /// timeout bounds the wait: a transaction the test dropped may still hold
    /// locks on a pooled connection that only this (blocked) runtime would release.
    fn drop(&mut self) {
        if self.name.is_empty() {
            return; // kept
        }
        let (url, schema) = (self.url.clone(), self.name.clone());
        let dropper = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let options: PgConnectOptions = url.parse().ok()?;
                let mut conn = options.disable_statement_logging().connect().await.ok()?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "SET lock_timeout = '3s'; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                )))
                .execute(&mut conn)
                .await
                .ok()?;
                conn.close().await.ok()
            })
        });
        let _ = dropper.join();
    }
}

/// Redefines `schema`'s store clock as `clock_timestamp()` plus `offset`.
fn clock_at(schema: &str, offset: Duration) -> String {
    format!(
        "CREATE OR REPLACE FUNCTION \"{schema}\".store_clock() RETURNS timestamptz
             LANGUAGE sql VOLATILE PARALLEL SAFE
             AS $$ SELECT clock_timestamp() + interval '{} microseconds' $$",
        offset.as_micros()
    )
}

/// `by` rounded up to the server's microsecond: the clock moves by at least `by`.
fn round_up_to_micros(by: Duration) -> Duration {
    Duration::from_micros(u64::try_from(by.as_nanos().div_ceil(1000)).unwrap_or(u64::MAX))
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Drops schemas under `prefix` left behind by killed runs (older than [`STALE_AFTER`]).
async fn drop_stale_schemas(options: &PgConnectOptions, prefix: &str) {
    let Ok(mut conn) = options.connect().await else {
        return;
    };
    let cutoff = unix_secs().saturating_sub(STALE_AFTER.as_secs());
    let names: Vec<String> = sqlx::query("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)")
        .bind(prefix)
        .fetch_all(&mut conn)
        .await
        .map(|rows| rows.iter().map(|r| r.get(0)).collect())
        .unwrap_or_default();
    for name in names {
        let created = name[prefix.len()..]
            .split('_')
            .next()
            .and_then(|s| s.parse::<u64>().ok());
        if created.is_some_and(|secs| secs < cutoff) {
            let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE")))
                .execute(&mut conn)
                .await;
        }
    }
    let _ = conn.close().await;
}
