//! The outbox on PostgreSQL: the `handoffs` table under the one dispatcher
//! loop ([`Outbox`](crate::dispatch::Outbox)). A round is one transaction:
//! it takes its handoffs with `FOR UPDATE SKIP LOCKED` (so several
//! dispatchers share the work, none waiting for another), reads each
//! task's version in the same statement (the stamp), and marks every
//! published handoff with one `UPDATE` before its commit. A crash before the
//! commit rolls the marks back: the next round publishes those tasks again.

use async_trait::async_trait;
use sqlx::{Postgres, Row, Transaction};

use crate::backend::OutboxBackend;
use crate::error::Result;
use crate::task::TaskId;
use crate::wire::Stamp;

use super::site::Site;
use super::{PgStore, db, ops};

/// A dispatch round on PostgreSQL: its transaction, which holds the row
/// locks of the handoffs it took until it ends, and the ids of the handoffs
/// published so far, marked in one statement at the end.
pub struct PgRound {
    tx: Transaction<'static, Postgres>,
    published: Vec<i64>,
}

impl std::fmt::Debug for PgRound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgRound")
            .field("published", &self.published)
            .finish_non_exhaustive()
    }
}

crate::dispatch::inherent_outbox_methods!(PgStore);

/// The handoffs are rows of `handoffs`, keyed by their `id`.
#[async_trait]
impl OutboxBackend for PgStore {
    type Round = PgRound;
    type Handoff = i64;

    async fn take_handoffs(&self, limit: usize) -> Result<(PgRound, Vec<(Stamp, i64)>)> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        self.check_schema(&mut tx).await?;
        let handoffs = self
            .sql
            .claim_handoffs
            .query()
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?
            .iter()
            .map(|row| {
                let id = TaskId::from_uuid(row.try_get(1)?);
                // No task (a stray handoff): version 0, and the claim finds nothing.
                let version = row.try_get::<Option<i64>, _>(2)?.unwrap_or(0);
                Ok((
                    Stamp::new(id, u64::try_from(version).unwrap_or(0)),
                    row.try_get(0)?,
                ))
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(db)?;
        let round = PgRound {
            tx,
            published: Vec::with_capacity(handoffs.len()),
        };
        Ok((round, handoffs))
    }

    async fn mark_published(&self, round: &mut PgRound, handoffs: &[(Stamp, i64)]) -> Result<()> {
        round.published.extend(handoffs.iter().map(|&(_, id)| id));
        Ok(())
    }

    async fn end_round(&self, mut round: PgRound) -> Result<()> {
        if !round.published.is_empty() {
            self.sql
                .mark_published
                .query()
                .bind(&round.published)
                .execute(&mut *round.tx)
                .await
                .map_err(db)?;
        }
        round.tx.commit().await.map_err(db)
    }

    /// One statement: each id's fresh handoff, written only for a task
    /// still pending (with a handoff of its own), checked in the same
    /// statement.
    async fn write_handoffs(&self, ids: &[TaskId]) -> Result<u64> {
        ops::redispatch(&self.sql, &mut *self.conn().await?, ids).await
    }
}
