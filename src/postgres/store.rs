//! [`PgStore`]: the type and its builder. Its operations are the one
//! backend implementation (`backend.rs`) on the pool (`site.rs`).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::{PgConnection, PgPool};

use crate::error::{Error, Result};

use super::conn::PgConnStore;
use super::schema::{DEFAULT_SCHEMA, Schema};
use super::sql::Statements;
use super::{db, migrate};

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
    /// Whether submissions write handoffs (see [`PgStoreBuilder::without_handoffs`]).
    pub(super) handoffs: bool,
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
            .field("handoffs", &self.handoffs)
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
    handoffs: bool,
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

    /// No submission through this store writes a handoff row, whatever the
    /// [`NewTask`](crate::NewTask) says: for an application that runs no
    /// dispatcher (its workers take tasks with
    /// [`claim_next`](crate::TaskStore::claim_next), or it publishes on its
    /// own), so nothing accumulates unpublished in the outbox until the
    /// purge. By default every submission writes one (the transactional
    /// outbox, as since 0.1.0) unless the task was submitted
    /// [`without_handoff`](crate::NewTask::without_handoff); a reopening
    /// writes one when its task had one. `DynamoStore` has the same switch.
    ///
    /// ```no_run
    /// # fn f(pool: sqlx::PgPool) -> taskfence::Result<()> {
    /// let store = taskfence::PgStore::builder(pool).without_handoffs().build()?;
    /// # Ok(()) }
    /// ```
    pub fn without_handoffs(mut self) -> Self {
        self.handoffs = false;
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
            handoffs: self.handoffs,
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
            handoffs: true,
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

    /// This store on the caller's connection or transaction (typically
    /// `&mut tx`): a [`TaskStore`](crate::TaskStore) and
    /// [`Inspect`](crate::inspect::Inspect) whose every operation runs there,
    /// so the application's own writes and the task's change commit or roll
    /// back together. It runs exactly the code of the pool path, with the
    /// same input checks and span; what running inside the caller's
    /// transaction means (locks, leases, rollback) is on [`PgConnStore`].
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, new: taskfence::NewTask) -> Result<(), Box<dyn std::error::Error>> {
    /// use taskfence::TaskStore;
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
    pub fn on<'c>(&self, conn: &'c mut PgConnection) -> PgConnStore<'c> {
        PgConnStore::new(self.clone(), conn)
    }

    /// [`Error::NotMigrated`] unless the schema's history reaches this
    /// library's latest migration. One read, until it passes once.
    pub(crate) async fn check_schema(&self, conn: &mut PgConnection) -> Result<()> {
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
