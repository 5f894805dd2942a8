//! Concurrency keys and rate buckets on PostgreSQL: each submission and
//! claim of a task naming a limit, and the operations on buckets.
//!
//! The plain claim statements leave such tasks alone (their `unlimited`
//! condition); they are claimed here, each claim in a transaction of its
//! own (a savepoint inside the caller's), under locks taken in one order —
//! the key's advisory lock, then the bucket's row — so two decisions on one
//! key or one bucket never interleave and never deadlock:
//!
//! - a **submission** naming a bucket checks it is defined; a task naming
//!   a key takes its place in the key's order from a sequence (no lock);
//! - a **claim** takes the locks, then reads the task and the store clock,
//!   decides with [`rules::claim`] and [`rules::within_limits`] on the
//!   key's live leases and the bucket's schedule as the locks left them,
//!   and writes the claim (the plain claim statement, told the limits are
//!   decided) and the bucket's new schedule. A refusal rolls back: nothing
//!   written, no attempt spent.
//!
//! A slot is a live lease: the count reads running tasks whose lease has
//! not expired on the store's clock, so a crashed worker's slot comes back
//! when its lease expires, and a superseded worker (whose writes the fence
//! refuses) can neither keep nor free one.

use std::time::Duration;

use sqlx::postgres::PgConnection;
use sqlx::{Connection, Row};
use time::OffsetDateTime;

use crate::backend::rules::{self, ClaimRule, KeyLoad};
use crate::error::{Error, InvalidInput, Result};
use crate::store::{Claim, ClaimNext, ClaimRequest, Lease, Submitted};
use crate::task::{AttemptId, NewTask, Task, TaskId};
use crate::throttle::{BucketState, KeySlots, RateBucket, TaskLimits};

use super::fenced::{Raced, read};
use super::single::{claim_full_decided, submit_row};
use crate::postgres::db;
use crate::postgres::row::{self, epoch_nanos, nanos};
use crate::postgres::sql::Statements;

/// Submits `new`, which names a limit: its bucket must be defined
/// ([`InvalidInput::UnknownBucket`] otherwise, nothing written). Buckets are
/// never removed, so one defined now still is when the task commits.
pub(crate) async fn submit(sql: &Statements, conn: &mut PgConnection, new: NewTask) -> Result<Submitted> {
    if let Some(bucket) = &new.limits.bucket {
        let defined: bool = sql
            .limits
            .bucket_defined
            .query()
            .bind(bucket)
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?
            .try_get(0)
            .map_err(db)?;
        if !defined {
            return Err(InvalidInput::UnknownBucket {
                bucket: bucket.clone(),
            }
            .into());
        }
    }
    submit_row(sql, conn, new).await
}

/// Claims the task `id`, which names `limits`, under their locks (see the
/// module's documentation). A refusal for a limit answers
/// [`Claim::Throttled`] and writes nothing.
pub(crate) async fn claim(
    sql: &Statements,
    conn: &mut PgConnection,
    id: TaskId,
    limits: &TaskLimits,
    request: &ClaimRequest,
) -> Result<Claim> {
    let mut tx = conn.begin().await.map_err(db)?;
    if let Some(key) = &limits.concurrency {
        lock_key(sql, &mut tx, key.name()).await?;
    }
    let bucket = match &limits.bucket {
        Some(name) => lock_bucket(sql, &mut tx, name).await?,
        None => None,
    };
    // Read after the locks: the key's and the bucket's state as the last
    // decision on them left it, on a clock no earlier than that decision.
    let Some((task, now)) = read(sql, &mut tx, id).await? else {
        return Ok(Claim::NotFound);
    };
    let schedule = match rules::claim(&task, now) {
        ClaimRule::Answer(claim) => return Ok(claim),
        // A spent budget ends the task: no slot, no token.
        ClaimRule::Exhaust(_) => None,
        ClaimRule::Take => {
            let load = key_load(sql, &mut tx, &task, now).await?;
            match rules::within_limits(&task, &load, bucket.as_ref(), now) {
                Ok(schedule) => schedule,
                Err(why) => return Ok(Claim::Throttled(why)),
            }
        }
    };
    let attempt_id = AttemptId::new();
    let claim = claim_full_decided(sql, &mut tx, id, attempt_id, request).await?;
    let Some(claim) = claim else {
        // The statement found the row available but left it: it changed
        // between the read and the write (a lock holder of another kind).
        return Err(Error::storage(Raced("claim")));
    };
    if let (Claim::Acquired(_), Some(name), Some(at)) = (&claim, &task.limits.bucket, schedule) {
        sql.limits
            .set_schedule
            .query()
            .bind(name)
            .bind(epoch_nanos(at))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
    }
    tx.commit().await.map_err(db)?;
    Ok(claim)
}

/// `claim_next` while tasks naming limits are unfinished: the scan skips
/// the tasks their limits refuse now and offers the rest round-robin by
/// key; each is then claimed alone (under its locks when it names a
/// limit), so a task a racing caller took, or a key a racing caller
/// filled, is passed over. Short of the limit with candidates left, the
/// scan runs again on the limits as this call left them.
pub(crate) async fn claim_next(
    sql: &Statements,
    conn: &mut PgConnection,
    request: &ClaimNext,
) -> Result<Vec<Lease>> {
    let claim_request = request.request();
    // Room for the candidates that racing callers or this call's own
    // claims have made refusable since the scan.
    let page = request.limit.saturating_mul(2).saturating_add(8);
    let mut leases = Vec::with_capacity(request.limit);
    loop {
        let candidates: Vec<(TaskId, TaskLimits)> = sql
            .limits
            .needing_worker
            .query()
            .bind(i64::try_from(page).unwrap_or(i64::MAX))
            .bind(&request.operations)
            .bind(&request.scopes)
            .fetch_all(&mut *conn)
            .await
            .map_err(db)?
            .iter()
            .map(|r| Ok((TaskId::from_uuid(r.try_get("id")?), row::limits(r)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(db)?;
        let mut progress = false;
        for (id, limits) in &candidates {
            if leases.len() == request.limit {
                break;
            }
            // A task naming a limit goes straight to its locks; another
            // takes the plain claim.
            let claimed = if limits.is_none() {
                super::claim(sql, conn, *id, claim_request.clone()).await?
            } else {
                claim(sql, conn, *id, limits, &claim_request).await?
            };
            match claimed {
                Claim::Acquired(lease) => {
                    leases.push(lease);
                    progress = true;
                }
                Claim::Throttled(_) => {}
                _ => progress = true,
            }
        }
        if leases.len() == request.limit || candidates.len() < page || !progress {
            return Ok(leases);
        }
    }
}

/// Defines `bucket`, or changes its rate and burst, keeping its schedule.
pub(crate) async fn define_bucket(
    sql: &Statements,
    conn: &mut PgConnection,
    bucket: &RateBucket,
) -> Result<()> {
    sql.limits
        .define_bucket
        .query()
        .bind(bucket.name())
        .bind(i64::from(bucket.rate()))
        .bind(nanos(bucket.period()))
        .bind(i64::from(bucket.burst_size()))
        .bind(nanos(bucket.interval()))
        .bind(nanos(bucket.tolerance()))
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(())
}

/// Drains the bucket `name` until `retry_after` from now on the store's
/// clock ([`rules::drain`]), under its row lock: the bucket after the
/// drain, or `None` (nothing written) when none has that name.
pub(crate) async fn drain_bucket(
    sql: &Statements,
    conn: &mut PgConnection,
    name: &str,
    retry_after: Duration,
) -> Result<Option<BucketState>> {
    let mut tx = conn.begin().await.map_err(db)?;
    let Some(mut state) = lock_bucket(sql, &mut tx, name).await? else {
        return Ok(None);
    };
    let now: OffsetDateTime = sql
        .limits
        .store_now
        .query()
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?
        .try_get("store_now")
        .map_err(db)?;
    let schedule = rules::drain(&state.bucket, state.schedule, now + retry_after);
    sql.limits
        .set_schedule
        .query()
        .bind(name)
        .bind(epoch_nanos(schedule))
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    tx.commit().await.map_err(db)?;
    state.schedule = Some(schedule);
    Ok(Some(state))
}

/// Every bucket, by name.
pub(crate) async fn buckets(sql: &Statements, conn: &mut PgConnection) -> Result<Vec<BucketState>> {
    sql.limits
        .buckets
        .query()
        .fetch_all(conn)
        .await
        .map_err(db)?
        .iter()
        .map(row::bucket)
        .collect::<Result<_, _>>()
        .map_err(db)
}

/// Who holds the slots of `key` on the store's clock, and how many of its
/// tasks wait.
pub(crate) async fn concurrency(sql: &Statements, conn: &mut PgConnection, key: &str) -> Result<KeySlots> {
    let running: Vec<uuid::Uuid> = sql
        .limits
        .key_running
        .query()
        .bind(key)
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()
        .map_err(db)?;
    let waiting: i64 = sql
        .limits
        .key_waiting
        .query()
        .bind(key)
        .fetch_one(conn)
        .await
        .map_err(db)?
        .try_get(0)
        .map_err(db)?;
    Ok(KeySlots {
        key: key.to_owned(),
        running: running.into_iter().map(TaskId::from_uuid).collect(),
        waiting: u64::try_from(waiting).unwrap_or(0),
    })
}

/// Waits for `key`'s lock, held until the transaction ends.
async fn lock_key(sql: &Statements, conn: &mut PgConnection, key: &str) -> Result<()> {
    sql.limits
        .lock_key
        .query()
        .bind(key)
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(())
}

/// The bucket `name`, its row locked until the transaction ends; `None`
/// when none has that name.
async fn lock_bucket(sql: &Statements, conn: &mut PgConnection, name: &str) -> Result<Option<BucketState>> {
    sql.limits
        .lock_bucket
        .query()
        .bind(name)
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .map(|r| row::bucket(&r))
        .transpose()
        .map_err(db)
}

/// The load at `now` of `task`'s key: how many of its tasks hold a live
/// lease, and its first unfinished task by submission order.
async fn key_load(
    sql: &Statements,
    conn: &mut PgConnection,
    task: &Task,
    now: OffsetDateTime,
) -> Result<KeyLoad> {
    let Some(key) = &task.limits.concurrency else {
        return Ok(KeyLoad::default());
    };
    let row = sql
        .limits
        .key_load
        .query()
        .bind(key.name())
        .bind(now)
        .fetch_one(conn)
        .await
        .map_err(db)?;
    let running: i64 = row.try_get("running").map_err(db)?;
    let first: Option<uuid::Uuid> = row.try_get("first_unfinished").map_err(db)?;
    Ok(KeyLoad {
        running: u32::try_from(running).unwrap_or(u32::MAX),
        first_unfinished: first.map(TaskId::from_uuid),
    })
}
