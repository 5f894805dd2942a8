//! The effect journal: records written only under the fence, decided by
//! [`rules::begin_effect`] and [`rules::finish_effect`].

use sqlx::SqliteConnection;
use time::OffsetDateTime;

use crate::backend::rules::{self, BeginEffectRule, FinishEffectRule};
use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::Result;
use crate::store::{Fenced, Lease};
use crate::task::TaskId;

use super::super::{db, row, sql};
use super::row_io::checked;

async fn record(conn: &mut SqliteConnection, id: TaskId, name: &str) -> Result<Option<Effect>> {
    sqlx::query(sql::EFFECT)
        .bind(id.as_uuid())
        .bind(name)
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .map(|r| row::effect(&r))
        .transpose()
        .map_err(db)
}

async fn put(conn: &mut SqliteConnection, effect: &Effect) -> Result<()> {
    sqlx::query(sql::PUT_EFFECT)
        .bind(effect.task_id.as_uuid())
        .bind(&effect.name)
        .bind(effect.state.as_str())
        .bind(row::int(effect.version))
        .bind(i64::from(effect.attempt))
        .bind(effect.reference.as_deref())
        .bind(effect.error.as_deref())
        .bind(i64::from(effect.ambiguous))
        .bind(row::at(effect.created_at))
        .bind(row::at(effect.intended_at))
        .bind(row::at_opt(effect.settled_at))
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(())
}

/// Begin an effect under the fence.
pub(crate) async fn begin_effect(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    lease: &Lease,
    name: &str,
) -> Result<Fenced<EffectStart>> {
    if let Err(rejection) = checked(conn, rules::fence, lease, now).await? {
        return Ok(Fenced::Rejected(rejection));
    }
    let recorded = record(conn, lease.task_id(), name).await?;
    Ok(Fenced::Accepted(
        match rules::begin_effect(recorded.as_ref(), lease, name, now) {
            BeginEffectRule::Write { effect, start } => {
                put(conn, &effect).await?;
                start
            }
            BeginEffectRule::Answer(start) => start,
        },
    ))
}

/// Settle an effect under the fence.
pub(crate) async fn finish_effect(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    lease: &Lease,
    name: &str,
    outcome: &EffectOutcome,
) -> Result<Fenced<Effect>> {
    if let Err(rejection) = checked(conn, rules::fence, lease, now).await? {
        return Ok(Fenced::Rejected(rejection));
    }
    let recorded = record(conn, lease.task_id(), name).await?;
    Ok(Fenced::Accepted(
        match rules::finish_effect(recorded.as_ref(), lease, name, outcome, now)? {
            FinishEffectRule::Write(effect) => {
                put(conn, &effect).await?;
                effect
            }
            FinishEffectRule::Answer(effect) => effect,
        },
    ))
}

/// The task's effect journal, by name.
pub(crate) async fn effects(conn: &mut SqliteConnection, id: TaskId) -> Result<Vec<Effect>> {
    sqlx::query(sql::EFFECTS)
        .bind(id.as_uuid())
        .fetch_all(conn)
        .await
        .map_err(db)?
        .iter()
        .map(row::effect)
        .collect::<Result<_, _>>()
        .map_err(db)
}
