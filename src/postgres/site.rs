//! [`Site`]: where a store's statements run — a pooled connection per
//! operation ([`PgStore`]), or the caller's connection or transaction
//! ([`PgConnStore`](super::PgConnStore)). The one implementation of the
//! backend (`backend.rs`) is written against it, so both paths are the same
//! code.

use std::future::Future;
use std::ops::DerefMut;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, Postgres};

use crate::error::Result;

use super::sql::Statements;
use super::{PgStore, db};

/// Where the statements of one operation run, and which statements they are.
pub(crate) trait Site: Send + Sync {
    /// A connection held for one operation: given back when dropped.
    type Conn<'a>: DerefMut<Target = PgConnection> + Send
    where
        Self: 'a;

    /// The statements, rendered for the store's schema.
    fn sql(&self) -> &Statements;

    /// Whether a submission may write a handoff (the store's switch,
    /// [`without_handoffs`](super::PgStoreBuilder::without_handoffs)).
    fn handoffs(&self) -> bool;

    /// The connection for one operation, once the store knows its schema is
    /// current ([`Error::NotMigrated`](crate::Error::NotMigrated) otherwise).
    fn conn(&self) -> impl Future<Output = Result<Self::Conn<'_>>> + Send;

    /// The statement timeout of an operator's read, in a transaction of its
    /// own; `None` on the caller's connection, whose settings are the caller's.
    fn read_timeout(&self) -> Option<std::time::Duration> {
        None
    }
}

/// The pool path: each operation on a connection of its own, in autocommit
/// (each statement its own transaction).
impl Site for PgStore {
    type Conn<'a> = PoolConnection<Postgres>;

    fn sql(&self) -> &Statements {
        &self.sql
    }

    fn handoffs(&self) -> bool {
        self.handoffs
    }

    async fn conn(&self) -> Result<PoolConnection<Postgres>> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        self.check_schema(&mut conn).await?;
        Ok(conn)
    }

    fn read_timeout(&self) -> Option<std::time::Duration> {
        Some(self.read_timeout)
    }
}
