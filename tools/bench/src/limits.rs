//! What deciding limits costs (`--limits`): the consumer's processing rate
//! on each store with tasks that name no limit, one hot concurrency key,
//! many keys, or a rate bucket. None of the limits binds (the keys' limits
//! and the bucket's rate are far above what the workers reach), so what is
//! measured is the deciding, never the waiting; each rate is compared with
//! the same run's tasks that name no limit, on the same store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use taskfence::runtime::{ConsumerConfig, StoreQueue};

use sqlx::postgres::PgPool;
use taskfence::inspect::Inspect;
use taskfence::throttle::{ConcurrencyKey, RateBucket};
use taskfence::{MemoryStore, NewTask, PgStore, SqliteStore, TaskStore};

use crate::db::{BenchSchema, LEASE, RESPONSE};
use crate::lifecycle::{fresh_key, new_task};
use crate::peers::{Meter, limit, own_pool, produce, tasks, wait_for};
use crate::report::Report;
use crate::sqlite::{TempDir, consume};
use crate::stats::{median, ratio};
use crate::{Config, Res};

/// What the run's tasks name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Shape {
    Plain,
    HotKey,
    ManyKeys,
    Bucket,
}

impl Shape {
    const ALL: [Shape; 4] = [Shape::Plain, Shape::HotKey, Shape::ManyKeys, Shape::Bucket];

    fn name(self) -> &'static str {
        match self {
            Shape::Plain => "no limit",
            Shape::HotKey => "one hot key (every task, limit 10 000)",
            Shape::ManyKeys => "many keys (64, limit 64 each)",
            Shape::Bucket => "one rate bucket (10⁶/s, burst 10⁵)",
        }
    }

    /// The `i`-th task of a run.
    fn task(self, i: u64) -> NewTask {
        let new = new_task(&fresh_key("limits")).without_handoff();
        match self {
            Shape::Plain => new,
            Shape::HotKey => new.concurrency(ConcurrencyKey::new("hot", 10_000)),
            Shape::ManyKeys => new.concurrency(ConcurrencyKey::new(format!("key-{}", i % 64), 64)),
            Shape::Bucket => new.rate_bucket(BUCKET),
        }
    }
}

/// The bucket of [`Shape::Bucket`].
const BUCKET: &str = "bench";

/// The stores, in the report's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Store {
    Postgres,
    Sqlite,
    Memory,
}

impl Store {
    const ALL: [Store; 3] = [Store::Postgres, Store::Sqlite, Store::Memory];

    fn name(self) -> &'static str {
        match self {
            Store::Postgres => "PgStore",
            Store::Sqlite => "SqliteStore",
            Store::Memory => "MemoryStore",
        }
    }
}

/// One measurement: enqueue and processing rates, and (PostgreSQL) the
/// write transactions per task.
#[derive(Debug, Clone, Copy)]
struct Rates {
    enqueue: f64,
    process: f64,
    writes: Option<f64>,
}

/// `n` tasks of `shape` submitted by `workers` producers, then processed by
/// the consumer at `concurrency = workers` on `store`.
async fn on<S>(store: S, shape: Shape, workers: usize, n: u64) -> Res<(f64, f64)>
where
    S: TaskStore + Inspect + Clone + 'static,
{
    store
        .define_bucket(RateBucket::per_second(BUCKET, 1_000_000).burst(100_000))
        .await?;
    let submitter = store.clone();
    let enqueue = produce(workers, n, move |i| {
        let store = submitter.clone();
        async move {
            if !store.submit(shape.task(i)).await?.is_created() {
                return Err("submit of a fresh key found an existing task".into());
            }
            Ok(())
        }
    })
    .await?;
    let counter = store.clone();
    let completed = move || completed(counter.clone());
    let process = consume(Arc::new(store), workers, n, completed).await?;
    Ok((enqueue, process))
}

/// The store's completed tasks.
async fn completed<S: Inspect>(store: S) -> Res<i64> {
    Ok(i64::try_from(store.counts(None).await?.completed)?)
}

async fn measure(
    cfg: &Config,
    main: &PgPool,
    dir: &TempDir,
    store: Store,
    shape: Shape,
    workers: usize,
    n: u64,
) -> Res<Rates> {
    match store {
        Store::Memory => {
            let (enqueue, process) = on(MemoryStore::new(), shape, workers, n).await?;
            Ok(Rates {
                enqueue,
                process,
                writes: None,
            })
        }
        Store::Sqlite => {
            let sqlite = SqliteStore::open(dir.file("limits")).await?;
            sqlite.migrate().await?;
            let (enqueue, process) = on(sqlite, shape, workers, n).await?;
            Ok(Rates {
                enqueue,
                process,
                writes: None,
            })
        }
        Store::Postgres => {
            let schema = BenchSchema::create(cfg, main).await?;
            let pool = own_pool(cfg, workers).await?;
            let store = PgStore::builder(pool.clone()).schema(schema.name()).build()?;
            let meter = Meter::start(&pool).await?;
            let (enqueue, process) = on(store, shape, workers, n).await?;
            let writes = meter.per_task(&pool, n).await?.write_transactions;
            pool.close().await;
            drop(schema);
            Ok(Rates {
                enqueue,
                process,
                writes: Some(writes),
            })
        }
    }
}

/// The busy key's backlog in the fairness measurement.
const BACKLOG: u64 = 1_000;

/// Fairness: `BACKLOG` tasks of one key, then one task of another key, on
/// `store`; the consumer at `concurrency = workers` runs them all. Returns
/// how many tasks had started when the lone key's task started. `keyed`:
/// the tasks name their keys (otherwise none: plain oldest-due-first).
async fn lone_task_starts_after<S>(store: S, workers: usize, keyed: bool) -> Res<u64>
where
    S: TaskStore + Inspect + Clone + 'static,
{
    let task = |name: &str| {
        let new = new_task(&fresh_key("fair")).without_handoff();
        if keyed {
            new.concurrency(ConcurrencyKey::new(name, 10_000))
        } else {
            new
        }
    };
    for _ in 0..BACKLOG {
        store.submit(task("busy")).await?;
    }
    let lone = store.submit(task("lone")).await?.into_task().id;
    let started = Arc::new(AtomicU64::new(0));
    let before_lone = Arc::new(AtomicU64::new(u64::MAX));
    let consumer = StoreQueue::new(Arc::new(store.clone()))
        .consumer(ConsumerConfig::new("bench", LEASE).concurrency(workers))?;
    let stop = consumer.stop().clone();
    let (counting, seen) = (started.clone(), before_lone.clone());
    let running = tokio::spawn(consumer.run(move |ctx| {
        let before = counting.fetch_add(1, Ordering::SeqCst);
        if ctx.task().id == lone {
            seen.store(before, Ordering::SeqCst);
        }
        async { Ok(taskfence::Response::new(RESPONSE.to_vec())) }
    }));
    wait_for(BACKLOG + 1, limit(BACKLOG + 1), || completed(store.clone())).await?;
    stop.request();
    running.await??;
    Ok(before_lone.load(Ordering::SeqCst))
}

/// [`lone_task_starts_after`] on each store, with and without keys.
async fn fairness(cfg: &Config, main: &PgPool, dir: &TempDir, workers: usize) -> Res<Vec<Vec<String>>> {
    let mut rows = Vec::new();
    for store in Store::ALL {
        let mut cells = vec![store.name().to_owned()];
        for keyed in [true, false] {
            let after = match store {
                Store::Memory => lone_task_starts_after(MemoryStore::new(), workers, keyed).await?,
                Store::Sqlite => {
                    let sqlite = SqliteStore::open(dir.file("fair")).await?;
                    sqlite.migrate().await?;
                    lone_task_starts_after(sqlite, workers, keyed).await?
                }
                Store::Postgres => {
                    let schema = BenchSchema::create(cfg, main).await?;
                    let pool = own_pool(cfg, workers).await?;
                    let pg = PgStore::builder(pool.clone()).schema(schema.name()).build()?;
                    let after = lone_task_starts_after(pg, workers, keyed).await?;
                    pool.close().await;
                    drop(schema);
                    after
                }
            };
            cells.push(after.to_string());
        }
        rows.push(cells);
    }
    Ok(rows)
}

pub(crate) async fn run(cfg: &Config, pool: &PgPool, report: &mut Report) -> Res<()> {
    let dir = TempDir::new()?;
    let mut rates: BTreeMap<(Store, usize, Shape), Vec<Rates>> = BTreeMap::new();
    for round in 0..cfg.peer_rounds {
        for &workers in &cfg.workers {
            let n = tasks(cfg, workers);
            for store in Store::ALL {
                let mut order = Shape::ALL;
                order.rotate_left(round % Shape::ALL.len());
                for shape in order {
                    eprintln!(
                        "[bench] limits: round {round}, {workers} workers, {n} tasks, {}, {}",
                        store.name(),
                        shape.name()
                    );
                    let r = measure(cfg, pool, &dir, store, shape, workers, n).await?;
                    eprintln!(
                        "[bench]   enqueue {:.0}/s, processing {:.0}/s",
                        r.enqueue, r.process
                    );
                    rates.entry((store, workers, shape)).or_default().push(r);
                }
            }
        }
    }
    let fair_workers = 8;
    eprintln!("[bench] limits: fairness, {fair_workers} workers, a backlog of {BACKLOG} on one key");
    let fair = fairness(cfg, pool, &dir, fair_workers).await?;
    drop(dir);

    let med = |key: (Store, usize, Shape), f: fn(&Rates) -> f64| -> f64 {
        rates
            .get(&key)
            .map_or(f64::NAN, |r| median(&r.iter().map(f).collect::<Vec<_>>()))
    };
    report.section(
        "What deciding limits costs",
        &format!(
            "The consumer (`runtime::Consumer` on a `StoreQueue`, `concurrency = W`, the defaults \
             otherwise) on each store, N tasks submitted by W producers then processed (a no-op), \
             the tasks naming no limit, one concurrency key (every task), 64 keys (round-robin), or \
             one rate bucket. No limit binds: what is measured is the deciding. PgStore in a fresh \
             schema (a pool of W + 4; write transactions are the transaction ids assigned \
             cluster-wide, per task), SqliteStore on a fresh file (`SqliteStore::open`), \
             MemoryStore in process. N = {} / {} / {} at 1 / 8 / 32 workers; {} round(s), the \
             order of shapes rotated per round; medians, and ratios to the same store's tasks \
             naming no limit.",
            tasks(cfg, 1),
            tasks(cfg, 8),
            tasks(cfg, 32),
            cfg.peer_rounds
        ),
    );
    let mut rows = Vec::new();
    for store in Store::ALL {
        for &workers in &cfg.workers {
            let plain = med((store, workers, Shape::Plain), |r| r.process);
            let plain_enqueue = med((store, workers, Shape::Plain), |r| r.enqueue);
            for shape in Shape::ALL {
                let key = (store, workers, shape);
                let process = med(key, |r| r.process);
                let enqueue = med(key, |r| r.enqueue);
                let writes = med(key, |r| r.writes.unwrap_or(f64::NAN));
                rows.push(vec![
                    store.name().to_owned(),
                    workers.to_string(),
                    shape.name().to_owned(),
                    format!("{enqueue:.0}"),
                    ratio(enqueue, plain_enqueue),
                    format!("{process:.0}"),
                    ratio(process, plain),
                    if writes.is_nan() {
                        "–".to_owned()
                    } else {
                        format!("{writes:.2}")
                    },
                ]);
            }
        }
    }
    report.table(
        &[
            "store",
            "workers",
            "tasks name",
            "enqueue (tasks/s)",
            "÷ no limit",
            "processing (tasks/s)",
            "÷ no limit",
            "write transactions / task",
        ],
        rows,
    );
    report.note(&format!(
        "Fairness (`claim_next` offers round-robin by key): {BACKLOG} tasks of one key, then one \
         task of another, processed by the consumer at {fair_workers} workers; how many tasks \
         had started when the lone key's task started, with the keys named, and without (the \
         plain oldest-due-first order, for comparison)."
    ));
    report.table(
        &[
            "store",
            "started before the lone key's task, keyed",
            "the same, without keys",
        ],
        fair,
    );
    Ok(())
}
