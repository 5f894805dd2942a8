//! [`SqliteFixture`]: the conformance [`Fixture`] for [`SqliteStore`], one
//! fresh database file per fixture (in a temporary directory removed when
//! the fixture is dropped), on a [`ManualClock`] so leases, backoffs and
//! deadlines pass without sleeping. Re-exported from [`crate::testing`]
//! (features `sqlite` and `testing`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::ManualClock;
use crate::inspect::Inspect;
use crate::sqlite::SqliteStore;
use crate::store::{Claim, ClaimRequest, Fenced, Lease, TaskStore};
use crate::task::TaskId;
use crate::testing::{FencedWritesFixture, Fixture, InspectFixture, OutboxFixture, RollbackFixture};

/// A [`SqliteStore`] in a fresh, migrated file of its own, on a manual
/// clock, with a real row count. The file (and its directory) is removed
/// when the fixture is dropped.
///
/// The clock: a store reads its [`Clock`](crate::clock::Clock) once each
/// operation holds the write lock; the fixture's store reads a
/// [`ManualClock`] that [`advance`](Fixture::advance) moves. Other stores on
/// the same file (another process's, [`reopen`](Self::reopen)'s) read their
/// own clock: give them the fixture's ([`clock`](Self::clock)) to share its time.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use taskfence::testing::{Fixture, SqliteFixture};
/// let fixture = SqliteFixture::new().await;
/// assert_eq!(fixture.record_count().await, 0);
/// fixture.advance(std::time::Duration::from_secs(31)).await; // leases granted before now expired
/// # }
/// ```
#[derive(Debug)]
pub struct SqliteFixture {
    store: SqliteStore,
    clock: ManualClock,
    // Last: removed after the store's pool is closed.
    dir: TempDir,
}

impl SqliteFixture {
    /// A fixture in a fresh file under the system's temporary directory.
    ///
    /// # Panics
    ///
    /// When the file cannot be created or migrated.
    pub async fn new() -> Self {
        let dir = TempDir::new();
        let clock = ManualClock::default();
        let store = SqliteStore::builder(dir.file())
            .clock(clock.clone())
            .open()
            .await
            .expect("open the fixture's file");
        store.migrate().await.expect("migrate the fixture's file");
        Self { store, clock, dir }
    }

    /// The concrete store (for `SqliteStore::on`, the dispatcher, the pool).
    pub fn sqlite_store(&self) -> &SqliteStore {
        &self.store
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.dir.file()
    }

    /// The clock the store runs on.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// Another store on the same file and clock, with its own pool: what a
    /// second process sees.
    ///
    /// # Panics
    ///
    /// When the file cannot be opened.
    pub async fn reopen(&self) -> SqliteStore {
        SqliteStore::builder(self.path())
            .clock(self.clock.clone())
            .open()
            .await
            .expect("open the fixture's file again")
    }

    /// Rows in one of the store's tables (`tasks`, `attempts`, `handoffs`, `reopenings`, `effects`).
    pub async fn count(&self, table: &str) -> i64 {
        assert!(
            matches!(
                table,
                "tasks" | "attempts" | "handoffs" | "reopenings" | "effects"
            ),
            "not a taskfence table: {table}"
        );
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(self.store.pool())
            .await
            .expect("count rows")
    }
}

#[async_trait]
impl Fixture for SqliteFixture {
    fn store(&self) -> Arc<dyn TaskStore> {
        Arc::new(self.store.clone())
    }

    async fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    async fn record_count(&self) -> u64 {
        let n: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM tasks) + (SELECT count(*) FROM attempts)
                  + (SELECT count(*) FROM handoffs) + (SELECT count(*) FROM reopenings)
                  + (SELECT count(*) FROM effects)",
        )
        .fetch_one(self.store.pool())
        .await
        .expect("count rows");
        u64::try_from(n).expect("a count is not negative")
    }
}

impl InspectFixture for SqliteFixture {
    fn inspector(&self) -> Arc<dyn Inspect> {
        Arc::new(self.store.clone())
    }
}

/// The outbox is the file's `handoffs` table.
#[async_trait]
impl OutboxFixture for SqliteFixture {
    type Store = SqliteStore;

    fn outbox(&self) -> SqliteStore {
        self.store.clone()
    }

    async fn handoff_count(&self) -> u64 {
        u64::try_from(self.count("handoffs").await).expect("a count is not negative")
    }
}

/// The application's rows live in `app_rows` of the same file, written in
/// one transaction with [`fence`](crate::sqlite::SqliteConnStore::fence):
/// the row goes first, so a refused fence shows the rollback.
#[async_trait]
impl FencedWritesFixture for SqliteFixture {
    async fn write_fenced(&self, lease: &Lease, row: &str) -> crate::Result<Fenced<()>> {
        let db = crate::Error::storage;
        sqlx::query("CREATE TABLE IF NOT EXISTS app_rows (row TEXT NOT NULL)")
            .execute(self.store.pool())
            .await
            .map_err(db)?;
        let mut tx = self.store.begin().await?;
        sqlx::query("INSERT INTO app_rows (row) VALUES (?1)")
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
        sqlx::query_scalar("SELECT row FROM app_rows")
            .fetch_all(self.store.pool())
            .await
            .unwrap_or_default()
    }
}

/// The claim runs on `on(&mut tx)` of the application's `BEGIN IMMEDIATE`
/// transaction, which is then rolled back.
#[async_trait]
impl RollbackFixture for SqliteFixture {
    async fn claim_rolled_back(&self, id: TaskId, request: ClaimRequest) -> Claim {
        let mut tx = self.store.begin().await.expect("begin a transaction");
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
        let mut tx = self.store.begin().await?;
        let fenced = self.store.on(&mut tx).fence(lease).await;
        tx.rollback().await.map_err(crate::Error::storage)?;
        fenced
    }
}

/// A directory of its own under the system's temporary directory, holding
/// the database file; removed (with the file, its WAL and shared-memory
/// files) when dropped.
#[derive(Debug)]
struct TempDir {
    dir: PathBuf,
    file: PathBuf,
}

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("taskfence-sqlite-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).expect("create the fixture's directory");
        let file = dir.join("taskfence.db");
        Self { dir, file }
    }

    fn file(&self) -> &Path {
        &self.file
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
