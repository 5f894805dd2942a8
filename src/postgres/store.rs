//! [`PgStore`]: the type, its builder, and the pool path of every operation
//! (a pooled connection per call, then the same code as on the caller's
//! connection, in `ops`).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::{PgConnection, PgPool};

use crate::backend::{Backend, InspectBackend};
use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::{Error, Result};
use crate::inspect::{CappedCounts, Counts, Page, Story, TaskQuery};
use crate::policy::Failure;
use crate::store::{Attempt, Claim, ClaimNext, ClaimRequest, Fenced, Lease, ReopenRequest, Retry, Submitted};
use crate::task::{NewTask, RequestKey, Response, Task, TaskId};

use super::conn::OnConnection;
use super::schema::{DEFAULT_SCHEMA, Schema};
use super::sql::Statements;
use super::{db, migrate, ops, reads};

/// The PostgreSQL [`TaskStore`](crate::TaskStore): durable, safe under any number of concurrent
/// workers and API replicas, one round trip per operation.
///
/// Cheap to clone (the pool is shared). Create the schema once with
/// [`PgStore::migrate`] (or run `migrations/` with your own tool).
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use taskfence::{Claim, ClaimRequest, InputHash, NewTask, PgStore, RequestKey, Response, TaskStore};
///
/// let pool = sqlx::postgres::PgPoolOptions::new()
///     .test_before_acquire(false) // no extra ping per operation
///     .connect("postgres://postgres@127.0.0.1:5432/test")
///     .await?;
/// let store = PgStore::new(pool);
/// store.migrate().await?;
///
/// let key = RequestKey::new("user-1", "chat.reply", "req-1");
/// let task = store.submit(NewTask::new(key, InputHash::of(["msg-1"]))).await?.into_task();
/// if let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("worker-a", Duration::from_secs(30))).await? {
///     let saved = store.complete(lease, Response::from("hello")).await?;
///     assert!(saved.is_accepted());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgStore {
    pub(super) pool: PgPool,
    pub(super) schema: Schema,
    pub(super) sql: Arc<Statements>,
    /// Set once the schema's history was found current (or this store
    /// migrated it): until then each operation checks it first.
    pub(super) migrated: Arc<AtomicBool>,
    /// The channel submissions notify, if they do.
    pub(super) notify: Option<String>,
    /// The statement timeout of every [`Inspect`](crate::inspect::Inspect) read.
    pub(super) read_timeout: Duration,
}

/// The channel of a schema's submissions: `<schema>_submitted`, the schema
/// cut to fit PostgreSQL's 63-byte identifiers (two schemas that share
/// their first 53 bytes share a channel: a spurious wake-up at worst).
fn notify_channel(schema: &str) -> String {
    const SUFFIX: &str = "_submitted";
    let keep = schema.len().min(63 - SUFFIX.len());
    format!("{}{SUFFIX}", &schema[..keep])
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.schema.name())
            .field("pool", &self.pool)
            .field("read_timeout", &self.read_timeout)
            .finish()
    }
}

/// Configures a [`PgStore`]: today, the schema its tables live in.
///
/// ```no_run
/// # fn f(pool: sqlx::PgPool) -> taskfence::Result<()> {
/// let store = taskfence::PgStore::builder(pool).schema("jobs").build()?;
/// assert_eq!(store.schema(), "jobs");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "call build() to get the store"]
pub struct PgStoreBuilder {
    pool: PgPool,
    schema: String,
    notify: bool,
    read_timeout: Duration,
}

impl PgStoreBuilder {
    /// The schema for the tables (a lowercase SQL identifier). Default [`DEFAULT_SCHEMA`].
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Makes every submission of a task without a handoff
    /// ([`NewTask::without_handoff`](crate::NewTask::without_handoff)) also
    /// `NOTIFY` [`PgStore::notify_channel`] with the task's operation, in the
    /// same statement, so consumers in other processes can start it at once
    /// ([`StoreQueue::wake_on_notify`](crate::runtime::StoreQueue::wake_on_notify))
    /// instead of at their next poll. Off by default: PostgreSQL serializes
    /// the commits of notifying transactions on one lock, which costs
    /// enqueue throughput under load (`docs/PERFORMANCE.md` measures it).
    ///
    /// ```no_run
    /// # fn f(pool: sqlx::PgPool) -> taskfence::Result<()> {
    /// let store = taskfence::PgStore::builder(pool).notify_on_submit().build()?;
    /// assert_eq!(store.notify_channel(), Some("taskfence_submitted"));
    /// # Ok(()) }
    /// ```
    pub fn notify_on_submit(mut self) -> Self {
        self.notify = true;
        self
    }

    /// How long each of the operator's reads ([`Inspect`](crate::inspect::Inspect):
    /// listings, counts, stories, stranded tasks) may run before the server
    /// cancels it (`SET LOCAL statement_timeout` in the read's transaction)
    /// and the call answers [`Error::ReadTimeout`](crate::Error::ReadTimeout).
    /// Default [`DEFAULT_READ_TIMEOUT`](super::DEFAULT_READ_TIMEOUT) (5 s); at least a millisecond.
    ///
    /// ```no_run
    /// # fn f(pool: sqlx::PgPool) -> taskfence::Result<()> {
    /// let store = taskfence::PgStore::builder(pool).read_timeout(std::time::Duration::from_secs(2)).build()?;
    /// # Ok(()) }
    /// ```
    pub fn read_timeout(mut self, limit: Duration) -> Self {
        self.read_timeout = limit.max(Duration::from_millis(1));
        self
    }

    /// Builds the store; fails with [`InvalidInput::NotAnIdentifier`](crate::error::InvalidInput::NotAnIdentifier) for a bad schema name.
    pub fn build(self) -> Result<PgStore> {
        let schema = Schema::new(&self.schema)?;
        let notify = self.notify.then(|| notify_channel(schema.name()));
        Ok(PgStore {
            sql: Arc::new(Statements::new(&schema.quoted(), notify.as_deref())),
            notify,
            pool: self.pool,
            schema,
            migrated: Arc::default(),
            read_timeout: self.read_timeout,
        })
    }
}

impl PgStore {
    /// A store in the [`DEFAULT_SCHEMA`] schema.
    ///
    /// Build the pool with `test_before_acquire(false)` to keep each operation
    /// at one round trip (otherwise sqlx pings the connection first).
    ///
    /// ```no_run
    /// # fn f(pool: sqlx::PgPool) {
    /// let store = taskfence::PgStore::new(pool);
    /// # }
    /// ```
    pub fn new(pool: PgPool) -> Self {
        Self::builder(pool)
            .build()
            .expect("the default schema name is valid")
    }

    /// A builder, to choose the schema.
    ///
    /// ```no_run
    /// # fn f(pool: sqlx::PgPool) -> taskfence::Result<()> {
    /// let store = taskfence::PgStore::builder(pool).schema("taskfence_test_1").build()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(pool: PgPool) -> PgStoreBuilder {
        PgStoreBuilder {
            pool,
            schema: DEFAULT_SCHEMA.to_owned(),
            notify: false,
            read_timeout: super::DEFAULT_READ_TIMEOUT,
        }
    }

    /// The schema the tables live in.
    ///
    /// ```no_run
    /// # fn f(pool: sqlx::PgPool) {
    /// assert_eq!(taskfence::PgStore::new(pool).schema(), "taskfence");
    /// # }
    /// ```
    pub fn schema(&self) -> &str {
        self.schema.name()
    }

    /// The channel this store's submissions `NOTIFY`, when built with
    /// [`notify_on_submit`](PgStoreBuilder::notify_on_submit); `None` otherwise.
    ///
    /// ```no_run
    /// # fn f(pool: sqlx::PgPool) {
    /// assert_eq!(taskfence::PgStore::new(pool).notify_channel(), None);
    /// # }
    /// ```
    pub fn notify_channel(&self) -> Option<&str> {
        self.notify.as_deref()
    }

    /// The pool the store runs on.
    ///
    /// ```no_run
    /// # fn f(store: taskfence::PgStore) {
    /// let pool: &sqlx::PgPool = store.pool();
    /// # }
    /// ```
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The SQL of every operation, rendered for this store's schema, by name
    /// (`"claim"`, `"complete"`, `"due"`…; `"read"` is the re-read that
    /// classifies a refused write): to review them, or `EXPLAIN` them on your
    /// own data as `docs/POSTGRES.md` does.
    ///
    /// ```no_run
    /// # fn f(store: taskfence::PgStore) {
    /// for (name, sql) in store.statements() {
    ///     println!("-- {name}\n{sql};");
    /// }
    /// # }
    /// ```
    pub fn statements(&self) -> Vec<(&'static str, &str)> {
        self.sql.all()
    }

    /// Applies the embedded migrations to this store's schema (see [`migrate`]).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn migrate(&self) -> Result<()> {
        migrate::run(&self.pool, &self.schema).await?;
        self.migrated.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Every operation on the caller's connection or transaction (typically
    /// `&mut *tx`): the application's own writes and the task's change
    /// commit or roll back together. It runs exactly the code of the pool
    /// path, with the same input checks and span.
    ///
    /// Use Read Committed (PostgreSQL's default): under Repeatable Read a
    /// concurrent update surfaces as a serialization failure
    /// ([`Error::Storage`]). A fenced write holds the task's row lock until
    /// the caller commits: keep such a transaction short.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, new: taskfence::NewTask) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("INSERT INTO messages (id, body) VALUES ($1, $2)")
    ///     .bind(42_i64)
    ///     .bind("What are the key decisions?")
    ///     .execute(&mut *tx)
    ///     .await?;
    /// let task = store.on(&mut tx).submit(new).await?.into_task();
    /// tx.commit().await?; // message, task and handoff: all or nothing
    /// # Ok(()) }
    /// ```
    pub fn on<'c>(&'c self, conn: &'c mut PgConnection) -> OnConnection<'c> {
        OnConnection::new(self, conn)
    }

    /// A pooled connection, once the schema is known to be current.
    pub(super) async fn acquire(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        self.check_schema(&mut conn).await?;
        Ok(conn)
    }

    /// [`Error::NotMigrated`] unless the schema's history reaches this
    /// library's latest migration. One read, until it passes once.
    pub(super) async fn check_schema(&self, conn: &mut PgConnection) -> Result<()> {
        if self.migrated.load(Ordering::Relaxed) {
            return Ok(());
        }
        let version: Option<i64> = self
            .sql
            .schema_version
            .query()
            .fetch_one(conn)
            .await
            .map_err(db)?
            .try_get(0)
            .map_err(db)?;
        match version {
            Some(v) if v >= migrate::LATEST => {
                self.migrated.store(true, Ordering::Relaxed);
                Ok(())
            }
            v => Err(Error::NotMigrated {
                detail: format!(
                    "schema {} is at migration {}, this library needs {}",
                    self.schema.name(),
                    v.unwrap_or(0),
                    migrate::LATEST
                ),
                fix: super::MIGRATE_FIX,
            }),
        }
    }
}

/// The pool path: each operation on a pooled connection, by the same code
/// as [`OnConnection`]'s.
#[async_trait]
impl Backend for PgStore {
    async fn submit(&self, task: NewTask) -> Result<Submitted> {
        ops::submit(&self.sql, &mut *self.acquire().await?, task).await
    }

    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        ops::get(&self.sql, &mut *self.acquire().await?, id).await
    }

    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        ops::find(&self.sql, &mut *self.acquire().await?, key).await
    }

    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        ops::claim(&self.sql, &mut *self.acquire().await?, id, request).await
    }

    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        ops::renew(&self.sql, &mut *self.acquire().await?, lease, extend_by).await
    }

    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        ops::complete(&self.sql, &mut *self.acquire().await?, lease, response).await
    }

    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        ops::fail(&self.sql, &mut *self.acquire().await?, lease, failure).await
    }

    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        ops::release(&self.sql, &mut *self.acquire().await?, lease).await
    }

    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        ops::cancel(&self.sql, &mut *self.acquire().await?, id, reason).await
    }

    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        ops::record_operation(&self.sql, &mut *self.acquire().await?, lease, operation_id).await
    }

    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        ops::attempts(&self.sql, &mut *self.acquire().await?, id).await
    }

    async fn begin_effect(&self, lease: &Lease, name: &str) -> Result<Fenced<EffectStart>> {
        ops::begin_effect(&self.sql, &mut *self.acquire().await?, lease, name).await
    }

    async fn finish_effect(
        &self,
        lease: &Lease,
        name: &str,
        outcome: EffectOutcome,
    ) -> Result<Fenced<Effect>> {
        ops::finish_effect(&self.sql, &mut *self.acquire().await?, lease, name, &outcome).await
    }

    async fn effects(&self, id: TaskId) -> Result<Vec<Effect>> {
        ops::effects(&self.sql, &mut *self.acquire().await?, id).await
    }

    async fn reopen(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>> {
        ops::reopen(&self.sql, &mut *self.acquire().await?, id, request).await
    }

    async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
        ops::due(&self.sql, &mut *self.acquire().await?, limit).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        ops::purge_expired(&self.sql, &mut *self.acquire().await?, limit).await
    }

    async fn claim_many(&self, ids: &[TaskId], request: ClaimRequest) -> Result<Vec<Claim>> {
        ops::claim_many(&self.sql, &mut *self.acquire().await?, ids, request).await
    }

    async fn complete_many(&self, completions: Vec<(Lease, Response)>) -> Result<Vec<Result<Fenced<Task>>>> {
        ops::complete_many(&self.sql, &mut *self.acquire().await?, completions).await
    }

    async fn claim_next(&self, request: ClaimNext) -> Result<Vec<Lease>> {
        ops::claim_next(&self.sql, &mut *self.acquire().await?, request).await
    }

    async fn renew_many(&self, leases: &mut [Lease], extend_by: Duration) -> Result<Vec<Fenced<()>>> {
        ops::renew_many(&self.sql, &mut *self.acquire().await?, leases, extend_by).await
    }
}

#[async_trait]
impl InspectBackend for PgStore {
    async fn list(&self, query: &TaskQuery) -> Result<Page> {
        let mut conn = self.acquire().await?;
        let mut tx = reads::begin(&mut conn, self.read_timeout).await?;
        let page = ops::list(&self.sql, &mut tx, query).await;
        reads::finish(tx, page, self.read_timeout).await
    }

    async fn counts(&self, scope: Option<&str>) -> Result<Counts> {
        let mut conn = self.acquire().await?;
        let mut tx = reads::begin(&mut conn, self.read_timeout).await?;
        let counts = ops::counts(&self.sql, &mut tx, scope).await;
        reads::finish(tx, counts, self.read_timeout).await
    }

    async fn counts_up_to(&self, scope: Option<&str>, cap: u64) -> Result<CappedCounts> {
        let mut conn = self.acquire().await?;
        let mut tx = reads::begin(&mut conn, self.read_timeout).await?;
        let counts = reads::counts_up_to(&self.sql, &mut tx, scope, cap).await;
        reads::finish(tx, counts, self.read_timeout).await
    }

    async fn story(&self, id: TaskId) -> Result<Option<Story>> {
        let mut conn = self.acquire().await?;
        let mut tx = reads::begin(&mut conn, self.read_timeout).await?;
        let story = ops::story(&self.sql, &mut tx, id).await;
        reads::finish(tx, story, self.read_timeout).await
    }

    async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<Task>> {
        let mut conn = self.acquire().await?;
        let mut tx = reads::begin(&mut conn, self.read_timeout).await?;
        let stranded = ops::stranded(&self.sql, &mut tx, older_than, limit).await;
        reads::finish(tx, stranded, self.read_timeout).await
    }
}
