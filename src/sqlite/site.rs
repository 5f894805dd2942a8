//! [`Site`]: where a store's statements run — a pooled connection per
//! operation ([`SqliteStore`]), or the caller's connection or transaction
//! ([`SqliteConnStore`](super::SqliteConnStore)) — and [`run!`], the one
//! way an operation runs there: in a transaction (`BEGIN IMMEDIATE` for a
//! write, so the write lock is held before anything is read; a savepoint
//! inside the caller's transaction), at the store's instant read once the
//! lock is held, committed whole or rolled back whole, and tried again
//! while the busy budget lasts when the file was locked by another writer.

use std::future::Future;
use std::ops::DerefMut;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::SqliteConnection;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::Sqlite;

use crate::error::Result;

use super::group::Group;
use super::{SqliteStore, db};

/// Where the statements of one operation run.
pub(crate) trait Site: Send + Sync {
    /// A connection held for one operation: given back when dropped.
    type Conn<'a>: DerefMut<Target = SqliteConnection> + Send
    where
        Self: 'a;

    /// The store: its clock and busy budget.
    fn store(&self) -> &SqliteStore;

    /// The connection for one operation, once the store knows its tables
    /// are current ([`Error::NotMigrated`](crate::Error::NotMigrated) otherwise).
    fn conn(&self) -> impl Future<Output = Result<Self::Conn<'_>>> + Send;

    /// The batch this process's writes share ([`Group`]), when the site has
    /// one (the pool's); the caller's transaction holds SQLite's own lock
    /// instead, and each operation is a savepoint of it.
    fn group(&self) -> Option<&Arc<Group>>;
}

/// The pool path: each operation on a connection of its own, in a
/// transaction of its own.
impl Site for SqliteStore {
    type Conn<'a> = PoolConnection<Sqlite>;

    fn store(&self) -> &SqliteStore {
        self
    }

    async fn conn(&self) -> Result<PoolConnection<Sqlite>> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        self.check_schema(&mut conn).await?;
        Ok(conn)
    }

    fn group(&self) -> Option<&Arc<Group>> {
        Some(&self.group)
    }
}

/// Whether an operation writes (`BEGIN IMMEDIATE`: the write lock first)
/// or only reads (`BEGIN`: one snapshot, no lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A write.
    Write,
    /// A read.
    Read,
}

/// The operation's group, for a write on a site that has one.
pub(crate) fn grouped<S: Site + ?Sized>(site: &S, mode: Mode) -> Option<&Arc<Group>> {
    site.group().filter(|_| mode == Mode::Write)
}

/// Ends an operation's transaction (or savepoint) as its answer says:
/// committed when it succeeded, rolled back whole when it failed.
pub(crate) async fn settle<T>(tx: sqlx::Transaction<'_, Sqlite>, answer: Result<T>) -> Result<T> {
    match answer {
        Ok(value) => {
            tx.commit().await.map_err(db)?;
            Ok(value)
        }
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// Begins the operation's transaction on `conn`: its own (`BEGIN
/// IMMEDIATE` or `BEGIN`) when `conn` is in none, a savepoint inside the
/// caller's otherwise (so a failed operation leaves the caller's
/// transaction as it was).
pub(crate) async fn begin(conn: &mut SqliteConnection, mode: Mode) -> Result<sqlx::Transaction<'_, Sqlite>> {
    use sqlx::Connection as _;
    if conn.is_in_transaction() {
        return conn.begin().await.map_err(db);
    }
    let statement = match mode {
        Mode::Write => "BEGIN IMMEDIATE",
        Mode::Read => "BEGIN",
    };
    conn.begin_with(statement).await.map_err(db)
}

/// How long a call may keep trying when the file is locked, and how far it got.
#[derive(Debug)]
pub(crate) struct Busy {
    started: Instant,
    budget: Duration,
    tries: u32,
}

impl Busy {
    pub(crate) fn new(budget: Duration) -> Self {
        Self {
            started: Instant::now(),
            budget,
            tries: 0,
        }
    }

    /// Waits a moment before the next try; `false` once the budget is spent.
    pub(crate) async fn again(&mut self) -> bool {
        if self.started.elapsed() >= self.budget {
            return false;
        }
        self.tries += 1;
        // 1, 2, 4… ms up to 64 ms, with jitter so racing processes spread out.
        let base = 1u64 << self.tries.min(6);
        let jitter = crate::backend::jitter_unit(crate::task::AttemptId::new());
        tokio::time::sleep(Duration::from_micros(
            (base as f64 * 1000.0 * (0.5 + jitter)) as u64,
        ))
        .await;
        true
    }

    /// The time since the first try.
    pub(crate) fn waited(&self) -> Duration {
        self.started.elapsed()
    }
}

/// Runs one operation on a site: `run!(site, Write, |conn, now| op(conn, now, …))`.
/// The operation's future is made again for each try, so it must not
/// consume what it is given (clone it in the expression). A write on the
/// pool runs as a savepoint of this process's shared batch ([`Group`]) and
/// answers once the batch committed; any other operation runs in a
/// transaction of its own (a savepoint of the caller's, on its connection).
macro_rules! run {
    ($site:expr, $mode:ident, |$conn:ident, $now:ident| $op:expr) => {{
        let site = $site;
        let mode = $crate::sqlite::site::Mode::$mode;
        let mut busy = $crate::sqlite::site::Busy::new(site.store().busy_budget());
        loop {
            let mut owned = false;
            let outcome = match $crate::sqlite::site::grouped(site, mode) {
                Some(group) => {
                    owned = true;
                    async {
                        let mut write = group.join(site.store()).await?;
                        // The store's instant, read once the write lock is held.
                        let $now = site.store().now();
                        let answer = {
                            let $conn: &mut ::sqlx::SqliteConnection = write.savepoint().await?;
                            $op.await
                        };
                        let (answer, clean) = write.settle(answer).await;
                        write.finish(answer, clean).await
                    }
                    .await
                }
                None => {
                    async {
                        let mut held = site.conn().await?;
                        owned = !::sqlx::Connection::is_in_transaction(&*held);
                        let mut tx = $crate::sqlite::site::begin(&mut held, mode).await?;
                        // The store's instant, read once the write lock is held.
                        let $now = site.store().now();
                        let answer = {
                            let $conn: &mut ::sqlx::SqliteConnection = &mut tx;
                            $op.await
                        };
                        // Rolled back whole (or to the savepoint) on failure: nothing of it stays.
                        $crate::sqlite::site::settle(tx, answer).await
                    }
                    .await
                }
            };
            match outcome {
                Err($crate::Error::Busy { .. }) if owned && busy.again().await => continue,
                // Its batch was ended unwritten (a writer dropped mid-way): again, whole.
                Err(e) if $crate::sqlite::group::is_abandoned(&e) && busy.again().await => continue,
                Err($crate::Error::Busy { .. }) => {
                    break Err($crate::Error::Busy {
                        waited: busy.waited(),
                    });
                }
                other => break other,
            }
        }
    }};
}

pub(crate) use run;
