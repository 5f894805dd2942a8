//! Peers: the same queue workload on taskfence (one task at a time, and in
//! batches), the raw-SQL ceiling, apalis (`apalis-postgres`) and River
//! (`riverqueue`), side by side in one run.
//!
//! Per system and worker count `W`: a fresh schema (apalis: a fresh temporary
//! database, its migrations create the fixed schema `apalis`), set up with the
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
use taskfence_test_support::TempSchema;
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
    Ours,
    Batched,
    Ceiling,
    Apalis,
    River,
}

impl System {
    pub(crate) const ALL: [System; 5] = [
        System::Ours,
        System::Batched,
        System::Ceiling,
        System::Apalis,
        System::River,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            System::Ours => "taskfence",
            System::Batched => "taskfence batched",
            System::Ceiling => "raw-SQL ceiling",
            System::Apalis => "apalis-postgres",
            System::River => "River (riverqueue)",
        }
    }

    fn is_peer(self) -> bool {
        matches!(self, System::Apalis | System::River)
    }

    /// Whether this build measures it (apalis needs the `apalis` feature).
    fn built(self) -> bool {
        self != System::Apalis || cfg!(feature = "apalis")
    }
}

/// One measurement: tasks per second.
#[derive(Debug, Clone, Copy)]
struct Rates {
    enqueue: f64,
    process: f64,
}

/// Runs `n` calls of `step(i)`, `i` in `0..n`, on `workers` concurrent
/// producers, each one call at a time; returns calls per second.
async fn produce<F, Fut>(workers: usize, n: u64, step: F) -> Res<f64>
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
async fn wait_for<F, Fut>(n: u64, limit: Duration, mut count: F) -> Res<()>
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
fn limit(n: u64) -> Duration {
    Duration::from_secs(60 + n / 5)
}

async fn measure(cfg: &Config, pool: &PgPool, system: System, workers: usize, n: u64) -> Res<Rates> {
    match system {
        System::Ours => taskfence(cfg, pool, workers, n, 1).await,
        System::Batched => taskfence(cfg, pool, workers, n, BATCH).await,
        System::Ceiling => ceiling(cfg, pool, workers, n).await,
        #[cfg(feature = "apalis")]
        System::Apalis => apalis(cfg, workers, n).await,
        #[cfg(not(feature = "apalis"))]
        System::Apalis => Err("apalis-postgres is not built (feature `apalis`)".into()),
        System::River => river(cfg, workers, n).await,
    }
}

/// A pool of `W + 4` connections, like the rest of the harness's.
async fn own_pool(cfg: &Config, workers: usize) -> Res<PgPool> {
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
                    .dispatch_batches(100, batch, |ids| {
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
    let count = format!(
        "SELECT count(*) FROM {}.tasks WHERE status = 'completed'",
        schema.q()
    );
    wait_for(n, limit(n), || async {
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(count.as_str()))
            .fetch_one(&pool)
            .await?)
    })
    .await?;
    let process = n as f64 / start.elapsed().as_secs_f64();
    dispatcher.await??;
    for h in handles {
        h.await??;
    }
    pool.close().await;
    drop(schema);
    Ok(Rates { enqueue, process })
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

/// The ceiling: the raw `INSERT` one by one; then `W` workers each looping
/// a `FOR UPDATE SKIP LOCKED` claim of the oldest pending row (on a partial
/// index of pending ids) and the guarded completing `UPDATE`.
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
    let enqueue = {
        let (raw, pool) = (raw.clone(), pool.clone());
        produce(workers, n, move |_| {
            let (raw, pool) = (raw.clone(), pool.clone());
            async move { raw.submit(&pool, &fresh_key("peer")).await.map(drop) }
        })
        .await?
    };
    let start = Instant::now();
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (raw, pool) = (raw.clone(), pool.clone());
            tokio::spawn(async move {
                while let Some((id, version)) = raw.claim_next(&pool).await? {
                    raw.complete(&pool, id, version).await?;
                }
                Res::Ok(())
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
    for h in handles {
        h.await??;
    }
    pool.close().await;
    drop(schema);
    Ok(Rates { enqueue, process })
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

#[cfg(feature = "apalis")]
/// A temporary database (apalis's migrations create the fixed schema
/// `apalis`, so each measurement gets a database of its own), dropped by
/// [`TempDatabase::drop_now`]. Names carry their creation time: ones over an
/// hour old, left by a killed run, are dropped when the next one is made.
struct TempDatabase {
    name: String,
    admin: sqlx::PgPool,
}

#[cfg(feature = "apalis")]
const DB_PREFIX: &str = "taskfence_bench_apalis_";

#[cfg(feature = "apalis")]
impl TempDatabase {
    async fn create(cfg: &Config) -> Res<Self> {
        let admin = pool09(cfg, 0, None).await?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs();
        let stale: Vec<String> =
            sqlx::query_scalar("SELECT datname FROM pg_database WHERE starts_with(datname, $1)")
                .bind(DB_PREFIX)
                .fetch_all(&admin)
                .await?;
        for name in stale {
            let born = name[DB_PREFIX.len()..]
                .split('_')
                .next()
                .and_then(|s| s.parse::<u64>().ok());
            if born.is_some_and(|b| b + 3600 < now) {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                )))
                .execute(&admin)
                .await?;
            }
        }
        let name = format!("{DB_PREFIX}{now}_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&admin)
            .await?;
        eprintln!("[bench] created database {name}");
        Ok(Self { name, admin })
    }

    async fn drop_now(self) -> Res<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        )))
        .execute(&self.admin)
        .await?;
        self.admin.close().await;
        Ok(())
    }
}

#[cfg(feature = "apalis")]
async fn apalis_noop(_task: u64) -> Result<(), apalis::prelude::BoxDynError> {
    Ok(())
}

#[cfg(feature = "apalis")]
/// apalis 1.x on PostgreSQL: `PostgresStorage::setup` (its migrations) in a
/// fresh database; `push` one by one; `W` apalis workers on the storage
/// (default `Config`: fetches of 10, results acknowledged in batches).
async fn apalis(cfg: &Config, workers: usize, n: u64) -> Res<Rates> {
    use apalis::prelude::*;
    use apalis_postgres::PostgresStorage;

    let db = TempDatabase::create(cfg).await?;
    let result = async {
        let pool = pool09(cfg, workers, Some(&db.name)).await?;
        PostgresStorage::setup(&pool).await?;
        let storage = PostgresStorage::<u64>::new(&pool);
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
        Res::Ok(Rates { enqueue, process })
    }
    .await;
    db.drop_now().await?;
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
/// otherwise except the fetch cooldown at its minimum (its 100 ms default
/// caps a queue at one fetch per 100 ms).
async fn river(cfg: &Config, workers: usize, n: u64) -> Res<Rates> {
    use riverqueue::database::{PostgresDatabase, SchemaName};
    use riverqueue::{Client, FETCH_COOLDOWN_MIN, QueueConfig, Workers};

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
    let client = Client::builder(PostgresDatabase::new(pool.clone()).with_schema(schema_name))
        .workers(registry)
        .queue("default", QueueConfig::new(workers))
        .fetch_cooldown(FETCH_COOLDOWN_MIN)
        .build()?;
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
    run.stop().await?;
    drop(client);
    pool.close().await;
    counted?;
    drop(schema);
    Ok(Rates { enqueue, process })
}

/// Tasks per measurement at `workers`.
fn tasks(cfg: &Config, workers: usize) -> u64 {
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

    report.section(
        "Peers: enqueue and processing throughput",
        &format!(
            "The same workload on every system, each in a fresh schema set up by its own migrations \
             (apalis: a fresh temporary database, its schema is fixed): N tasks enqueued one by one \
             by W producers (enqueue), then W workers run a no-op on each (processing), the clock \
             stopping when a count in the database reaches N completions (polled every 5 ms). \
             **taskfence**: `submit`; a dispatcher (`dispatch_batches(100, 1)` into an in-process \
             channel standing for the broker, included in the processing time) and per message \
             `claim` + `complete`. **taskfence batched**: the same with `dispatch_batches(100, {BATCH})` \
             and per message of {BATCH} tasks `claim_many` + `complete_many`. **raw-SQL ceiling**: \
             the hand-written `INSERT`, then per task a `FOR UPDATE SKIP LOCKED` claim and the \
             guarded completing `UPDATE`. **apalis-postgres** 1.0: `push`, W apalis workers with \
             the default `Config` (fetches of 10, acknowledgements in batches). **River** \
             (riverqueue 0.5): `Client::insert`, one client with `max_workers = W`, fetch cooldown \
             at its 1 ms minimum. Every system gets its own pool of W + 4 connections. N = {} / \
             {} / {} at 1 / 8 / 32 workers; {} round(s), the order of systems rotated per round; \
             medians. Ratios are to the faster of apalis and River at that worker count \
             (River alone when apalis is not built).",
            tasks(cfg, 1),
            tasks(cfg, 8),
            tasks(cfg, 32),
            cfg.peer_rounds
        ),
    );
    let mut rows = Vec::new();
    for &workers in &cfg.workers {
        let best_enq = med(workers, System::Apalis, enq).max(med(workers, System::River, enq));
        let best_proc = med(workers, System::Apalis, proc_).max(med(workers, System::River, proc_));
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
            ]);
        }
    }
    report.table(
        &[
            "workers",
            "system",
            "enqueue (tasks/s)",
            "enqueue ÷ faster peer",
            "processing (tasks/s)",
            "processing ÷ faster peer",
        ],
        rows,
    );

    let ratio_at = |w: usize, s: System, f: fn(&Rates) -> f64| {
        let best = med(w, System::Apalis, f).max(med(w, System::River, f));
        med(w, s, f) / best
    };
    let met = |ok: bool| if ok { "met" } else { "missed" };
    let mut targets = Vec::new();
    if cfg.workers.contains(&8) {
        let b = ratio_at(8, System::Batched, proc_);
        targets.push(vec![
            "batched processing at 8 workers ≥ 2× the faster peer".to_owned(),
            format!("{b:.2}×"),
            met(b >= 2.0).to_owned(),
        ]);
    }
    for &w in &cfg.workers {
        let o = ratio_at(w, System::Ours, proc_);
        targets.push(vec![
            format!("single-task processing at {w} workers ≥ the faster peer"),
            format!("{o:.2}×"),
            met(o >= 1.0).to_owned(),
        ]);
    }
    for &w in &cfg.workers {
        let o = ratio_at(w, System::Ours, enq);
        targets.push(vec![
            format!("enqueue at {w} workers ≥ 1.5× the faster peer"),
            format!("{o:.2}×"),
            met(o >= 1.5).to_owned(),
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
