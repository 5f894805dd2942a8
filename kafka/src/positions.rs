//! PostgreSQL position mode: the consumer position is saved in the same
//! transaction as the completion, and an assigned partition starts from it.
//!
//! **What it protects.** A saved response and the position that covers its
//! record commit together or not at all: a crash can never leave the response
//! saved with the position behind it, or the position moved past a record
//! whose save rolled back. If the application writes its own rows in that
//! transaction too (the reply into its `messages` table, via
//! [`PgStore::on`]`(&mut tx).complete(…)`), those rows and the position move together as
//! well, so a restart re-reads nothing that those rows already reflect. The
//! broker's committed offset stops being the source of truth: a lost or late
//! Kafka commit costs nothing.
//!
//! **What it does not.** The provider call happens before the transaction and
//! outside it — no transaction is ever held open across it. A crash after the
//! call and before the commit loses the reply, and the next attempt calls the
//! provider again (taskfence promises one saved result, not one call). Effects
//! outside this database (a notification sent, a charge made) are not in the
//! transaction either; they need their own idempotency. Records settled
//! without a completion (already completed, terminally failed) move the
//! position in a transaction of their own, after the fact; re-reading them is
//! harmless.
//!
//! Positions only move forward (`GREATEST`): every saved position is safe (all
//! records below it are durably handled), so the larger of two is too, and
//! saves arriving out of order never move it back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::offsets::OffsetTracker;
use async_trait::async_trait;
use sqlx::{PgConnection, PgPool, Row};
use taskfence::intercept::{Intercept, Intercepted};
use taskfence::{
    Claim, ClaimRequest, Error, Fenced, Lease, PgStore, Response, Result, Task, TaskId, TaskStore,
};

use crate::journal::{Event, Journal};

/// The `(group, topic, partition) → next offset` table, in the store's schema.
#[derive(Debug, Clone)]
pub struct PgPositions {
    pool: PgPool,
    group: String,
    save: String,
    load: String,
}

impl PgPositions {
    /// Positions of consumer group `group`, kept beside `store`'s tables (its
    /// schema, its pool), after [`migrate`](Self::migrate) made sure the
    /// table exists.
    pub async fn new(store: &PgStore, group: impl Into<String>) -> Result<Self> {
        Self::migrate(store).await?;
        let table = Self::table(store);
        Ok(Self {
            pool: store.pool().clone(),
            group: group.into(),
            save: format!(
                "INSERT INTO {table} AS p (consumer_group, topic, partition, next_offset)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (consumer_group, topic, partition) DO UPDATE
                 SET next_offset = GREATEST(p.next_offset, EXCLUDED.next_offset), updated_at = clock_timestamp()"
            ),
            load: format!(
                "SELECT partition, next_offset FROM {table}
                 WHERE consumer_group = $1 AND topic = $2 AND partition = ANY($3)"
            ),
        })
    }

    /// Creates the positions table in `store`'s schema unless it exists: the
    /// template's own start-up migration, idempotent and safe with several
    /// workers starting at once. It runs in one transaction that first takes
    /// a transaction-level advisory lock of its own
    /// (`kafka-worker.migrate.<schema>`, like the library's migrations take
    /// theirs), so concurrent starts run it one after another and each later
    /// one finds the table; a bare `CREATE TABLE IF NOT EXISTS` raced by two
    /// sessions fails in the loser with a unique violation on `pg_type`.
    pub async fn migrate(store: &PgStore) -> Result<()> {
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {} (
                consumer_group text NOT NULL,
                topic text NOT NULL,
                partition integer NOT NULL,
                next_offset bigint NOT NULL CHECK (next_offset >= 0),
                updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                PRIMARY KEY (consumer_group, topic, partition)
            )",
            Self::table(store)
        );
        let mut tx = store.pool().begin().await.map_err(Error::storage)?;
        // Released at the commit (or the rollback, if this process dies).
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(format!("kafka-worker.migrate.{}", store.schema()))
            .execute(&mut *tx)
            .await
            .map_err(Error::storage)?;
        sqlx::query(sqlx::AssertSqlSafe(create))
            .execute(&mut *tx)
            .await
            .map_err(Error::storage)?;
        tx.commit().await.map_err(Error::storage)
    }

    /// The table's qualified name. The schema name is a validated plain
    /// identifier (see `PgStore::builder`).
    fn table(store: &PgStore) -> String {
        format!("{}.kafka_consumer_positions", store.schema())
    }

    /// Moves the position forward to `next` on the caller's transaction.
    pub async fn save_in(
        &self,
        conn: &mut PgConnection,
        topic: &str,
        partition: i32,
        next: i64,
    ) -> Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(self.save.as_str()))
            .bind(&self.group)
            .bind(topic)
            .bind(partition)
            .bind(next)
            .execute(conn)
            .await
            .map_err(Error::storage)?;
        Ok(())
    }

    /// Moves the position forward to `next` in its own transaction.
    pub async fn save(&self, topic: &str, partition: i32, next: i64) -> Result<()> {
        let mut conn = self.pool.acquire().await.map_err(Error::storage)?;
        self.save_in(&mut conn, topic, partition, next).await
    }

    /// The saved positions of these partitions (absent: none saved yet).
    pub async fn load(&self, topic: &str, partitions: &[i32]) -> Result<HashMap<i32, i64>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(self.load.as_str()))
            .bind(&self.group)
            .bind(topic)
            .bind(partitions)
            .fetch_all(&self.pool)
            .await
            .map_err(Error::storage)?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<std::result::Result<_, sqlx::Error>>()
            .map_err(Error::storage)
    }
}

/// Which record each running task came from, so its completion can carry the position.
pub(crate) struct Pending {
    topic: String,
    consumer: String,
    tracker: Arc<Mutex<OffsetTracker<i32>>>,
    dead: Arc<AtomicBool>,
    records: Mutex<HashMap<TaskId, (i32, i64)>>,
    journal: Arc<dyn Journal>,
}

impl Pending {
    pub(crate) fn new(
        topic: String,
        consumer: String,
        tracker: Arc<Mutex<OffsetTracker<i32>>>,
        dead: Arc<AtomicBool>,
        journal: Arc<dyn Journal>,
    ) -> Self {
        Self {
            topic,
            consumer,
            tracker,
            dead,
            records: Mutex::new(HashMap::new()),
            journal,
        }
    }

    /// `task` is being claimed for this record; a second copy of the task
    /// (delivered while the first is held) does not replace the first.
    pub(crate) fn expect(&self, task: TaskId, partition: i32, offset: i64) {
        let mut records = self.records.lock().expect("pending lock");
        records.entry(task).or_insert((partition, offset));
    }

    /// The record was settled: its task no longer carries its position.
    pub(crate) fn forget(&self, task: TaskId, partition: i32, offset: i64) {
        let mut records = self.records.lock().expect("pending lock");
        if records.get(&task) == Some(&(partition, offset)) {
            records.remove(&task);
        }
    }
}

/// An [`Intercept`] over [`PgStore`] whose `complete` also saves the consumer
/// position, in the same transaction; every other call passes through. The
/// position saved is the tracker's safe position *as if this record were
/// finished*: the lowest other record in flight, or one past the highest seen.
/// Use it through [`Intercepted`], wrapping the same `PgStore`.
pub(crate) struct PositionedStore {
    store: Arc<PgStore>,
    positions: Arc<PgPositions>,
    pending: Arc<Pending>,
}

impl PositionedStore {
    /// The store the worker runs on: `store`, with completions that move positions.
    pub(crate) fn wrap(
        store: Arc<PgStore>,
        positions: Arc<PgPositions>,
        pending: Arc<Pending>,
    ) -> Intercepted<PgStore, PositionedStore> {
        Intercepted::new(
            store.clone(),
            Self {
                store,
                positions,
                pending,
            },
        )
    }
}

#[async_trait]
impl Intercept for PositionedStore {
    /// The batch claim goes to `PgStore`'s own `claim_many` (one statement);
    /// `Intercept`'s default would claim one by one.
    async fn claim_many(
        &self,
        inner: &dyn TaskStore,
        ids: &[TaskId],
        request: ClaimRequest,
    ) -> Result<Vec<Claim>> {
        inner.claim_many(ids, request).await
    }

    /// Likewise `PgStore`'s one-statement renewal of every held lease.
    async fn renew_many(
        &self,
        inner: &dyn TaskStore,
        leases: &mut [Lease],
        by: Duration,
    ) -> Result<Vec<Fenced<()>>> {
        inner.renew_many(leases, by).await
    }

    async fn complete(
        &self,
        inner: &dyn TaskStore,
        lease: Lease,
        response: Response,
    ) -> Result<Fenced<Task>> {
        let record = self
            .pending
            .records
            .lock()
            .expect("pending lock")
            .get(&lease.task_id())
            .copied();
        let Some((partition, offset)) = record else {
            return inner.complete(lease, response).await;
        };
        let position = {
            let mut after = self.pending.tracker.lock().expect("tracker lock").clone();
            after
                .finish(&partition, offset)
                .then(|| after.committable(&partition))
                .flatten()
        };
        let Some(position) = position else {
            // The partition was revoked: save the response alone.
            return inner.complete(lease, response).await;
        };
        // `on(&mut tx)` needs the concrete store: the transaction is PostgreSQL's.
        let mut tx = self.store.pool().begin().await.map_err(Error::storage)?;
        let outcome = self.store.on(&mut tx).complete(lease, response).await?;
        if outcome.is_accepted() {
            self.positions
                .save_in(&mut tx, &self.pending.topic, partition, position)
                .await?;
            let name = self.pending.consumer.clone();
            {
                // Under the tracker lock, which a kill takes to mark the consumer dead.
                let _tracker = self.pending.tracker.lock().expect("tracker lock");
                if self.pending.dead.load(Ordering::SeqCst) {
                    // A killed consumer runs no more code: the transaction rolls back on drop.
                    return Err(Error::storage(std::io::Error::other("consumer killed")));
                }
                // Journaled as issued, before the commit: if this process dies
                // during the commit, the position may or may not be saved.
                self.pending.journal.record(Event::Commit {
                    consumer: name.clone(),
                    partition,
                    offset: position,
                    with: Some(offset),
                });
            }
            let ok = tx.commit().await.map_err(Error::storage);
            self.pending.journal.record(Event::CommitResult {
                consumer: name,
                partition,
                offset: position,
                ok: ok.is_ok(),
            });
            ok?;
        } else {
            tx.rollback().await.map_err(Error::storage)?;
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskfence::testing::PgFixture;
    use taskfence::{InputHash, NewTask, Rejection, RequestKey, Status};
    use taskfence_test_support::fixture;

    /// The tests look at the store and the tracker, not at the events.
    struct Quiet;

    impl Journal for Quiet {
        fn record(&self, _event: Event) {}
    }

    struct Setup {
        _fixture: PgFixture,
        pg: Arc<PgStore>,
        positions: Arc<PgPositions>,
        tracker: Arc<Mutex<OffsetTracker<i32>>>,
        pending: Arc<Pending>,
        store: Intercepted<PgStore, PositionedStore>,
    }

    async fn setup() -> Setup {
        let fixture = fixture().await;
        let pg = Arc::new(fixture.pg_store().clone());
        let positions = Arc::new(PgPositions::new(&pg, "workers").await.unwrap());
        let tracker = Arc::new(Mutex::new(OffsetTracker::new()));
        let pending = Arc::new(Pending::new(
            "handoffs".into(),
            "a".into(),
            Arc::clone(&tracker),
            Arc::default(),
            Arc::new(Quiet),
        ));
        let store = PositionedStore::wrap(Arc::clone(&pg), Arc::clone(&positions), Arc::clone(&pending));
        Setup {
            _fixture: fixture,
            pg,
            positions,
            tracker,
            pending,
            store,
        }
    }

    async fn lease(store: &PgStore, key: &str) -> Lease {
        let task = store
            .submit(NewTask::new(
                RequestKey::new("u", "chat.reply", key),
                InputHash::of([key]),
            ))
            .await
            .unwrap()
            .into_task();
        match store
            .claim(task.id, ClaimRequest::new("a", Duration::from_secs(30)))
            .await
            .unwrap()
        {
            Claim::Acquired(lease) => lease,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn positions_only_move_forward_and_groups_are_separate() {
        let s = setup().await;
        s.positions.save("handoffs", 0, 10).await.unwrap();
        s.positions.save("handoffs", 0, 4).await.unwrap();
        s.positions.save("handoffs", 1, 3).await.unwrap();
        let other = PgPositions::new(&s.pg, "other-group").await.unwrap();
        other.save("handoffs", 0, 99).await.unwrap();
        let saved = s.positions.load("handoffs", &[0, 1, 2]).await.unwrap();
        assert_eq!(
            saved,
            HashMap::from([(0, 10), (1, 3)]),
            "a late, lower save never moves it back"
        );
        assert_eq!(
            other.load("handoffs", &[0]).await.unwrap(),
            HashMap::from([(0, 99)])
        );
    }

    #[tokio::test]
    async fn the_completion_saves_the_position_past_its_record_and_no_further() {
        let s = setup().await;
        {
            let mut t = s.tracker.lock().unwrap();
            for offset in 5..=7 {
                t.start(0, offset);
            }
        }
        let l6 = lease(&s.pg, "k6").await;
        s.pending.expect(l6.task_id(), 0, 6);
        let l5 = lease(&s.pg, "k5").await;
        s.pending.expect(l5.task_id(), 0, 5);
        assert!(
            s.store
                .complete(l6, Response::from("six"))
                .await
                .unwrap()
                .is_accepted()
        );
        assert_eq!(
            s.positions.load("handoffs", &[0]).await.unwrap(),
            HashMap::from([(0, 5)]),
            "5 is still running: the position stays on it"
        );
        s.tracker.lock().unwrap().finish(&0, 6);
        assert!(
            s.store
                .complete(l5, Response::from("five"))
                .await
                .unwrap()
                .is_accepted()
        );
        assert_eq!(
            s.positions.load("handoffs", &[0]).await.unwrap(),
            HashMap::from([(0, 7)]),
            "5 saved with it, 6 finished: 7 is next"
        );
    }

    #[tokio::test]
    async fn a_refused_completion_moves_no_position() {
        let s = setup().await;
        s.tracker.lock().unwrap().start(0, 3);
        let lease = lease(&s.pg, "k").await;
        s.pending.expect(lease.task_id(), 0, 3);
        let stale = lease.clone();
        assert!(
            s.store
                .complete(lease, Response::from("first"))
                .await
                .unwrap()
                .is_accepted()
        );
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {}.kafka_consumer_positions",
            s.pg.schema()
        )))
        .execute(s.pg.pool())
        .await
        .unwrap();
        let again = s.store.complete(stale, Response::from("second")).await.unwrap();
        assert!(
            matches!(again, Fenced::Rejected(Rejection::AlreadyCompleted(_))),
            "{again:?}"
        );
        assert!(
            s.positions.load("handoffs", &[0]).await.unwrap().is_empty(),
            "rolled back with it"
        );
    }

    #[tokio::test]
    async fn when_the_position_cannot_be_saved_the_response_is_not_saved_either() {
        let s = setup().await;
        // A position the table refuses (CHECK next_offset >= 0): the fault is real.
        s.tracker.lock().unwrap().start(0, -5);
        s.tracker.lock().unwrap().start(0, -3);
        let lease = lease(&s.pg, "k").await;
        let id = lease.task_id();
        s.pending.expect(id, 0, -3);
        let err = s.store.complete(lease, Response::from("lost")).await.unwrap_err();
        assert!(matches!(err, Error::Storage(_)), "{err:?}");
        let task = s.pg.get(id).await.unwrap().unwrap();
        assert_eq!(
            task.status,
            Status::Running,
            "the completion rolled back with the position"
        );
        assert_eq!(task.response, None);
    }
}
