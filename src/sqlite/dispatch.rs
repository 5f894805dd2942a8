//! The outbox on SQLite: the `handoffs` table under the one dispatcher loop
//! ([`Outbox`](crate::dispatch::Outbox)). A round reads the oldest
//! unpublished handoffs (each with its task's version, the stamp), and each
//! published batch is marked at once, in a write transaction of its own: a
//! crash after a publish and before its mark publishes that batch again
//! (at least once, every copy pointing to the same task). Two dispatchers
//! on one file may both publish a handoff: run one per file.

use async_trait::async_trait;

use crate::backend::OutboxBackend;
use crate::error::Result;
use crate::task::TaskId;
use crate::wire::Stamp;

use super::SqliteStore;
use super::ops;
use super::site::{Site, run};

crate::dispatch::inherent_outbox_methods!(SqliteStore);

/// The handoffs are rows of `handoffs`, keyed by their `id`; marks are
/// written as each batch is accepted, so a round holds nothing.
#[async_trait]
impl OutboxBackend for SqliteStore {
    type Round = ();
    type Handoff = i64;

    async fn take_handoffs(&self, limit: usize) -> Result<((), Vec<(Stamp, i64)>)> {
        let handoffs = run!(self, Read, |conn, _now| ops::take_handoffs(conn, limit))?;
        Ok(((), handoffs))
    }

    async fn mark_published(&self, _round: &mut (), handoffs: &[(Stamp, i64)]) -> Result<()> {
        let ids: Vec<i64> = handoffs.iter().map(|&(_, id)| id).collect();
        run!(self, Write, |conn, now| ops::mark_published(conn, now, &ids))
    }

    async fn end_round(&self, _round: ()) -> Result<()> {
        Ok(())
    }

    async fn write_handoffs(&self, ids: &[TaskId]) -> Result<u64> {
        run!(self, Write, |conn, now| ops::redispatch(conn, now, ids))
    }
}
