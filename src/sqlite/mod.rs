//! [`SqliteStore`]: the SQLite backend (feature `sqlite`), on sqlx's SQLite
//! driver: a durable store in one file, for a single-binary service, a
//! desktop or edge agent, or development without a database server.
//!
//! The same contract as every other backend, on a file: the tables
//! `tasks`, `attempts`, `reopenings`, `handoffs`, `effects` and `buckets`, and the
//! migration history `taskfence_migrations` (the SQL files are in the
//! crate's `migrations-sqlite/` directory; [`migrate`] /
//! [`SqliteStore::migrate`] apply them). A file that is missing them or is
//! older than the library answers [`Error::NotMigrated`].
//!
//! - **One writer at a time, by design.** SQLite lets one transaction write
//!   at a time and readers read alongside it (WAL journal mode). Every write
//!   operation is one `BEGIN IMMEDIATE` transaction: it takes the write lock
//!   *before* it reads the rows it decides on, reads them, decides with the
//!   [`rules`](crate::backend::rules) every backend shares, writes, and
//!   commits. No other writer can come between the read and the write, so
//!   each decision is the one a locking transaction makes. (A plain `BEGIN`
//!   that reads and then writes can fail at once with `SQLITE_BUSY` when
//!   another connection wrote meanwhile, without waiting: `BEGIN IMMEDIATE`
//!   never does.)
//! - **Group commit.** Writes that this process makes through one store at
//!   the same moment share that transaction and its one commit: each runs
//!   alone, in turn, as a savepoint of it (so each decision is the one it
//!   would make in a transaction of its own), a failed one is rolled back
//!   alone, and every one answers only once the commit is done. Writers
//!   that arrive one at a time each commit alone, as before; under
//!   concurrency one disk flush serves many writes.
//! - **Busy, handled.** A write that finds the file locked by another
//!   process waits (SQLite's `busy_timeout`), and is tried again from the
//!   start while its busy budget lasts ([`SqliteStoreBuilder::busy_budget`]).
//!   A write that did not get the lock wrote nothing; one that failed after
//!   it is rolled back whole. Past the budget the call answers
//!   [`Error::Busy`]: nothing was written. `SQLITE_BUSY` itself never
//!   reaches a caller, and no task is ever left half-written.
//! - **The store's clock is the machine's clock, read under the write
//!   lock.** SQLite runs in the calling process and has no clock of its own
//!   (its `'now'` is the process's system clock), so the store reads the
//!   system clock — through its [`Clock`](crate::clock::Clock), injectable
//!   for tests — once the transaction holds the write lock. Every process
//!   that opens the file runs on the same machine (SQLite's WAL mode needs
//!   shared memory, so a file on a network share is not supported), so they
//!   all read one clock, and the writes are serialized by the lock: each
//!   decision sees the time after every earlier write. A wall clock stepped
//!   backwards (NTP) can lengthen a lease or a backoff by the step; it can
//!   never let two attempts save (guarantee 1 is the version check and the
//!   saved response, read under the lock).
//! - **Limits in the claim's transaction.** Concurrency keys and rate
//!   buckets ([`throttle`](crate::throttle)) are decided by the claim under
//!   the same write lock: it counts its key's live leases, checks a limit-1
//!   key's order, takes its bucket's token
//!   ([`rules::within_limits`](crate::backend::rules::within_limits)) and
//!   writes the claim with the bucket's new schedule; no writer can come
//!   between. `claim_next` skips refused tasks in its scan.
//! - **Inside the caller's transaction.** [`SqliteStore::on`] gives the
//!   store on a `&mut SqliteConnection` — typically `&mut tx` from
//!   [`SqliteStore::begin`] — as a [`SqliteConnStore`], a
//!   [`TaskStore`](crate::TaskStore) and [`Inspect`](crate::inspect::Inspect)
//!   with every operation, so the application's own writes and the task's
//!   commit or roll back together.
//! - **The handoff.** [`submit`](crate::TaskStore::submit) writes a handoff
//!   row in the same transaction as the task (a transactional outbox);
//!   [`Outbox::dispatch`](crate::dispatch::Outbox::dispatch) publishes them.
//! - **Durability.** `synchronous = FULL` by default: a commit is on disk
//!   when the call returns, so "saved" survives a power loss, not only a
//!   crash of the process.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `store` | [`SqliteStore`], [`SqliteStoreBuilder`] |
//! | `conn` | [`SqliteConnStore`]: the store on the caller's connection or transaction |
//! | `site` | where the statements run, the write transaction and its busy retries |
//! | `group` | group commit: this process's concurrent writes in one transaction and one commit |
//! | `backend` | the one [`Backend`](crate::backend::Backend) / [`InspectBackend`](crate::backend::InspectBackend) implementation, for either site |
//! | `ops` | the operations themselves, on one connection, input already checked, one job per file |
//! | `dispatch` | the outbox: the [`OutboxBackend`](crate::backend::OutboxBackend) steps |
//! | `sql` | the statements |
//! | `row` | rows to domain values: the only place that knows column types |
//! | `migrate` | [`migrate`], the embedded migrations and their history |

use crate::error::Error;

mod backend;
mod conn;
mod dispatch;
pub(crate) mod group;
mod migrate;
mod ops;
mod row;
pub(crate) mod site;
mod sql;
mod store;

pub use conn::SqliteConnStore;
pub use migrate::migrate;
pub use store::{SqliteStore, SqliteStoreBuilder};

/// What to run when the file's tables are missing or old.
pub(crate) const MIGRATE_FIX: &str = "apply the migrations: `SqliteStore::migrate` (or `taskfence::sqlite::migrate`), or `taskfence --sqlite PATH migrate` from the command line";

// SQLite's primary result codes (the low byte of an extended code).
const SQLITE_BUSY: i64 = 5;
const SQLITE_LOCKED: i64 = 6;
const SQLITE_READONLY: i64 = 8;
const SQLITE_FULL: i64 = 13;

/// A sqlx error as this crate's: the file locked by another writer is
/// [`Error::Busy`] (retried by the store while its budget lasts), a
/// read-only file or a full disk [`Error::Unwritable`], a missing table
/// [`Error::NotMigrated`]; anything else a storage error.
pub(crate) fn db(err: sqlx::Error) -> Error {
    if let sqlx::Error::Database(e) = &err {
        let code = e.code().and_then(|c| c.parse::<i64>().ok()).unwrap_or(0);
        match code & 0xff {
            SQLITE_BUSY | SQLITE_LOCKED => {
                return Error::Busy {
                    waited: std::time::Duration::ZERO,
                };
            }
            SQLITE_READONLY | SQLITE_FULL => {
                return Error::Unwritable {
                    detail: e.message().to_owned(),
                };
            }
            _ if e.message().starts_with("no such table") => {
                return Error::NotMigrated {
                    detail: e.message().to_owned(),
                    fix: MIGRATE_FIX,
                };
            }
            _ => {}
        }
    }
    Error::storage(err)
}
