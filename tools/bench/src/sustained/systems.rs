//! The systems under sustained load, each in a database of its own on the
//! private cluster: taskfence's consumer on `PgStore`, awa, and apalis (with
//! the `apalis` feature). Each enqueues a task carrying the time it was
//! enqueued, runs a no-op that reports that time to the [`Probe`] (pickup
//! latency), and counts its durable completions for the final check.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use taskfence::postgres::DEFAULT_SCHEMA;
use taskfence::runtime::{ConsumerConfig, Stop, StoreQueue};
use taskfence::{InputHash, NewTask, PgStore, RequestKey, Response, TaskStore};
use tokio::task::JoinHandle;

use crate::Res;

/// The lease every taskfence task is claimed with (awa's and apalis's own
/// defaults stand for theirs).
const LEASE: Duration = Duration::from_secs(30);

/// Microseconds since the Unix epoch: the stamp a task carries.
pub(crate) fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// What the work functions report: how many started, and each one's pickup
/// latency (enqueue to start, in microseconds) since the last [`Probe::take`].
#[derive(Default)]
pub(crate) struct Probe {
    started: AtomicU64,
    pickups: std::sync::Mutex<Vec<u64>>,
}

impl Probe {
    /// A work function started on a task enqueued at `stamp`.
    pub(crate) fn started(&self, stamp: u64) {
        self.started.fetch_add(1, Ordering::Relaxed);
        let latency = now_micros().saturating_sub(stamp);
        self.pickups.lock().expect("probe").push(latency);
    }

    /// Work functions started so far.
    pub(crate) fn count(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// The pickup latencies since the last call.
    pub(crate) fn take(&self) -> Vec<u64> {
        std::mem::take(&mut *self.pickups.lock().expect("probe"))
    }
}

/// Which system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Taskfence,
    Awa,
    #[cfg(feature = "apalis")]
    Apalis,
}

impl Kind {
    /// Every system this build measures.
    pub(crate) fn all() -> Vec<Kind> {
        #[allow(unused_mut)]
        let mut all = vec![Kind::Taskfence, Kind::Awa];
        #[cfg(feature = "apalis")]
        all.push(Kind::Apalis);
        all
    }

    /// The systems `names` asks for (`taskfence`, `awa`, `apalis`), in
    /// [`Kind::all`]'s order; every one when `names` is empty.
    pub(crate) fn selected(names: &[String]) -> Res<Vec<Kind>> {
        if let Some(unknown) = names
            .iter()
            .find(|n| !Kind::all().iter().any(|k| k.short() == n.as_str()))
        {
            return Err(format!(
                "--system {unknown:?}: this build measures {:?}",
                Kind::all().iter().map(|k| k.short()).collect::<Vec<_>>()
            )
            .into());
        }
        Ok(Kind::all()
            .into_iter()
            .filter(|k| names.is_empty() || names.iter().any(|n| n == k.short()))
            .collect())
    }

    /// The name `--system` takes.
    fn short(self) -> &'static str {
        match self {
            Kind::Taskfence => "taskfence",
            Kind::Awa => "awa",
            #[cfg(feature = "apalis")]
            Kind::Apalis => "apalis",
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Taskfence => "taskfence consumer",
            Kind::Awa => "awa",
            #[cfg(feature = "apalis")]
            Kind::Apalis => "apalis-postgres",
        }
    }
}

#[derive(Debug, serde::Deserialize, serde::Serialize, awa::JobArgs)]
struct AwaStamped {
    stamp: u64,
}

#[cfg(feature = "apalis")]
async fn apalis_started(
    stamp: u64,
    probe: apalis::prelude::Data<Arc<Probe>>,
) -> Result<(), apalis::prelude::BoxDynError> {
    probe.started(stamp);
    Ok(())
}

/// Enqueues on one system. Cheap to clone: each holds a pool.
#[derive(Clone)]
pub(crate) enum Producer {
    Taskfence(Arc<dyn TaskStore>),
    Awa(sqlx08::PgPool),
    #[cfg(feature = "apalis")]
    Apalis(apalis_postgres::PostgresStorage<u64>),
}

impl Producer {
    /// Enqueues task `i`. taskfence's key is `i`'s own, so a retry after an
    /// error (a killed connection) finds the task instead of making another;
    /// the peers' retry may enqueue twice, which the final check reports.
    pub(crate) async fn enqueue(&self, i: u64) -> Res<()> {
        let stamp = now_micros();
        match self {
            Producer::Taskfence(store) => {
                let key = format!("s-{i}");
                let new = NewTask::new(RequestKey::new("bench", "sustained", &key), InputHash::of([&key]))
                    .payload(stamp.to_be_bytes().to_vec())
                    .without_handoff();
                store.submit(new).await?;
            }
            Producer::Awa(pool) => {
                let opts = awa::InsertOpts {
                    queue: "bench".into(),
                    ..Default::default()
                };
                awa::insert_with(pool, &AwaStamped { stamp }, opts).await?;
            }
            #[cfg(feature = "apalis")]
            Producer::Apalis(storage) => {
                use apalis::prelude::TaskSink;
                let mut storage = storage.clone();
                storage
                    .push(stamp)
                    .await
                    .map_err(|e| format!("apalis push: {e}"))?;
            }
        }
        Ok(())
    }
}

/// One system set up in its database: how to enqueue, the running workers,
/// and the pools to close.
pub(crate) struct System {
    pub(crate) producer: Producer,
    workers: Workers,
    /// A sqlx 0.9 pool on the system's database, for counts.
    pool: PgPool,
}

enum Workers {
    Taskfence {
        stop: Stop,
        run: JoinHandle<Res<()>>,
    },
    Awa(Box<awa::Client>),
    #[cfg(feature = "apalis")]
    Apalis(Vec<JoinHandle<()>>),
    None,
}

/// A pool of `size` on `options` that survives killed connections (no
/// acquire-time ping; a dead connection fails one query and is replaced).
async fn pool(options: &PgConnectOptions, size: u32) -> Res<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(size)
        .test_before_acquire(false)
        .connect_with(options.clone())
        .await?)
}

impl System {
    /// Runs `kind`'s migrations in the database of `options`; no workers yet.
    pub(crate) async fn set_up(kind: Kind, options: &PgConnectOptions, workers: usize) -> Res<Self> {
        let size = u32::try_from(workers + 8)?;
        // The harness's own (spared by the terminator), pinged before use:
        // the restart kills it too.
        let counts = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options.clone().application_name(super::pressure::HARNESS))
            .await?;
        let producer = match kind {
            Kind::Taskfence => {
                let store = PgStore::builder(pool(options, size).await?).build()?;
                store.migrate().await?;
                Producer::Taskfence(Arc::new(store))
            }
            Kind::Awa => {
                let url = sqlx::ConnectOptions::to_url_lossy(options).to_string();
                let pool = sqlx08::postgres::PgPoolOptions::new()
                    .max_connections(size)
                    .test_before_acquire(false)
                    .connect(&url)
                    .await?;
                awa::migrations::run(&pool).await?;
                Producer::Awa(pool)
            }
            #[cfg(feature = "apalis")]
            Kind::Apalis => {
                let pool = pool(options, size).await?;
                apalis_postgres::PostgresStorage::setup(&pool).await?;
                Producer::Apalis(apalis_postgres::PostgresStorage::new(&pool))
            }
        };
        Ok(Self {
            producer,
            workers: Workers::None,
            pool: counts,
        })
    }

    /// Starts `workers` concurrent no-ops that report to `probe`.
    pub(crate) async fn start(&mut self, workers: usize, probe: Arc<Probe>) -> Res<()> {
        self.workers = match &self.producer {
            Producer::Taskfence(store) => {
                let queue = StoreQueue::new(store.clone());
                let config = ConsumerConfig::new("sustained", LEASE).concurrency(workers);
                let consumer = queue.consumer(config)?;
                let stop = consumer.stop().clone();
                let run = tokio::spawn(async move {
                    consumer
                        .run(move |ctx| {
                            let mut stamp = [0u8; 8];
                            let payload = &ctx.task().payload;
                            stamp.copy_from_slice(&payload[..8.min(payload.len())]);
                            probe.started(u64::from_be_bytes(stamp));
                            async { Ok(Response::from("done")) }
                        })
                        .await?;
                    Ok(())
                });
                Workers::Taskfence { stop, run }
            }
            Producer::Awa(pool) => {
                let client = awa::Client::builder(pool.clone())
                    .queue(
                        "bench",
                        awa::QueueConfig {
                            max_workers: u32::try_from(workers)?,
                            ..Default::default()
                        },
                    )
                    .register::<AwaStamped, _, _>(move |args, _ctx| {
                        probe.started(args.stamp);
                        async { Ok(awa::JobResult::Completed) }
                    })
                    .build()?;
                client.start().await?;
                Workers::Awa(Box::new(client))
            }
            #[cfg(feature = "apalis")]
            Producer::Apalis(storage) => {
                use apalis::prelude::*;
                let handles = (0..workers)
                    .map(|i| {
                        let worker = WorkerBuilder::new(format!("sustained-{i}"))
                            .backend(storage.clone())
                            .data(probe.clone())
                            .build(apalis_started);
                        tokio::spawn(async move {
                            let _ = worker.run().await;
                        })
                    })
                    .collect();
                Workers::Apalis(handles)
            }
        };
        Ok(())
    }

    /// Enqueued tasks not durably completed, from the system's own tables.
    /// taskfence and apalis keep every task's row: `enqueued` less the rows
    /// completed. awa moves finished jobs out of its hot tables into
    /// partitions it rotates and truncates, and its completion count
    /// (`terminal_jobs`) does not see every one (compact receipt batches), so
    /// for awa this is what its `admin::state_counts` reports in every other
    /// state: scheduled, available, running, retryable, waiting, failed or
    /// cancelled.
    pub(crate) async fn not_completed(&self, enqueued: u64) -> Res<i64> {
        let completed = match &self.producer {
            Producer::Taskfence(_) => {
                format!("SELECT count(*) FROM {DEFAULT_SCHEMA}.tasks WHERE status = 'completed'")
            }
            Producer::Awa(pool) => {
                return Ok(awa::admin::state_counts(pool)
                    .await?
                    .iter()
                    .filter(|(state, _)| **state != awa::JobState::Completed)
                    .map(|(_, n)| n)
                    .sum());
            }
            #[cfg(feature = "apalis")]
            Producer::Apalis(_) => "SELECT count(*) FROM apalis.jobs WHERE status = 'Done'".to_owned(),
        };
        let completed: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(completed))
            .fetch_one(&self.pool)
            .await?;
        Ok(i64::try_from(enqueued)? - completed)
    }

    /// taskfence only: tasks with more than one completed attempt (two saved
    /// responses), and tasks whose attempts in the budget exceed it. `None`
    /// for a peer, whose tables record neither.
    pub(crate) async fn violations(&self) -> Res<Option<(i64, i64)>> {
        let Producer::Taskfence(_) = self.producer else {
            return Ok(None);
        };
        let twice: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM (SELECT task_id FROM {DEFAULT_SCHEMA}.attempts \
             WHERE outcome = 'completed' GROUP BY task_id HAVING count(*) > 1) t"
        )))
        .fetch_one(&self.pool)
        .await?;
        let over: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {DEFAULT_SCHEMA}.tasks WHERE version - budget_base > max_attempts"
        )))
        .fetch_one(&self.pool)
        .await?;
        Ok(Some((twice, over)))
    }

    /// Stops the workers (awa and taskfence gracefully, apalis's aborted).
    pub(crate) async fn stop(&mut self) -> Res<()> {
        match std::mem::replace(&mut self.workers, Workers::None) {
            Workers::Taskfence { stop, run } => {
                stop.request();
                run.await?
                    .map_err(|e| format!("the consumer stopped with an error: {e}"))?;
            }
            Workers::Awa(client) => client.shutdown(Duration::from_secs(10)).await,
            #[cfg(feature = "apalis")]
            Workers::Apalis(handles) => {
                for h in handles {
                    h.abort();
                }
            }
            Workers::None => {}
        }
        Ok(())
    }

    /// Closes the system's pools.
    pub(crate) async fn close(self) {
        match self.producer {
            Producer::Taskfence(_) => {}
            Producer::Awa(pool) => pool.close().await,
            #[cfg(feature = "apalis")]
            Producer::Apalis(_) => {}
        }
        self.pool.close().await;
    }
}
