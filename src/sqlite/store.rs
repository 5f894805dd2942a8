//! [`SqliteStore`]: the type and its builder. Its operations are the one
//! backend implementation (`backend.rs`) on the pool (`site.rs`).

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, SqliteConnection, Transaction};
use time::OffsetDateTime;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};

use super::conn::SqliteConnStore;
use super::group::Group;
use super::site::Busy;
use super::{db, migrate, sql};

/// The SQLite [`TaskStore`](crate::TaskStore): durable in one file, one
/// writer at a time with readers alongside (WAL), any number of processes
/// on one machine.
///
/// Cheap to clone (the pool is shared). Create the tables once with
/// [`SqliteStore::migrate`]. How writes, busy files and the clock work is in
/// the [module docs](crate::sqlite).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use taskfence::{Claim, ClaimRequest, InputHash, NewTask, RequestKey, Response, SqliteStore, TaskStore};
///
/// # let dir = std::env::temp_dir().join(format!("taskfence-doc-{}", uuid::Uuid::now_v7()));
/// # std::fs::create_dir_all(&dir)?;
/// let store = SqliteStore::open(dir.join("tasks.db")).await?;
/// store.migrate().await?;
///
/// let key = RequestKey::new("user-1", "chat.reply", "req-1");
/// let task = store.submit(NewTask::new(key, InputHash::of(["msg-1"]))).await?.into_task();
/// if let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("worker-a", Duration::from_secs(30))).await? {
///     let saved = store.complete(lease, Response::from("hello")).await?;
///     assert!(saved.is_accepted());
/// }
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    pub(super) pool: SqlitePool,
    clock: Arc<dyn Clock>,
    busy_budget: Duration,
    /// Whether submissions write handoffs ([`SqliteStoreBuilder::without_handoffs`]).
    pub(super) handoffs: bool,
    /// This process's writes: they share one transaction and one commit
    /// while they arrive together (group commit), instead of taking SQLite's
    /// write lock one after another.
    pub(super) group: Arc<Group>,
    /// Set once the file's history was found current (or this store
    /// migrated it): until then each operation checks it first.
    migrated: Arc<AtomicBool>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("pool", &self.pool)
            .field("clock", &self.clock)
            .field("busy_budget", &self.busy_budget)
            .finish_non_exhaustive()
    }
}

/// Configures a [`SqliteStore`]: the file's connection options, the pool
/// size, the busy budget, the clock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use std::time::Duration;
/// # let path = std::env::temp_dir().join(format!("taskfence-doc-{}.db", uuid::Uuid::now_v7()));
/// let store = taskfence::SqliteStore::builder(&path)
///     .busy_budget(Duration::from_secs(5))
///     .max_connections(4)
///     .open()
///     .await?;
/// # drop(store);
/// # let _ = std::fs::remove_file(&path);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "call open() to get the store"]
pub struct SqliteStoreBuilder {
    options: SqliteConnectOptions,
    max_connections: u32,
    busy_budget: Duration,
    clock: Arc<dyn Clock>,
    handoffs: bool,
}

impl SqliteStoreBuilder {
    /// The connection options in place of [`SqliteStore::connect_options`]'s
    /// (keep WAL and a `busy_timeout`: the store's guarantees rely on neither,
    /// but concurrency and busy handling do).
    pub fn options(mut self, options: SqliteConnectOptions) -> Self {
        self.options = options;
        self
    }

    /// How long one try of a write waits for another process's write lock
    /// inside SQLite (`busy_timeout`). Default [`SqliteStore::DEFAULT_BUSY_TIMEOUT`].
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.options = self.options.busy_timeout(timeout);
        self
    }

    /// How long in all a call keeps trying when the file stays locked by
    /// another writer, before it answers [`Error::Busy`] (nothing written).
    /// Default [`SqliteStore::DEFAULT_BUSY_BUDGET`].
    pub fn busy_budget(mut self, budget: Duration) -> Self {
        self.busy_budget = budget;
        self
    }

    /// The pool's connections (readers run side by side; writers one at a
    /// time). Default 8, at least 1.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// The clock the store reads (the system clock by default; a
    /// [`ManualClock`](crate::clock::ManualClock) in tests). Every process
    /// on one file must read the same clock.
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Makes every submission go without a handoff, whatever the task says:
    /// for an application that runs no dispatcher (its consumers take work
    /// with `claim_next`), so nothing accumulates unpublished until the
    /// purge. [`NewTask::without_handoff`](crate::NewTask::without_handoff)
    /// does the same for one task. By default each submission writes one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("taskfence-doc-{}.db", uuid::Uuid::now_v7()));
    /// let store = taskfence::SqliteStore::builder(&path).without_handoffs().open().await?;
    /// # Ok(()) }
    /// ```
    pub fn without_handoffs(mut self) -> Self {
        self.handoffs = false;
        self
    }

    /// Opens (creating it if missing) the file and its pool.
    pub async fn open(self) -> Result<SqliteStore> {
        let pool = SqlitePoolOptions::new()
            .max_connections(self.max_connections)
            .test_before_acquire(false)
            .connect_with(self.options)
            .await
            .map_err(db)?;
        let mut store = SqliteStore::assemble(pool, self.clock, self.busy_budget);
        store.handoffs = self.handoffs;
        Ok(store)
    }
}

impl SqliteStore {
    /// How long one try waits for another process's write lock (`busy_timeout`): 1 s.
    pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(1);
    /// How long in all a call keeps trying on a locked file: 30 s.
    pub const DEFAULT_BUSY_BUDGET: Duration = Duration::from_secs(30);

    /// Opens the store in the file at `path` (created if missing) with the
    /// default options.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("taskfence-doc-{}.db", uuid::Uuid::now_v7()));
    /// let store = taskfence::SqliteStore::open(&path).await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::builder(path).open().await
    }

    /// A builder for the file at `path`.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            options: Self::connect_options(path),
            max_connections: 8,
            busy_budget: Self::DEFAULT_BUSY_BUDGET,
            clock: Arc::new(SystemClock),
            handoffs: true,
        }
    }

    /// The connection options the store uses for `path`: created if
    /// missing, WAL journal (readers alongside the one writer),
    /// `synchronous = FULL` (a commit is on disk when it returns), a
    /// [`DEFAULT_BUSY_TIMEOUT`](Self::DEFAULT_BUSY_TIMEOUT). Start from
    /// these to change one (e.g. `synchronous = NORMAL`: faster, and a power
    /// loss may lose the last commits, never corrupt the file).
    ///
    /// ```
    /// let options = taskfence::SqliteStore::connect_options("tasks.db")
    ///     .synchronous(sqlx::sqlite::SqliteSynchronous::Normal);
    /// ```
    pub fn connect_options(path: impl AsRef<Path>) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Self::DEFAULT_BUSY_TIMEOUT)
    }

    /// A store on an existing pool (built from [`connect_options`](Self::connect_options)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let path = std::env::temp_dir().join(format!("taskfence-doc-{}.db", uuid::Uuid::now_v7()));
    /// let pool = sqlx::SqlitePool::connect_with(taskfence::SqliteStore::connect_options(&path)).await?;
    /// let store = taskfence::SqliteStore::new(pool);
    /// # Ok(()) }
    /// ```
    pub fn new(pool: SqlitePool) -> Self {
        Self::assemble(pool, Arc::new(SystemClock), Self::DEFAULT_BUSY_BUDGET)
    }

    fn assemble(pool: SqlitePool, clock: Arc<dyn Clock>, busy_budget: Duration) -> Self {
        Self {
            pool,
            clock,
            busy_budget,
            handoffs: true,
            group: Arc::default(),
            migrated: Arc::default(),
        }
    }

    /// The pool the store runs on (for the application's own tables).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The store's instant: its clock, read by each operation once its
    /// transaction holds the write lock.
    pub(crate) fn now(&self) -> OffsetDateTime {
        self.clock.now()
    }

    pub(crate) fn busy_budget(&self) -> Duration {
        self.busy_budget
    }

    /// Applies the embedded migrations to the file (see [`migrate`](super::migrate())).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("taskfence-doc-{}.db", uuid::Uuid::now_v7()));
    /// let store = taskfence::SqliteStore::open(&path).await?;
    /// store.migrate().await?;
    /// store.migrate().await?; // applied once
    /// # Ok(()) }
    /// ```
    pub async fn migrate(&self) -> Result<()> {
        let _turn = self.group.exclusive().await?;
        migrate::run(&self.pool, self.busy_budget).await?;
        self.migrated.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// A transaction on a pooled connection that holds the write lock from
    /// its start (`BEGIN IMMEDIATE`), waited for within the busy budget: for
    /// the application's own writes together with the store's, through
    /// [`on`](Self::on). Nothing in it can then fail with a busy file, and
    /// nothing else writes until it ends: keep it short.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let path = std::env::temp_dir().join(format!("taskfence-doc-{}.db", uuid::Uuid::now_v7()));
    /// # let store = taskfence::SqliteStore::open(&path).await?;
    /// # store.migrate().await?;
    /// use taskfence::{InputHash, NewTask, RequestKey, TaskStore};
    /// sqlx::query("CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, body TEXT)").execute(store.pool()).await?;
    /// let mut tx = store.begin().await?;
    /// sqlx::query("INSERT INTO messages (id, body) VALUES (?1, ?2)").bind(42_i64).bind("Hello").execute(&mut *tx).await?;
    /// let new = NewTask::new(RequestKey::new("u", "chat.reply", "m-42"), InputHash::of(["42"]));
    /// let task = store.on(&mut tx).submit(new).await?.into_task();
    /// tx.commit().await?; // message, task and handoff: all or nothing
    /// # Ok(()) }
    /// ```
    pub async fn begin(&self) -> Result<Transaction<'static, Sqlite>> {
        self.check_schema(&mut *self.pool.acquire().await.map_err(db)?)
            .await?;
        let mut busy = Busy::new(self.busy_budget);
        loop {
            match self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(db) {
                Ok(tx) => return Ok(tx),
                Err(Error::Busy { .. }) if busy.again().await => continue,
                Err(Error::Busy { .. }) => {
                    return Err(Error::Busy {
                        waited: busy.waited(),
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// This store on the caller's connection or transaction (typically
    /// `&mut tx` from [`begin`](Self::begin)): a
    /// [`TaskStore`](crate::TaskStore) and [`Inspect`](crate::inspect::Inspect)
    /// whose every operation runs there, so the application's own writes and
    /// the task's change commit or roll back together. What that means is
    /// on [`SqliteConnStore`].
    pub fn on<'c>(&self, conn: &'c mut SqliteConnection) -> SqliteConnStore<'c> {
        SqliteConnStore::new(self.clone(), conn)
    }

    /// [`check_schema`](Self::check_schema) on a pooled connection, taken
    /// only until the check passes once.
    pub(crate) async fn ensure_schema(&self) -> Result<()> {
        if self.migrated.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.check_schema(&mut *self.pool.acquire().await.map_err(db)?)
            .await
    }

    /// [`Error::NotMigrated`] unless the file's history reaches this
    /// library's latest migration. One read, until it passes once.
    pub(crate) async fn check_schema(&self, conn: &mut SqliteConnection) -> Result<()> {
        if self.migrated.load(Ordering::Relaxed) {
            return Ok(());
        }
        let version: Option<i64> = sqlx::query_scalar(sql::SCHEMA_VERSION)
            .fetch_one(conn)
            .await
            .map_err(db)?;
        match version {
            Some(v) if v >= migrate::LATEST => {
                self.migrated.store(true, Ordering::Relaxed);
                Ok(())
            }
            v => Err(Error::NotMigrated {
                detail: format!(
                    "the file is at migration {}, this library needs {}",
                    v.unwrap_or(0),
                    migrate::LATEST
                ),
                fix: super::MIGRATE_FIX,
            }),
        }
    }
}
