//! The effect journal: one read of the effect under the fence, then one
//! conditional write.

use sqlx::Row;
use sqlx::postgres::PgConnection;
use time::OffsetDateTime;

use crate::backend::rules::{self, BeginEffectRule, FinishEffectRule};
use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::{Error, Result};
use crate::store::{Fenced, Lease};
use crate::task::TaskId;

use super::fenced::{RACE_RETRIES, Raced, rejection, version};
use crate::postgres::db;
use crate::postgres::row;
use crate::postgres::sql::Statements;

pub(crate) async fn begin_effect(
    sql: &Statements,
    conn: &mut PgConnection,
    lease: &Lease,
    name: &str,
) -> Result<Fenced<EffectStart>> {
    effect_step(sql, conn, "begin_effect", lease, name, |recorded, now| {
        Ok(match rules::begin_effect(recorded, lease, name, now) {
            BeginEffectRule::Write { effect, start } => (Some(effect), start),
            BeginEffectRule::Answer(start) => (None, start),
        })
    })
    .await
}

pub(crate) async fn finish_effect(
    sql: &Statements,
    conn: &mut PgConnection,
    lease: &Lease,
    name: &str,
    outcome: &EffectOutcome,
) -> Result<Fenced<Effect>> {
    effect_step(sql, conn, "finish_effect", lease, name, |recorded, now| {
        Ok(match rules::finish_effect(recorded, lease, name, outcome, now)? {
            FinishEffectRule::Write(effect) => (Some(effect.clone()), effect),
            FinishEffectRule::Answer(effect) => (None, effect),
        })
    })
    .await
}

/// One step of the effect journal: read the effect's record under the
/// fence, `decide` (a record to store, if any, and the answer), store it
/// conditionally. A refused read is classified by [`rules::fence`]; a write
/// that found the record or the lease changed since the read starts over.
async fn effect_step<T: Send>(
    sql: &Statements,
    conn: &mut PgConnection,
    op: &'static str,
    lease: &Lease,
    name: &str,
    decide: impl Fn(Option<&Effect>, OffsetDateTime) -> Result<(Option<Effect>, T)> + Send,
) -> Result<Fenced<T>> {
    for _ in 0..RACE_RETRIES {
        let read = sql
            .effect_read
            .query()
            .bind(lease.task_id().as_uuid())
            .bind(version(lease))
            .bind(name)
            .bind(lease.attempt_id().as_uuid())
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
        let Some(read) = read else {
            match rejection(sql, conn, rules::fence, lease).await? {
                Some(rejection) => return Ok(Fenced::Rejected(rejection)),
                None => continue,
            }
        };
        let recorded = row::effect(&read).map_err(db)?;
        let now: OffsetDateTime = read.try_get("store_now").map_err(db)?;
        let (write, answer) = decide(recorded.as_ref(), now)?;
        let Some(effect) = write else {
            return Ok(Fenced::Accepted(answer));
        };
        let written = sql
            .effect_write
            .query()
            .bind(lease.task_id().as_uuid())
            .bind(version(lease))
            .bind(&effect.name)
            .bind(effect.state.as_str())
            .bind(i32::try_from(effect.attempt).unwrap_or(i32::MAX))
            .bind(&effect.reference)
            .bind(&effect.error)
            .bind(i32::try_from(effect.ambiguous).unwrap_or(i32::MAX))
            .bind(effect.created_at)
            .bind(effect.intended_at)
            .bind(effect.settled_at)
            .bind(recorded.as_ref().map(|r| r.state.as_str()))
            .bind(
                recorded
                    .as_ref()
                    .map(|r| i64::try_from(r.version).unwrap_or(i64::MAX)),
            )
            .bind(lease.attempt_id().as_uuid())
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
        if written.is_some() {
            return Ok(Fenced::Accepted(answer));
        }
    }
    Err(Error::storage(Raced(op)))
}

pub(crate) async fn effects(sql: &Statements, conn: &mut PgConnection, id: TaskId) -> Result<Vec<Effect>> {
    sql.effects
        .query()
        .bind(id.as_uuid())
        .fetch_all(conn)
        .await
        .map_err(db)?
        .iter()
        .filter_map(|row| row::effect(row).map_err(db).transpose())
        .collect()
}
