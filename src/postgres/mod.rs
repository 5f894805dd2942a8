//! [`PgStore`]: the PostgreSQL backend (feature `postgres`), on sqlx.
//!
//! Everything lives in the crate's own schema (default [`DEFAULT_SCHEMA`],
//! configurable with [`PgStoreBuilder::schema`]): the tables `tasks`,
//! `attempts`, `handoffs` and `reopenings`, the function `store_clock()`, and the
//! migration history `taskfence_migrations` (sqlx's format, beside — never in —
//! the application's `_sqlx_migrations`). The SQL files are in the crate's
//! `migrations/` directory; [`migrate`] / [`PgStore::migrate`] apply them. A
//! store whose schema is missing or older than the library answers
//! [`Error::NotMigrated`].
//!
//! - **One round trip per operation.** Submit, claim, renew, complete, fail,
//!   release and record_operation are each one statement: a chain of
//!   data-modifying CTEs that writes the task row (which holds the task's
//!   latest attempt; submit also writes the handoff) and returns what the
//!   caller does not already know. A refused write (zero rows) costs one more
//!   read of the row with the store clock, classified by the same
//!   [`rules`](crate::backend::rules) functions every backend uses. A task's first
//!   claim is one. Otherwise the first-claim statement writes nothing, a
//!   read answers a duplicate delivery (busy, done…) in a second, and a
//!   retry or takeover takes a third: the statement that moves the replaced
//!   attempt to the `attempts` journal.
//! - **The store clock, read after the row lock.** Every statement reads time
//!   through `<schema>.store_clock()` = `clock_timestamp()`, called once the
//!   row lock is held; the Rust process's clock is never used. (A task's
//!   first claim takes no lock first: a row without an attempt, once
//!   available, stays so until written, so the only effect of reading the
//!   clock before a wait is a lease that counts the wait.)
//! - **The same decision as a locking transaction.** Each fenced write locks
//!   the row first (a `MATERIALIZED` CTE with `FOR NO KEY UPDATE`, run before
//!   the `UPDATE` reads the row), then evaluates its guard — version, status,
//!   lease against the clock, no response — on the newest row, in one
//!   implicit transaction (or the caller's). It therefore decides exactly as
//!   `BEGIN; SELECT … FOR UPDATE; UPDATE … WHERE <guard>; COMMIT` would; a
//!   plain guarded `UPDATE` would not, when the lock holder only locked the
//!   row. The argument step by step, the SQL and the plans at 10⁶ rows are in
//!   `docs/POSTGRES.md` in the repository.
//! - **Inside the caller's transaction.** [`PgStore::on`] gives the store on
//!   a `&mut PgConnection` — typically `&mut tx` — as a [`PgConnStore`]: a
//!   [`TaskStore`](crate::TaskStore) and [`Inspect`](crate::inspect::Inspect)
//!   with every operation, so the application's own writes and the task's
//!   commit or roll back together. The pool path runs the same code on a
//!   pooled connection; [`PgConnStore`] says what running inside the
//!   caller's transaction means for locks, leases and rollback. Use Read Committed (PostgreSQL's default): under Repeatable
//!   Read a concurrent update surfaces as a serialization failure
//!   ([`Error::Storage`]).
//! - **The handoff.** [`submit`](crate::TaskStore::submit) writes a handoff
//!   row in the same statement as the task (a transactional outbox).
//!   The dispatcher, [`Outbox::dispatch`](crate::dispatch::Outbox::dispatch)
//!   (the one loop on this backend's [`OutboxBackend`](crate::backend::OutboxBackend)
//!   steps), publishes them; [`republish_due`](crate::republish::republish_due)
//!   publishes again the tasks whose lease expired or whose backoff passed. A
//!   [`reopen`](crate::TaskStore::reopen) writes a fresh handoff with the
//!   reopening, and [`redispatch`](crate::dispatch::Outbox::redispatch)
//!   writes one for tasks whose message was lost ([`Inspect::stranded`](crate::inspect::Inspect::stranded)).
//! - **Operator queries.** [`Inspect`](crate::inspect::Inspect) reads through
//!   indexes in id order (keyset pages, never an offset); counting every task
//!   reads one whole index, index-only.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `store` | [`PgStore`], [`PgStoreBuilder`] |
//! | `app` | a service's own rows beside taskfence's: [`CompleteWith`] ([`CompletionWrites`] in the completion's transaction, and its `pg_notify`), [`FollowUp`], `listen_saved` (feature `runtime`), [`app_schema`] |
//! | `conn` | [`PgConnStore`]: the store on the caller's connection or transaction, and what running there means |
//! | `site` | where the statements run: a pooled connection per operation, or the caller's |
//! | `backend` | the one [`Backend`](crate::backend::Backend) / [`InspectBackend`](crate::backend::InspectBackend) implementation, for either site |
//! | `ops` | the operations themselves, on one connection, input already checked, one job per file |
//! | `dispatch` | the outbox: the [`OutboxBackend`](crate::backend::OutboxBackend) steps under [`Outbox`](crate::dispatch::Outbox) (`dispatch`, `dispatch_batches`, `redispatch`) |
//! | `schema` | [`DEFAULT_SCHEMA`], validated schema names |
//! | `sql` | the statements, rendered per schema ([`PgStore::statements`]) |
//! | `row` | rows to domain values: the only place that knows column types |
//! | `migrate` | [`migrate`], the embedded migrations on sqlx's migrator, their [`MigrationStatus`] and [`UpgradeNote`]s |

use crate::error::Error;

mod app;
mod backend;
mod conn;
mod dispatch;
mod migrate;
mod ops;
mod reads;
mod row;
mod schema;
pub(crate) mod site;
mod sql;
mod store;

#[cfg(feature = "runtime")]
#[cfg_attr(docsrs, doc(cfg(feature = "runtime")))]
pub use app::listen_saved;
pub use app::{CompleteWith, CompletionWrites, FollowUp, app_schema};
pub use conn::PgConnStore;
pub use migrate::{Migration, MigrationState, MigrationStatus, UpgradeNote, migrate};
pub use reads::DEFAULT_READ_TIMEOUT;
pub use schema::DEFAULT_SCHEMA;
pub use store::{PgStore, PgStoreBuilder};

/// What to run when the schema is missing or old.
pub(crate) const MIGRATE_FIX: &str = "apply the migrations: `PgStore::migrate` (or `taskfence::postgres::migrate`), or `taskfence migrate` from the command line";

/// A sqlx error as this crate's: a missing schema, table, column or function
/// is [`Error::NotMigrated`]; anything else a storage error.
pub(crate) fn db(err: sqlx::Error) -> Error {
    if let sqlx::Error::Database(e) = &err {
        // invalid_schema_name, undefined_table, undefined_column, undefined_function
        if matches!(e.code().as_deref(), Some("3F000" | "42P01" | "42703" | "42883")) {
            return Error::NotMigrated {
                detail: e.message().to_owned(),
                fix: MIGRATE_FIX,
            };
        }
    }
    Error::storage(err)
}
