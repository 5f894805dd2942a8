//! Concurrency keys and rate buckets: the state a claim decides its
//! limits on, read in the claim's own write transaction, and the
//! operations on buckets.
//!
//! A claim (alone, or each of a `claim_next` batch) reads its key's load
//! (the live leases, and a limit-1 key's first unfinished task) and its
//! bucket's schedule under SQLite's one write lock, decides with
//! [`rules::within_limits`], and writes the bucket's new schedule with the
//! claim ([`Writes`]): no other writer can come between. A batch keeps what
//! it read in [`Limits`] and counts its own claims in, so its later items
//! see its earlier ones before anything is written.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::SqliteConnection;
use time::OffsetDateTime;

use crate::backend::rules::{self, KeyLoad};
use crate::error::Result;
use crate::task::{Task, TaskId};
use crate::throttle::{BucketState, KeySlots, RateBucket, Throttled};

use super::super::{db, row, sql};
use super::row_io::Writes;

/// The keys' loads and the buckets' states one operation has read, with
/// its own claims counted in: what [`rules::within_limits`] decides on.
#[derive(Debug, Default)]
pub(crate) struct Limits {
    keys: HashMap<String, KeyLoad>,
    buckets: HashMap<String, Option<BucketState>>,
    /// Keys whose load in the file is behind the writes not yet made: a
    /// task of theirs ended (a spent budget) in this operation.
    stale: HashSet<String>,
}

impl Limits {
    /// Reads what `task`'s limits are decided on, unless already read: its
    /// key's load at `now` and its bucket's state. A key whose load the
    /// pending `writes` change is read only once they are made.
    pub(crate) async fn prepare(
        &mut self,
        conn: &mut SqliteConnection,
        writes: &mut Writes,
        task: &Task,
        now: OffsetDateTime,
    ) -> Result<()> {
        if let Some(key) = &task.limits.concurrency
            && !self.keys.contains_key(key.name())
        {
            if self.stale.contains(key.name()) {
                // Every pending write made: the file is current for every key.
                std::mem::take(writes).flush(conn, now).await?;
                self.stale.clear();
            }
            let load = key_load(conn, key.name(), now).await?;
            self.keys.insert(key.name().to_owned(), load);
        }
        if let Some(name) = &task.limits.bucket
            && !self.buckets.contains_key(name)
        {
            let state = bucket(conn, name).await?;
            self.buckets.insert(name.clone(), state);
        }
        Ok(())
    }

    /// [`rules::within_limits`] of `task` at `now`, on what
    /// [`prepare`](Self::prepare) read: the bucket's new schedule, or why not.
    pub(crate) fn decide(
        &self,
        task: &Task,
        now: OffsetDateTime,
    ) -> Result<Option<OffsetDateTime>, Throttled> {
        let load = task
            .limits
            .concurrency
            .as_ref()
            .and_then(|key| self.keys.get(key.name()))
            .cloned()
            .unwrap_or_default();
        let bucket = task
            .limits
            .bucket
            .as_ref()
            .and_then(|name| self.buckets.get(name))
            .and_then(Option::as_ref);
        rules::within_limits(task, &load, bucket, now)
    }

    /// `task` claimed: it holds a slot of its key, and its bucket's
    /// schedule is now `schedule` (written with the claim).
    pub(crate) fn taken(&mut self, task: &Task, schedule: Option<OffsetDateTime>, writes: &mut Writes) {
        if let Some(load) = task
            .limits
            .concurrency
            .as_ref()
            .and_then(|key| self.keys.get_mut(key.name()))
        {
            load.running += 1;
        }
        if let (Some(name), Some(schedule)) = (&task.limits.bucket, schedule) {
            if let Some(Some(state)) = self.buckets.get_mut(name) {
                state.schedule = Some(schedule);
            }
            writes.bucket(name, schedule);
        }
    }

    /// `task` ended (its budget spent) by a write not yet made: its key's
    /// first unfinished task may change, so the key is read again, once
    /// the writes are made.
    pub(crate) fn ended(&mut self, task: &Task) {
        if let Some(key) = &task.limits.concurrency {
            self.keys.remove(key.name());
            self.stale.insert(key.name().to_owned());
        }
    }
}

/// The load of `key` at `now`: how many of its tasks hold a live lease,
/// and its first unfinished task by submission order.
async fn key_load(conn: &mut SqliteConnection, key: &str, now: OffsetDateTime) -> Result<KeyLoad> {
    let running = running(conn, key, now).await?;
    let first: Option<uuid::Uuid> = sqlx::query_scalar(sql::KEY_FIRST_UNFINISHED)
        .bind(key)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)?;
    Ok(KeyLoad {
        running: u32::try_from(running.len()).unwrap_or(u32::MAX),
        first_unfinished: first.map(TaskId::from_uuid),
    })
}

/// The tasks of `key` holding a live lease at `now`, by submission order.
async fn running(conn: &mut SqliteConnection, key: &str, now: OffsetDateTime) -> Result<Vec<TaskId>> {
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar(sql::KEY_RUNNING)
        .bind(key)
        .bind(row::at(now))
        .fetch_all(conn)
        .await
        .map_err(db)?;
    Ok(ids.into_iter().map(TaskId::from_uuid).collect())
}

/// The bucket named `name`, if defined.
async fn bucket(conn: &mut SqliteConnection, name: &str) -> Result<Option<BucketState>> {
    sqlx::query(sql::BUCKET)
        .bind(name)
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .map(|r| row::bucket(&r))
        .transpose()
        .map_err(db)
}

/// Whether a bucket named `name` is defined (a task may name only such a one).
pub(crate) async fn bucket_defined(conn: &mut SqliteConnection, name: &str) -> Result<bool> {
    Ok(bucket(conn, name).await?.is_some())
}

/// Defines `bucket`, or changes its rate and burst, keeping its schedule.
pub(crate) async fn define_bucket(conn: &mut SqliteConnection, bucket: &RateBucket) -> Result<()> {
    sqlx::query(sql::DEFINE_BUCKET)
        .bind(bucket.name())
        .bind(i64::from(bucket.rate()))
        .bind(row::nanos(bucket.period()))
        .bind(i64::from(bucket.burst_size()))
        .bind(row::nanos(bucket.interval()))
        .bind(row::nanos(bucket.tolerance()))
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(())
}

/// Drains the bucket named `name` until `now + retry_after` ([`rules::drain`]):
/// the bucket after the drain, or `None` (nothing written) when none has that name.
pub(crate) async fn drain_bucket(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    name: &str,
    retry_after: Duration,
) -> Result<Option<BucketState>> {
    let Some(mut state) = bucket(conn, name).await? else {
        return Ok(None);
    };
    let schedule = rules::drain(&state.bucket, state.schedule, now + retry_after);
    sqlx::query(sql::SET_SCHEDULE)
        .bind(name)
        .bind(row::at(schedule))
        .execute(conn)
        .await
        .map_err(db)?;
    state.schedule = Some(schedule);
    Ok(Some(state))
}

/// Every bucket, by name.
pub(crate) async fn buckets(conn: &mut SqliteConnection) -> Result<Vec<BucketState>> {
    sqlx::query(sql::BUCKETS)
        .fetch_all(conn)
        .await
        .map_err(db)?
        .iter()
        .map(row::bucket)
        .collect::<Result<_, _>>()
        .map_err(db)
}

/// Who holds the slots of `key` at `now`, and how many of its tasks wait.
pub(crate) async fn concurrency(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    key: &str,
) -> Result<KeySlots> {
    let running = running(conn, key, now).await?;
    let waiting: i64 = sqlx::query_scalar(sql::KEY_WAITING)
        .bind(key)
        .fetch_one(conn)
        .await
        .map_err(db)?;
    Ok(KeySlots {
        key: key.to_owned(),
        running,
        waiting: u64::try_from(waiting).unwrap_or(0),
    })
}
