//! Peers: the same queue workload on taskfence (the consumer on the store,
//! and the broker path in batches), the raw-SQL batched ceiling, apalis
//! (`apalis-postgres`), River (`riverqueue`, fetch cooldown tuned and
//! default) and awa, side by side in one run, with the WAL bytes and write
//! transactions each spends per task.
//!
//! Per system and worker count `W`: a fresh schema (apalis and awa: a fresh
//! temporary database, their migrations create fixed schemas), set up with the
//! system's own migrations; `N` tasks enqueued one by one by `W` producers
//! (enqueue throughput); then `W` workers run a no-op on every task, and the
//! clock stops when a count in the database reaches `N` completions
//! (processing throughput). Systems take turns in an order rotated per round.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgPool;
use taskfence::{Claim, ClaimRequest, PgStore, Response, TaskId, TaskStore};
use taskfence_test_support::{TempDatabase, TempSchema};
use tokio::sync::{Mutex, mpsc};

use crate::db::{BenchSchema, LEASE, RESPONSE, Raw};
use crate::lifecycle::{fresh_key, new_task};
use crate::report::{Report, Series};
use crate::stats::{median, ratio};
use crate::{Config, Res};

/// Tasks per batch of the batched taskfence side (SQS's batch size).
pub(crate) const BATCH: usize = 10;

/// The systems, in the report's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum System {
    Consumer,
    ConsumerPrefetch,
    ConsumerNotify,
    Batched,
    Ceiling,
    Apalis,
    River,
    RiverDefault,
    Awa,
}

impl System {
    pub(crate) const ALL: [System; 9] = [
        System::Consumer,
        System::ConsumerPrefetch,
        System::ConsumerNotify,
        System::Batched,
        System::Ceiling,
        System::Apalis,
        System::River,
        System::RiverDefault,
        System::Awa,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            System::Consumer => "taskfence consumer",
            System::ConsumerPrefetch => "taskfence consumer, prefetch 4×",
            System::ConsumerNotify => "taskfence consumer, NOTIFY",
            System::Batched => "taskfence broker, batched",
            System::Ceiling => "raw-SQL batched ceiling",
            System::Apalis => "apalis-postgres",
            System::River => "River (riverqueue), 1 ms cooldown",
            System::RiverDefault => "River (riverqueue), default",
            System::Awa => "awa",
        }
    }

    fn is_peer(self) -> bool {
        Self::PEERS.contains(&self)
    }

    /// The peers a ratio is taken to (the fastest of them).
    const PEERS: [System; 4] = [System::Apalis, System::River, System::RiverDefault, System::Awa];

    /// Whether this build measures it (apalis needs the `apalis` feature).
    fn built(self) -> bool {
        self != System::Apalis || cfg!(feature = "apalis")
    }
}

/// One measurement: tasks per second, and what the cluster wrote per task.
#[derive(Debug, Clone, Copy)]
struct Rates {
    enqueue: f64,
    process: f64,
    cost: Cost,
}

/// What one task cost the cluster from its enqueue to its completion,
/// averaged over a measurement: WAL bytes (`pg_current_wal_lsn` before and
/// after), write transactions (transaction ids assigned: every transaction
/// that wrote, committed or not; read-only ones take none), index entries
/// written (the B-tree insert and split records of that WAL, read with
/// `pg_walinspect`) and dead tuples left in the database's tables (counted
/// page by page: on a server without autovacuum, what vacuum would have to
/// reclaim). The WAL figures are cluster-wide and exact, so a
/// measurement includes whatever else the server did meanwhile: run the
/// harness on a quiet server. The last two are `None` where the server
/// lacks those contrib extensions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cost {
    wal_bytes: f64,
    pub(crate) write_transactions: f64,
    index_entries: Option<f64>,
    dead_tuples: Option<f64>,
}

/// The cluster's WAL position and next transaction id when a measurement
/// began (the peers run in other databases; both counters span the
/// cluster), and the dead tuples of the measured database then.
pub(crate) struct Meter {
    lsn: String,
    next_xid: i64,
    dead: Option<i64>,
}

/// B-tree WAL records that write an index entry into a leaf: an insert
/// (into a posting list too) or a page split, which carries the new entry.
const INDEX_ENTRY_RECORDS: &str =
    "('Btree/INSERT_LEAF', 'Btree/INSERT_POST', 'Btree/SPLIT_L', 'Btree/SPLIT_R')";

impl Meter {
    pub(crate) async fn start(pool: &PgPool) -> Res<Self> {
        let extensions = sqlx::raw_sql(
            "CREATE EXTENSION IF NOT EXISTS pg_walinspect; CREATE EXTENSION IF NOT EXISTS pgstattuple; \
             CREATE EXTENSION IF NOT EXISTS pageinspect",
        )
        .execute(pool)
        .await;
        if let Err(error) = &extensions {
            eprintln!("[bench] no index entries or dead tuples per task: {error}");
        }
        let dead = match extensions {
            Ok(_) => Some(dead_tuples(pool).await?),
            Err(_) => None,
        };
        let (lsn, next_xid): (String, i64) =
            sqlx::query_as("SELECT pg_current_wal_lsn()::text, txid_snapshot_xmax(txid_current_snapshot())")
                .fetch_one(pool)
                .await?;
        Ok(Self { lsn, next_xid, dead })
    }

    /// The cost per task of the `n` tasks measured since [`Meter::start`].
    pub(crate) async fn per_task(&self, pool: &PgPool, n: u64) -> Res<Cost> {
        // The flushed end: `pg_walinspect` reads only WAL already flushed
        // (every measured commit is: `synchronous_commit` is on).
        let (wal, next_xid, end): (f64, i64, String) = sqlx::query_as(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8, \
                    txid_snapshot_xmax(txid_current_snapshot()), pg_current_wal_flush_lsn()::text",
        )
        .bind(&self.lsn)
        .fetch_one(pool)
        .await?;
        let n_f = n as f64;
        let (index_entries, dead_tuples) = match self.dead {
            Some(before) => {
                let records = format!(
                    "SELECT coalesce(sum(count), 0)::bigint FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, true) \
                     WHERE \"resource_manager/record_type\" IN {INDEX_ENTRY_RECORDS}"
                );
                let entries: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(records))
                    .bind(&self.lsn)
                    .bind(&end)
                    .fetch_one(pool)
                    .await?;
                let dead = dead_tuples(pool).await?;
                (Some(entries as f64 / n_f), Some((dead - before) as f64 / n_f))
            }
            None => (None, None),
        };
        Ok(Cost {
            wal_bytes: wal / n_f,
            write_transactions: (next_xid - self.next_xid) as f64 / n_f,
            index_entries,
            dead_tuples,
        })
    }
}

/// Dead tuples in every table of the database outside the catalogs, counted
/// page by page, not estimated: dead versions still holding their space
/// (`pgstattuple`) and those a page prune already cut to a dead line pointer
/// (`pageinspect`), which vacuum must still visit, with their index entries.
async fn dead_tuples(pool: &PgPool) -> Res<i64> {
    Ok(sqlx::query_scalar(
        "WITH t AS (
             SELECT c.oid FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
             WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema')
               AND n.nspname NOT LIKE 'pg_toast%')
         SELECT (SELECT coalesce(sum((pgstattuple(t.oid)).dead_tuple_count), 0) FROM t)::bigint
              + (SELECT count(*)
                 FROM t, generate_series(0, pg_relation_size(t.oid) / current_setting('block_size')::bigint - 1) AS b,
                      heap_page_items(get_raw_page(t.oid::regclass::text, b)) AS i
                 WHERE i.lp_flags = 3)::bigint",
    )
    .fetch_one(pool)
    .await?)
}

/// Runs `n` calls of `step(i)`, `i` in `0..n`, on `workers` concurrent
/// producers, each one call at a time; returns calls per second.
pub(crate) async fn produce<F, Fut>(workers: usize, n: u64, step: F) -> Res<f64>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Res<()>> + Send + 'static,
{
    let step = Arc::new(step);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (step, next) = (step.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Res::Ok(());
                    }
                    step(i).await?;
                }
            })
        })
        .collect();
    for h in handles {
        h.await??;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// Polls `count` every 5 ms until it reaches `n`; errors after `limit`.
pub(crate) async fn wait_for<F, Fut>(n: u64, limit: Duration, mut count: F) -> Res<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Res<i64>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let done = count().await?;
        if u64::try_from(done).unwrap_or(0) >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("only {done} of {n} tasks completed within {limit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How long one processing phase may take before the run fails.
pub(crate) fn limit(n: u64) -> Duration {
    Duration::from_secs(60 + n / 5)
}

async fn measure(cfg: &Config, pool: &PgPool, system: System, workers: usize, n: u64) -> Res<Rates> {
    match system {
        System::Consumer => consumer(cfg, pool, workers, n, 1, false).await,
        System::ConsumerPrefetch => consumer(cfg, pool, workers, n, 4, false).await,
        System::ConsumerNotify => consumer(cfg, pool, workers, n, 1, true).await,
        System::Batched => taskfence(cfg, pool, workers, n, BATCH).await,
        System::Ceiling => ceiling(cfg, pool, workers, n).await,
        #[cfg(feature = "apalis")]
        System::Apalis => apalis(cfg, workers, n).await,
        #[cfg(not(feature = "apalis"))]
        System::Apalis => Err("apalis-postgres is not built (feature `apalis`)".into()),
        System::River => river(cfg, workers, n, Some(riverqueue::FETCH_COOLDOWN_MIN)).await,
        System::RiverDefault => river(cfg, workers, n, None).await,
        System::Awa => awa(cfg, workers, n).await,
    }
}

/// The consumer on the store: `submit` without a handoff one by one; then a
/// `Consumer` on a `StoreQueue` with `concurrency = W` and `prefetch =
/// prefetch × W` runs a no-op on each (`claim_next` fetches,
/// group-committed completions). With `notify`, each submission also
/// `NOTIFY`s and the consumer listens (`StoreQueue::wake_on_notify`): the
/// cost of the cross-process wake-up under load.
async fn consumer(
    cfg: &Config,
    main: &PgPool,
    workers: usize,
    n: u64,
    prefetch: usize,
    notify: bool,
) -> Res<Rates> {
    use taskfence::runtime::{ConsumerConfig, StoreQueue};

    let schema = BenchSchema::create(cfg, main).await?;
    // One more connection for the listener.
    let pool = own_pool(cfg, workers + usize::from(notify)).await?;
    let mut builder = PgStore::builder(pool.clone()).schema(schema.name());
    if notify {
        builder = builder.notify_on_submit();
    }
    let pg = builder.build()?;
    let store: Arc<dyn TaskStore> = Arc::new(pg.clone());
    let queue = StoreQueue::new(store.clone());
    // Listening while the tasks are submitted, as a deployment would.
    let listening = notify.then(|| queue.wake_on_notify(&pg));
    let meter = Meter::start(&pool).await?;
    let enqueue = {
        let store = store.clone();
        produce(workers, n, move |_| {
            let store = store.clone();
            async move {
                let submitted = store
                    .submit(new_task(&fresh_key("peer")).without_handoff())
                    .await?;
                if !submitted.is_created() {
                    return Err("submit of a fresh key found an existing task".into());
                }
                Ok(())
            }
        })
        .await?
    };
    let start = Instant::now();
    let config = ConsumerConfig::new("bench", LEASE)
        .concurrency(workers)
        .prefetch(prefetch * workers)
        .idle(Duration::from_millis(1), Duration::from_millis(20));
    let consumer = queue.consumer(config)?;
    let stop = consumer.stop().clone();
    let running = tokio::spawn(consumer.run(|_ctx| async { Ok(Response::new(RESPONSE.to_vec())) }));
    all_completed(&pool, &schema, n).await?;
    let process = n as f64 / start.elapsed().as_secs_f64();
    let cost = meter.per_task(&pool, n).await?;
    stop.request();
    let stopped = running.await??;
    if let Some(listening) = listening {
        listening.abort();
    }
    if stopped.completed != n {
        return Err(format!("the consumer completed {} of {n}", stopped.completed).into());
    }
    pool.close().await;
    drop(schema);
    Ok(Rates {
        enqueue,
        process,
        cost,
    })
}

/// Waits until `n` tasks of taskfence's `schema` are completed.
async fn all_completed(pool: &PgPool, schema: &BenchSchema, n: u64) -> Res<()> {
    let count = format!(
        "SELECT count(*) FROM {}.tasks WHERE status = 'completed'",
        schema.q()
    );
    wait_for(n, limit(n), || async {
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(count.as_str()))
            .fetch_one(pool)
            .await?)
    })
    .await
}

/// A pool of `W + 4` connections, like the rest of the harness's.
pub(crate) async fn own_pool(cfg: &Config, workers: usize) -> Res<PgPool> {
    crate::pool(cfg, u32::try_from(workers + 4)?, &[]).await
}

/// taskfence: `submit` one by one; then a dispatcher (`dispatch_batches(100,
/// batch)`, publishing into an in-process channel that stands for the broker)
/// and `W` workers taking one message each: `claim` + `complete` for a
/// message of one task, `claim_many` + `complete_many` for a batch.
async fn taskfence(cfg: &Config, main: &PgPool, workers: usize, n: u64, batch: usize) -> Res<Rates> {
    let schema = BenchSchema::create(cfg, main).await?;
    let pool = own_pool(cfg, workers).await?;
    let store = PgStore::builder(pool.clone()).schema(schema.name()).build()?;
    let meter = Meter::start(&pool).await?;
    let enqueue = {
        let store = store.clone();
        produce(workers, n, move |_| {
            let store = store.clone();
            async move {
                let submitted = store.submit(new_task(&fresh_key("peer"))).await?;
                if !submitted.is_created() {
                    return Err("submit of a fresh key found an existing task".into());
                }
                Ok(())
            }
        })
        .await?
    };

    let start = Instant::now();
    let (tx, rx) = mpsc::unbounded_channel::<Vec<TaskId>>();
    let rx = Arc::new(Mutex::new(rx));
    let dispatcher = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut published = 0u64;
            while published < n {
                let round = store
                    .dispatch_batches(100, batch, |stamps| {
                        let ids = stamps.iter().map(|stamp| stamp.task_id).collect();
                        let sent = tx.send(ids).map_err(|_| "the workers are gone");
                        async move { sent }
                    })
                    .await?;
                if let Some((id, e)) = round.failed {
                    return Err(format!("publishing {id:?} failed: {e}").into());
                }
                if round.published.is_empty() {
                    return Err(format!("the outbox ran dry after {published} of {n}").into());
                }
                published += round.published.len() as u64;
            }
            Res::Ok(())
        })
    };
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (store, rx) = (store.clone(), rx.clone());
            tokio::spawn(async move {
                loop {
                    let Some(ids) = rx.lock().await.recv().await else {
                        return Res::Ok(());
                    };
                    work(&store, &ids).await?;
                }
            })
        })
        .collect();
    all_completed(&pool, &schema, n).await?;
    let process = n as f64 / start.elapsed().as_secs_f64();
    let cost = meter.per_task(&pool, n).await?;
    dispatcher.await??;
    for h in handles {
        h.await??;
    }
    pool.close().await;
    drop(schema);
    Ok(Rates {
        enqueue,
        process,
        cost,
    })
}

/// One message: one task claimed and completed, or a batch with one
/// statement for the claims and one for the completions.
async fn work(store: &PgStore, ids: &[TaskId]) -> Res<()> {
    let request = ClaimRequest::new("w", LEASE);
    if let [id] = ids {
        let Claim::Acquired(lease) = store.claim(*id, request).await? else {
            return Err("claim of a fresh task refused".into());
        };
        store
            .complete(lease, Response::new(RESPONSE.to_vec()))
            .await?
            .into_result()
            .map_err(|r| format!("complete rejected: {r}"))?;
        return Ok(());
    }
    let mut completions = Vec::with_capacity(ids.len());
    for claim in store.claim_many(ids, request).await? {
        let Claim::Acquired(lease) = claim else {
            return Err(format!("claim_many of a fresh task: {claim:?}").into());
        };
        completions.push((lease, Response::new(RESPONSE.to_vec())));
    }
    for saved in store.complete_many(completions).await? {
        saved?
            .into_result()
            .map_err(|r| format!("complete_many rejected: {r}"))?;
    }
    Ok(())
}

/// The batched ceiling: the raw `INSERT` one by one; then `W` tasks in
/// flight as `ceil(W / 10)` loops, each claiming up to its share of `W`
/// oldest pending rows in one `FOR UPDATE SKIP LOCKED` statement and
/// completing them in one guarded bulk `UPDATE` (a partial index of pending
/// ids serves the fetch).
async fn ceiling(cfg: &Config, main: &PgPool, workers: usize, n: u64) -> Res<Rates> {
    let schema = BenchSchema::create(cfg, main).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE INDEX tasks_pending_id ON {}.tasks (id) WHERE status = 'pending'",
        schema.raw()
    )))
    .execute(main)
    .await?;
    let pool = own_pool(cfg, workers).await?;
    let raw = Arc::new(Raw::new(&schema));
    let meter = Meter::start(&pool).await?;
    let enqueue = {
        let (raw, pool) = (raw.clone(), pool.clone());
        produce(workers, n, move |_| {
            let (raw, pool) = (raw.clone(), pool.clone());
            async move { raw.submit(&pool, &fresh_key("peer")).await.map(drop) }
        })
        .await?
    };
    let start = Instant::now();
    let loops = workers.div_ceil(BATCH);
    let share = workers.div_ceil(loops);
    let handles: Vec<_> = (0..loops)
        .map(|_| {
            let (raw, pool) = (raw.clone(), pool.clone());
            tokio::spawn(async move {
                loop {
                    let batch = raw.claim_batch(&pool, share).await?;
                    if batch.is_empty() {
                        return Res::Ok(());
                    }
                    raw.complete_batch(&pool, &batch).await?;
                }
            })
        })
        .collect();
    let count = format!(
        "SELECT count(*) FROM {}.tasks WHERE status = 'completed'",
        schema.raw()
    );
    wait_for(n, limit(n), || async {
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(count.as_str()))
            .fetch_one(&pool)
            .await?)
    })
    .await?;
    let process = n as f64 / start.elapsed().as_secs_f64();
    let cost = meter.per_task(&pool, n).await?;
    for h in handles {
        h.await??;
    }
    pool.close().await;
    drop(schema);
    Ok(Rates {
        enqueue,
        process,
        cost,
    })
}

/// A sqlx 0.9 pool (the peers' sqlx) of `W + 4` connections on `database`
/// (the server's default when `None`), without an acquire-time ping.
async fn pool09(cfg: &Config, workers: usize, database: Option<&str>) -> Res<sqlx::PgPool> {
    let mut options: sqlx::postgres::PgConnectOptions = cfg.url.parse()?;
    if let Some(db) = database {
        options = options.database(db);
    }
    let size = u32::try_from(workers + 4)?;
    Ok(sqlx::postgres::PgPoolOptions::new()
        .max_connections(size)
        .min_connections(size)
        .test_before_acquire(false)
        .connect_with(options)
        .await?)
}

/// A database of its own for a peer whose migrations create a fixed schema
/// (apalis's `apalis`, awa's `awa`), announced on stderr; dropped on drop.
async fn temp_database(url: &str) -> TempDatabase {
    let db = TempDatabase::create_at(url).await;
    eprintln!("[bench] created database {}", db.name());
    db
}

#[cfg(feature = "apalis")]
pub(crate) async fn apalis_noop(_task: u64) -> Result<(), apalis::prelude::BoxDynError> {
    Ok(())
}

#[cfg(feature = "apalis")]
/// apalis 1.x on PostgreSQL: `PostgresStorage::setup` (its migrations) in a
/// fresh database; `push` one by one; `W` apalis workers on the storage
/// (default `Config`: fetches of 10, results acknowledged in batches).
async fn apalis(cfg: &Config, workers: usize, n: u64) -> Res<Rates> {
    use apalis::prelude::*;
    use apalis_postgres::PostgresStorage;

    let db = temp_database(&cfg.url).await;
    let result = async {
        let pool = pool09(cfg, workers, Some(db.name())).await?;
        PostgresStorage::setup(&pool).await?;
        let storage = PostgresStorage::<u64>::new(&pool);
        let meter = Meter::start(&pool).await?;
        let enqueue = {
            let storage = storage.clone();
            produce(workers, n, move |i| {
                let mut storage = storage.clone();
                async move {
                    storage.push(i).await.map_err(|e| format!("apalis push: {e}"))?;
                    Ok(())
                }
            })
            .await?
        };
        let start = Instant::now();
        let handles: Vec<_> = (0..workers)
            .map(|i| {
                let worker = WorkerBuilder::new(format!("bench-{i}"))
                    .backend(storage.clone())
                    .build(apalis_noop);
                tokio::spawn(async move { worker.run().await })
            })
            .collect();
        let counted = wait_for(n, limit(n), || async {
            Ok(
                sqlx::query_scalar("SELECT count(*) FROM apalis.jobs WHERE status = 'Done'")
                    .fetch_one(&pool)
                    .await?,
            )
        })
        .await;
        let process = n as f64 / start.elapsed().as_secs_f64();
        let cost = meter.per_task(&pool, n).await;
        for h in &handles {
            h.abort();
        }
        for h in handles {
            if let Ok(Err(e)) = h.await {
                return Err(format!("an apalis worker stopped: {e}").into());
            }
        }
        pool.close().await;
        counted?;
        let cost = cost?;
        Res::Ok(Rates {
            enqueue,
            process,
            cost,
        })
    }
    .await;
    drop(db);
    result
}

#[derive(Debug, serde::Deserialize, serde::Serialize, awa::JobArgs)]
struct AwaNoop {
    n: u64,
}

/// awa (0.6, on sqlx 0.8) with its documented defaults: its migrations
/// (`awa::migrations::run`) in a fresh database; `insert_with` one by one;
/// one `Client` with the queue at `max_workers = W` (its default
/// `QueueConfig` otherwise: polling every 200 ms between notifications,
/// claims in batches, completions batched). Completed is awa's own count
/// (`admin::state_counts`).
async fn awa(cfg: &Config, workers: usize, n: u64) -> Res<Rates> {
    use awa::{Client, InsertOpts, JobResult, QueueConfig};

    let db = temp_database(&cfg.url).await;
    let result = async {
        let mut options: sqlx08::postgres::PgConnectOptions = cfg.url.parse()?;
        options = options.database(db.name());
        // W connections for the work, and awa's own: its listener, heartbeat,
        // maintenance and completion batcher.
        let pool = sqlx08::postgres::PgPoolOptions::new()
            .max_connections(u32::try_from(workers + 8)?)
            .connect_with(options)
            .await?;
        awa::migrations::run(&pool).await?;
        let meter_pool = pool09(cfg, 0, None).await?;
        let opts = || InsertOpts {
            queue: "bench".into(),
            ..Default::default()
        };
        let meter = Meter::start(&meter_pool).await?;
        let enqueue = {
            let pool = pool.clone();
            produce(workers, n, move |i| {
                let pool = pool.clone();
                async move {
                    awa::insert_with(&pool, &AwaNoop { n: i }, opts()).await?;
                    Ok(())
                }
            })
            .await?
        };
        let start = Instant::now();
        let client = Client::builder(pool.clone())
            .queue(
                "bench",
                QueueConfig {
                    max_workers: u32::try_from(workers)?,
                    ..Default::default()
                },
            )
            .register::<AwaNoop, _, _>(|_args, _ctx| async { Ok(JobResult::Completed) })
            .build()?;
        client.start().await?;
        let counted = wait_for(n, limit(n), || async {
            let counts = awa::admin::state_counts(&pool).await?;
            Ok(counts.get(&awa::JobState::Completed).copied().unwrap_or(0))
        })
        .await;
        let process = n as f64 / start.elapsed().as_secs_f64();
        let cost = meter.per_task(&meter_pool, n).await;
        client.shutdown(Duration::from_secs(10)).await;
        pool.close().await;
        meter_pool.close().await;
        counted?;
        Res::Ok(Rates {
            enqueue,
            process,
            cost: cost?,
        })
    }
    .await;
    drop(db);
    result
}

#[derive(Clone, Debug, serde::Deserialize, serde::Serialize, riverqueue::JobArgs)]
#[river(kind = "bench_noop")]
struct RiverNoop {
    n: u64,
}

async fn river_noop(
    _context: riverqueue::WorkContext,
    _job: riverqueue::Job<RiverNoop>,
) -> Result<riverqueue::WorkOutcome, riverqueue::BoxError> {
    Ok(riverqueue::WorkOutcome::Complete)
}

/// River for Rust: its migrations into a fresh schema; `Client::insert` one
/// by one; one client with `max_workers = W` on the queue, River's defaults
/// otherwise, the fetch cooldown `cooldown` when given (its 100 ms default
/// caps a queue at one fetch per 100 ms; the tuned side uses the 1 ms minimum).
async fn river(cfg: &Config, workers: usize, n: u64, cooldown: Option<Duration>) -> Res<Rates> {
    use riverqueue::database::{PostgresDatabase, SchemaName};
    use riverqueue::{Client, QueueConfig, Workers};

    let schema = TempSchema::new(&cfg.url, "taskfence_bench_river_").await;
    let name = schema.name().to_owned();
    let pool = pool09(cfg, workers, None).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{name}\"")))
        .execute(&pool)
        .await?;
    eprintln!("[bench] created schemas {name}");
    let schema_name = SchemaName::new(&name)?;
    riverqueue::migrate::PostgresMigrator::new(pool.clone())
        .with_schema(schema_name.clone())
        .migrate_up()
        .await?;
    let mut registry = Workers::new();
    registry.add_fn(river_noop)?;
    let mut builder = Client::builder(PostgresDatabase::new(pool.clone()).with_schema(schema_name))
        .workers(registry)
        .queue("default", QueueConfig::new(workers));
    if let Some(cooldown) = cooldown {
        builder = builder.fetch_cooldown(cooldown);
    }
    let client = builder.build()?;
    let meter = Meter::start(&pool).await?;
    let enqueue = {
        let client = client.clone();
        produce(workers, n, move |i| {
            let client = client.clone();
            async move {
                client.insert(RiverNoop { n: i }).await?;
                Ok(())
            }
        })
        .await?
    };
    let start = Instant::now();
    let mut run = client.start()?;
    let count = format!("SELECT count(*) FROM \"{name}\".river_job WHERE state = 'completed'");
    let counted = wait_for(n, limit(n), || async {
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(count.clone()))
            .fetch_one(&pool)
            .await?)
    })
    .await;
    let process = n as f64 / start.elapsed().as_secs_f64();
    let cost = meter.per_task(&pool, n).await;
    run.stop().await?;
    drop(client);
    pool.close().await;
    counted?;
    let cost = cost?;
    drop(schema);
    Ok(Rates {
        enqueue,
        process,
        cost,
    })
}

/// Tasks per measurement at `workers`.
pub(crate) fn tasks(cfg: &Config, workers: usize) -> u64 {
    if cfg.mode == crate::Mode::Quick {
        return 10 + 2 * workers as u64;
    }
    match workers {
        1 => 400,
        w if w <= 8 => 2_000,
        _ => 3_000,
    }
}

pub(crate) async fn run(cfg: &Config, pool: &PgPool, report: &mut Report) -> Res<()> {
    let mut rates: BTreeMap<(usize, System), Vec<Rates>> = BTreeMap::new();
    for round in 0..cfg.peer_rounds {
        for (i, &workers) in cfg.workers.iter().enumerate() {
            let n = tasks(cfg, workers);
            let mut order = System::ALL;
            order.rotate_left((round + i) % System::ALL.len());
            for system in order.into_iter().filter(|s| s.built()) {
                eprintln!(
                    "[bench] peers: round {round}, {workers} workers, {n} tasks, {}",
                    system.name()
                );
                let r = measure(cfg, pool, system, workers, n).await?;
                rates.entry((workers, system)).or_default().push(r);
            }
        }
    }
    // NaN for a system not built: `max` then picks the other peer.
    let med = |w: usize, s: System, f: fn(&Rates) -> f64| -> f64 {
        rates
            .get(&(w, s))
            .map_or(f64::NAN, |r| median(&r.iter().map(f).collect::<Vec<_>>()))
    };
    let enq = |r: &Rates| r.enqueue;
    let proc_ = |r: &Rates| r.process;
    let wal = |r: &Rates| r.cost.wal_bytes;
    let writes = |r: &Rates| r.cost.write_transactions;
    let entries = |r: &Rates| r.cost.index_entries.unwrap_or(f64::NAN);
    let dead = |r: &Rates| r.cost.dead_tuples.unwrap_or(f64::NAN);
    let per_task = |v: f64| {
        if v.is_nan() {
            "–".to_owned()
        } else {
            format!("{v:.2}")
        }
    };

    report.section(
        "Peers: enqueue and processing throughput",
        &format!(
            "The same workload on every system, each in a fresh schema set up by its own migrations \
             (apalis: a fresh temporary database, its schema is fixed): N tasks enqueued one by one \
             by W producers (enqueue), then W workers run a no-op on each (processing), the clock \
             stopping when a count in the database reaches N completions (polled every 5 ms). \
             **taskfence consumer**: `submit` of tasks without a handoff (one row each), then \
             `runtime::Consumer` on a `StoreQueue` with `concurrency = W` (`claim_next` fetches up \
             to the free slots, completions group-committed by `complete_many`; `prefetch` W (the \
             former default) and 4W in the second row; the idle wait 1–20 ms; in the third row the \
             store `NOTIFY`s each submission (`PgStoreBuilder::notify_on_submit`) and the consumer \
             listens, `StoreQueue::wake_on_notify`, during the enqueue too). **taskfence \
             broker, batched**: `submit` (task and handoff row), a dispatcher \
             (`dispatch_batches(100, {BATCH})` into an in-process channel standing for the broker, \
             included in the processing time) and per message of {BATCH} tasks `claim_many` + \
             `complete_many`. **raw-SQL batched ceiling**: the hand-written `INSERT`, then W tasks in \
             flight as ceil(W/{BATCH}) loops, each claiming its share in one `FOR UPDATE SKIP LOCKED` \
             statement and completing them in one guarded bulk `UPDATE` (no attempt history, no \
             fencing beyond the version, nothing else written). **apalis-postgres** 1.0: `push`, W \
             apalis workers with the default `Config` (fetches of 10, acknowledgements in batches). \
             **River** (riverqueue 0.5): `Client::insert`, one client with `max_workers = W`, the \
             fetch cooldown at its 1 ms minimum, and at its 100 ms default. **awa** 0.6: \
             `insert_with`, one `Client` with the queue at `max_workers = W` and its default \
             `QueueConfig` otherwise (a fresh temporary database; completions counted by \
             `admin::state_counts`). Every system gets its own pool of W + 4 connections (awa W + 8: \
             its listener, heartbeat and maintenance take their own). Per task, from the first \
             enqueue to the last completion: WAL bytes (`pg_current_wal_lsn` before and after), \
             write transactions (transaction ids assigned, committed or not) and index entries \
             written (B-tree insert and split records of that WAL, `pg_walinspect`), cluster-wide: \
             the server ran nothing else; and dead tuples left in the system's tables (counted \
             page by page with `pgstattuple` and `pageinspect`, dead line pointers included; the \
             shared server runs without autovacuum, so this is what vacuum would have to \
             reclaim). N = {} / {} / {} at 1 / 8 / 32 workers; {} round(s), the order of systems \
             rotated per round; medians. Ratios are to the fastest peer \
             (apalis, River tuned, River default, awa) at that worker count.",
            tasks(cfg, 1),
            tasks(cfg, 8),
            tasks(cfg, 32),
            cfg.peer_rounds
        ),
    );
    let best = |w: usize, f: fn(&Rates) -> f64| {
        System::PEERS
            .into_iter()
            .map(|p| med(w, p, f))
            .fold(f64::NAN, f64::max)
    };
    let mut rows = Vec::new();
    for &workers in &cfg.workers {
        let (best_enq, best_proc) = (best(workers, enq), best(workers, proc_));
        for system in System::ALL {
            if !system.built() {
                let no = "not built (feature `apalis`)".to_owned();
                rows.push(vec![
                    workers.to_string(),
                    system.name().to_owned(),
                    no.clone(),
                    "–".into(),
                    no,
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                ]);
                continue;
            }
            let (e, p) = (med(workers, system, enq), med(workers, system, proc_));
            rows.push(vec![
                workers.to_string(),
                system.name().to_owned(),
                format!("{e:.0}"),
                ratio(e, best_enq),
                format!("{p:.0}"),
                ratio(p, best_proc),
                format!("{:.0}", med(workers, system, wal)),
                format!("{:.2}", med(workers, system, writes)),
                per_task(med(workers, system, entries)),
                per_task(med(workers, system, dead)),
            ]);
        }
    }
    report.table(
        &[
            "workers",
            "system",
            "enqueue (tasks/s)",
            "enqueue ÷ fastest peer",
            "processing (tasks/s)",
            "processing ÷ fastest peer",
            "WAL bytes / task",
            "write transactions / task",
            "index entries / task",
            "dead tuples / task",
        ],
        rows,
    );

    let met = |ok: bool| if ok { "met" } else { "missed" };
    let mut targets = Vec::new();
    for &w in cfg.workers.iter().filter(|&&w| w >= 8) {
        let c = med(w, System::Consumer, proc_) / best(w, proc_);
        targets.push(vec![
            format!("consumer processing at {w} workers ≥ 1.5× the fastest peer"),
            format!("{c:.2}×"),
            met(c >= 1.5).to_owned(),
        ]);
    }
    for &w in &cfg.workers {
        let e = med(w, System::Consumer, enq) / best(w, enq);
        targets.push(vec![
            format!("enqueue without a handoff at {w} workers ≥ 1.5× the fastest peer"),
            format!("{e:.2}×"),
            met(e >= 1.5).to_owned(),
        ]);
    }
    for &w in &cfg.workers {
        let c = med(w, System::Consumer, proc_) / med(w, System::Ceiling, proc_);
        targets.push(vec![
            format!("consumer processing at {w} workers ≥ 0.8× the batched ceiling"),
            format!("{c:.2}×"),
            met(c >= 0.8).to_owned(),
        ]);
    }
    report.table(&["target", "measured", ""], targets);

    for system in System::ALL.into_iter().filter(|s| s.built()) {
        report.series(Series {
            name: system.name(),
            peer: system.is_peer(),
            points: cfg.workers.iter().map(|&w| (w, med(w, system, proc_))).collect(),
        });
    }
    Ok(())
}

/// Submit to start on an idle queue: a consumer waiting for work (its idle
/// wait at the default 1 s) and one task at a time submitted through its
/// queue's submitter, 20 ms apart; each sample is from the call to `submit`
/// to the work function's first line.
pub(crate) async fn wake_latency(cfg: &Config, main: &PgPool, report: &mut Report) -> Res<()> {
    use taskfence::runtime::{ConsumerConfig, StoreQueue};

    let samples_wanted = if cfg.mode == crate::Mode::Quick { 20 } else { 300 };
    let schema = BenchSchema::create(cfg, main).await?;
    let pool = own_pool(cfg, 4).await?;
    let store: Arc<dyn TaskStore> = Arc::new(PgStore::builder(pool.clone()).schema(schema.name()).build()?);
    let queue = StoreQueue::new(store);
    let submit = queue.submitter();
    let consumer = queue.consumer(ConsumerConfig::new("bench", LEASE))?;
    let stop = consumer.stop().clone();
    let (started, mut starts) = mpsc::unbounded_channel::<Instant>();
    let running = tokio::spawn(consumer.run(move |_ctx| {
        let _ = started.send(Instant::now());
        async { Ok(Response::new(RESPONSE.to_vec())) }
    }));
    let mut samples = crate::stats::Samples::default();
    for _ in 0..samples_wanted {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let asked = Instant::now();
        submit
            .submit(new_task(&fresh_key("wake")).without_handoff())
            .await?;
        let began = tokio::time::timeout(Duration::from_secs(10), starts.recv())
            .await
            .map_err(|_| "a submitted task did not start within 10 s")?
            .ok_or("the consumer stopped")?;
        samples.push(began.saturating_duration_since(asked));
    }
    stop.request();
    running.await??;
    pool.close().await;
    drop(schema);

    report.section(
        "Submit to start on an idle queue",
        &format!(
            "A `Consumer` on a `StoreQueue`, idle (its wait between empty fetches at the default \
             1 s), and {samples_wanted} tasks submitted one at a time through the queue's \
             `submitter()`, 20 ms apart: from the `submit` call to the work function starting \
             (the submit's own commit included). The submitter wakes the consumer in the same \
             process; other processes' submissions are found by polling."
        ),
    );
    let (p50, p99) = (samples.p50(), samples.p99());
    report.table(
        &["samples", "p50", "p99", "max"],
        vec![vec![
            samples.len().to_string(),
            crate::stats::ms(p50),
            crate::stats::ms(p99),
            crate::stats::ms(samples.max()),
        ]],
    );
    let met = |ok: bool| if ok { "met" } else { "missed" };
    report.table(
        &["target", "measured", ""],
        vec![
            vec![
                "submit to start p50 ≤ 5 ms".to_owned(),
                crate::stats::ms(p50),
                met(p50 <= Duration::from_millis(5)).to_owned(),
            ],
            vec![
                "submit to start p99 ≤ 50 ms".to_owned(),
                crate::stats::ms(p99),
                met(p99 <= Duration::from_millis(50)).to_owned(),
            ],
        ],
    );
    Ok(())
}
