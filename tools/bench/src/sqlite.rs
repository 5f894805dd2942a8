//! SQLite: taskfence's `SqliteStore` beside `apalis-sqlite` on one workload,
//! with `MemoryStore` and `PgStore` on the same machine for scale, in one
//! run (`--sqlite`).
//!
//! Per system and worker count `W`: a fresh database file in a temporary
//! directory (PostgreSQL: a fresh schema), set up by the system's own
//! migrations with its documented defaults; `N` tasks enqueued one by one by
//! `W` producers (enqueue throughput); then `W` workers run a no-op on every
//! task, the clock stopping when a count of completions reaches `N`
//! (processing throughput). Systems take turns in an order rotated per
//! round; each round's ratios are printed beside the medians, as the machine
//! is shared and noisy. On SQLite, every write transaction is counted by a
//! commit hook on each connection of the system's pool.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use sqlx::postgres::PgPool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use taskfence::runtime::{ConsumerConfig, StoreQueue};
use taskfence::{MemoryStore, PgStore, Response, SqliteStore, TaskStore};

use crate::db::{BenchSchema, LEASE, RESPONSE};
use crate::lifecycle::{fresh_key, new_task};
use crate::peers::{Meter, limit, own_pool, produce, tasks, wait_for};
use crate::report::Report;
use crate::stats::{median, ratio};
use crate::{Config, Res};

/// The systems, in the report's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum System {
    Sqlite,
    Apalis,
    Memory,
    Postgres,
}

impl System {
    const ALL: [System; 4] = [System::Sqlite, System::Apalis, System::Memory, System::Postgres];

    pub(crate) fn name(self) -> &'static str {
        match self {
            System::Sqlite => "taskfence consumer, SqliteStore",
            System::Apalis => "apalis-sqlite",
            System::Memory => "taskfence consumer, MemoryStore",
            System::Postgres => "taskfence consumer, PgStore",
        }
    }

    /// Whether this build measures it (apalis-sqlite needs the `apalis` feature).
    fn built(self) -> bool {
        self != System::Apalis || cfg!(feature = "apalis")
    }
}

/// One measurement: tasks per second, and the write transactions per task
/// (none for `MemoryStore`).
#[derive(Debug, Clone, Copy)]
struct Rates {
    enqueue: f64,
    process: f64,
    writes: Option<f64>,
}

/// Counts the write transactions committed on a pool's connections: a
/// commit hook on each (SQLite calls it for every transaction that wrote,
/// and for no read).
#[derive(Debug, Clone, Default)]
struct Commits(Arc<AtomicU64>);

impl Commits {
    /// `pool` with the hook installed on each connection it opens.
    async fn pool(&self, pool: SqlitePoolOptions, options: SqliteConnectOptions) -> Res<SqlitePool> {
        let counter = self.0.clone();
        Ok(pool
            .after_connect(move |conn, _meta| {
                let counter = counter.clone();
                Box::pin(async move {
                    conn.lock_handle().await?.set_commit_hook(move || {
                        counter.fetch_add(1, Ordering::Relaxed);
                        true
                    });
                    Ok(())
                })
            })
            .connect_with(options)
            .await?)
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A temporary directory for the run's database files, removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new() -> Res<Self> {
        let dir = std::env::temp_dir().join(format!(
            "taskfence-bench-sqlite-{}-{}",
            std::process::id(),
            uuid::Uuid::now_v7().simple()
        ));
        std::fs::create_dir_all(&dir)?;
        eprintln!("[bench] created directory {}", dir.display());
        Ok(Self(dir))
    }

    /// A fresh file name in it.
    pub(crate) fn file(&self, system: &str) -> PathBuf {
        self.0
            .join(format!("{system}-{}.db", uuid::Uuid::now_v7().simple()))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The consumer as the docs show it, on `store`: `concurrency = W` and the
/// defaults otherwise. Returns the processing rate once `completed` counts
/// `n`, and checks the consumer completed them all.
pub(crate) async fn consume<F, Fut>(
    store: Arc<dyn TaskStore>,
    workers: usize,
    n: u64,
    completed: F,
) -> Res<f64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Res<i64>>,
{
    let start = Instant::now();
    let consumer =
        StoreQueue::new(store).consumer(ConsumerConfig::new("bench", LEASE).concurrency(workers))?;
    let stop = consumer.stop().clone();
    let running = tokio::spawn(consumer.run(|_ctx| async { Ok(Response::new(RESPONSE.to_vec())) }));
    wait_for(n, limit(n), completed).await?;
    let process = n as f64 / start.elapsed().as_secs_f64();
    stop.request();
    let stopped = running.await??;
    if stopped.completed != n {
        return Err(format!("the consumer completed {} of {n}", stopped.completed).into());
    }
    Ok(process)
}

/// `submit` of fresh tasks without a handoff (the consumer takes them with
/// `claim_next`), one by one by `W` producers; returns tasks per second.
async fn submit_all(store: &Arc<dyn TaskStore>, workers: usize, n: u64) -> Res<f64> {
    let store = store.clone();
    produce(workers, n, move |_| {
        let store = store.clone();
        async move {
            let submitted = store
                .submit(new_task(&fresh_key("sqlite")).without_handoff())
                .await?;
            if !submitted.is_created() {
                return Err("submit of a fresh key found an existing task".into());
            }
            Ok(())
        }
    })
    .await
}

/// `SqliteStore` as its docs show it: `connect_options(path)` (WAL,
/// `synchronous = FULL`, a 1 s `busy_timeout`), a pool of 8 as
/// `SqliteStore::open` makes it (here through `SqliteStore::new`, to
/// install the commit counter), `migrate`, then the consumer.
async fn sqlite(dir: &TempDir, workers: usize, n: u64) -> Res<Rates> {
    let commits = Commits::default();
    let pool = commits
        .pool(
            SqlitePoolOptions::new()
                .max_connections(8)
                .test_before_acquire(false),
            SqliteStore::connect_options(dir.file("taskfence")),
        )
        .await?;
    let sqlite = SqliteStore::new(pool.clone());
    sqlite.migrate().await?;
    let store: Arc<dyn TaskStore> = Arc::new(sqlite);
    let before = commits.get();
    let enqueue = submit_all(&store, workers, n).await?;
    let process = consume(store, workers, n, || async {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'completed'")
                .fetch_one(&pool)
                .await?,
        )
    })
    .await?;
    let writes = (commits.get() - before) as f64 / n as f64;
    pool.close().await;
    Ok(Rates {
        enqueue,
        process,
        writes: Some(writes),
    })
}

/// `MemoryStore`: the same consumer in process, no I/O.
async fn memory(workers: usize, n: u64) -> Res<Rates> {
    use taskfence::inspect::Inspect;

    let memory = MemoryStore::new();
    let store: Arc<dyn TaskStore> = Arc::new(memory.clone());
    let enqueue = submit_all(&store, workers, n).await?;
    let process = consume(store, workers, n, || async {
        Ok(i64::try_from(memory.counts(None).await?.completed)?)
    })
    .await?;
    Ok(Rates {
        enqueue,
        process,
        writes: None,
    })
}

/// `PgStore` in a fresh schema, a pool of W + 4: the same consumer. Write
/// transactions are the cluster's transaction ids assigned meanwhile.
async fn postgres(cfg: &Config, main: &PgPool, workers: usize, n: u64) -> Res<Rates> {
    let schema = BenchSchema::create(cfg, main).await?;
    let pool = own_pool(cfg, workers).await?;
    let store: Arc<dyn TaskStore> = Arc::new(PgStore::builder(pool.clone()).schema(schema.name()).build()?);
    let meter = Meter::start(&pool).await?;
    let enqueue = submit_all(&store, workers, n).await?;
    let count = format!(
        "SELECT count(*) FROM {}.tasks WHERE status = 'completed'",
        schema.q()
    );
    let process = consume(store, workers, n, || async {
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(count.as_str()))
            .fetch_one(&pool)
            .await?)
    })
    .await?;
    let writes = meter.per_task(&pool, n).await?.write_transactions;
    pool.close().await;
    drop(schema);
    Ok(Rates {
        enqueue,
        process,
        writes: Some(writes),
    })
}

/// apalis-sqlite 1.0 as its README shows it: a pool on the file (sqlx's
/// defaults), `SqliteStorage::setup` (WAL, its pragmas, its migrations),
/// `push` one by one; `W` apalis workers on the storage with the default
/// `Config` (fetches of 10, acknowledgements in batches).
#[cfg(feature = "apalis")]
async fn apalis(dir: &TempDir, workers: usize, n: u64) -> Res<Rates> {
    use apalis::prelude::*;
    use apalis_sqlite::SqliteStorage;

    let commits = Commits::default();
    let options = SqliteConnectOptions::new()
        .filename(dir.file("apalis"))
        .create_if_missing(true);
    let pool = commits.pool(SqlitePoolOptions::new(), options).await?;
    SqliteStorage::setup(&pool).await?;
    let storage = SqliteStorage::<u64>::new(&pool);
    let before = commits.get();
    let enqueue = {
        let storage = storage.clone();
        produce(workers, n, move |i| {
            let mut storage = storage.clone();
            async move {
                storage
                    .push(i)
                    .await
                    .map_err(|e| format!("apalis-sqlite push: {e}"))?;
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
                .build(crate::peers::apalis_noop);
            tokio::spawn(async move { worker.run().await })
        })
        .collect();
    let counted = wait_for(n, limit(n), || async {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM Jobs WHERE status = 'Done'")
                .fetch_one(&pool)
                .await?,
        )
    })
    .await;
    let process = n as f64 / start.elapsed().as_secs_f64();
    let writes = (commits.get() - before) as f64 / n as f64;
    for h in &handles {
        h.abort();
    }
    for h in handles {
        if let Ok(Err(e)) = h.await {
            return Err(format!("an apalis-sqlite worker stopped: {e}").into());
        }
    }
    pool.close().await;
    counted?;
    Ok(Rates {
        enqueue,
        process,
        writes: Some(writes),
    })
}

async fn measure(
    cfg: &Config,
    pool: &PgPool,
    dir: &TempDir,
    system: System,
    workers: usize,
    n: u64,
) -> Res<Rates> {
    match system {
        System::Sqlite => sqlite(dir, workers, n).await,
        #[cfg(feature = "apalis")]
        System::Apalis => apalis(dir, workers, n).await,
        #[cfg(not(feature = "apalis"))]
        System::Apalis => {
            let _ = dir;
            Err("apalis-sqlite is not built (feature `apalis`)".into())
        }
        System::Memory => memory(workers, n).await,
        System::Postgres => postgres(cfg, pool, workers, n).await,
    }
}

/// The SQLite library the store runs on.
async fn sqlite_version(dir: &Path) -> Res<String> {
    let pool = SqlitePool::connect_with(
        SqliteConnectOptions::new()
            .filename(dir.join("version.db"))
            .create_if_missing(true),
    )
    .await?;
    let version: String = sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    Ok(version)
}

pub(crate) async fn run(cfg: &Config, pool: &PgPool, report: &mut Report) -> Res<()> {
    let dir = TempDir::new()?;
    let version = sqlite_version(&dir.0).await?;
    let mut rates: BTreeMap<(usize, System), Vec<Rates>> = BTreeMap::new();
    for round in 0..cfg.peer_rounds {
        for (i, &workers) in cfg.workers.iter().enumerate() {
            let n = tasks(cfg, workers);
            let mut order = System::ALL;
            order.rotate_left((round + i) % System::ALL.len());
            for system in order.into_iter().filter(|s| s.built()) {
                eprintln!(
                    "[bench] sqlite: round {round}, {workers} workers, {n} tasks, {}",
                    system.name()
                );
                let r = measure(cfg, pool, &dir, system, workers, n).await?;
                eprintln!(
                    "[bench]   enqueue {:.0}/s, processing {:.0}/s",
                    r.enqueue, r.process
                );
                rates.entry((workers, system)).or_default().push(r);
            }
        }
    }
    drop(dir);

    let med = |w: usize, s: System, f: fn(&Rates) -> f64| -> f64 {
        rates
            .get(&(w, s))
            .map_or(f64::NAN, |r| median(&r.iter().map(f).collect::<Vec<_>>()))
    };
    let enq: fn(&Rates) -> f64 = |r| r.enqueue;
    let proc_: fn(&Rates) -> f64 = |r| r.process;
    let writes: fn(&Rates) -> f64 = |r| r.writes.unwrap_or(f64::NAN);

    report.section(
        "SQLite: taskfence beside apalis-sqlite",
        &format!(
            "SQLite {version}, every file in a fresh temporary directory on the machine's disk. \
             N tasks enqueued one by one by W producers (enqueue), then W workers run a no-op on \
             each (processing), the clock stopping when a count of completions reaches N (polled \
             every 5 ms). **taskfence consumer**: `submit` of tasks without a handoff, then \
             `runtime::Consumer` on a `StoreQueue` with `concurrency = W` and the defaults \
             otherwise; on `SqliteStore` as its docs set it up (`connect_options`: WAL, \
             `synchronous = FULL`, `busy_timeout` 1 s; a pool of 8; `migrate`), on `MemoryStore` \
             (in process), and on `PgStore` in a fresh schema (a pool of W + 4) for scale. \
             **apalis-sqlite** 1.0 as its README sets it up: a sqlx pool on the file with sqlx's \
             defaults, `SqliteStorage::setup` (WAL, `synchronous = OFF` on the one connection it \
             runs on, its migrations), `push` one by one, W apalis workers with the default \
             `Config` (fetches of 10, acknowledgements in batches). Write transactions per task, \
             from the first enqueue to the last completion: on SQLite the commits a commit hook \
             counted on every connection of the system's pool, on PostgreSQL the transaction ids \
             assigned cluster-wide. N = {} / {} / {} at 1 / 8 / 32 workers; {} round(s), the \
             order of systems rotated per round; medians, and each round's ratio of \
             `SqliteStore` to apalis-sqlite.",
            tasks(cfg, 1),
            tasks(cfg, 8),
            tasks(cfg, 32),
            cfg.peer_rounds
        ),
    );
    let per_round = |w: usize, f: fn(&Rates) -> f64| -> String {
        match (rates.get(&(w, System::Sqlite)), rates.get(&(w, System::Apalis))) {
            (Some(ours), Some(theirs)) => ours
                .iter()
                .zip(theirs)
                .map(|(a, b)| ratio(f(a), f(b)))
                .collect::<Vec<_>>()
                .join(" "),
            _ => "–".into(),
        }
    };
    let mut rows = Vec::new();
    for &workers in &cfg.workers {
        let (apalis_enq, apalis_proc) = (
            med(workers, System::Apalis, enq),
            med(workers, System::Apalis, proc_),
        );
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
                ]);
                continue;
            }
            let (e, p) = (med(workers, system, enq), med(workers, system, proc_));
            let w = med(workers, system, writes);
            rows.push(vec![
                workers.to_string(),
                system.name().to_owned(),
                format!("{e:.0}"),
                ratio(e, apalis_enq),
                format!("{p:.0}"),
                ratio(p, apalis_proc),
                if w.is_nan() {
                    "–".into()
                } else {
                    format!("{w:.2}")
                },
            ]);
        }
    }
    report.table(
        &[
            "workers",
            "system",
            "enqueue (tasks/s)",
            "enqueue ÷ apalis-sqlite",
            "processing (tasks/s)",
            "processing ÷ apalis-sqlite",
            "write transactions / task",
        ],
        rows,
    );
    report.table(
        &[
            "workers",
            "enqueue ÷ apalis-sqlite, each round",
            "processing ÷ apalis-sqlite, each round",
        ],
        cfg.workers
            .iter()
            .map(|&w| vec![w.to_string(), per_round(w, enq), per_round(w, proc_)])
            .collect(),
    );
    let met = |ok: bool| if ok { "met" } else { "missed" };
    let mut targets = Vec::new();
    for &w in cfg.workers.iter().filter(|&&w| w >= 8) {
        for (what, f) in [("processing", proc_), ("enqueue", enq)] {
            let r = med(w, System::Sqlite, f) / med(w, System::Apalis, f);
            targets.push(vec![
                format!("SqliteStore {what} at {w} workers ≥ 1.5× apalis-sqlite"),
                format!("{r:.2}×"),
                if r.is_nan() {
                    "not measured".into()
                } else {
                    met(r >= 1.5).to_owned()
                },
            ]);
        }
    }
    report.table(&["target", "measured", ""], targets);
    Ok(())
}
