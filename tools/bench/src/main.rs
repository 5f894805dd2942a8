//! taskfence's benchmark harness: PgStore side by side with the hand-written
//! SQL it replaces and with two peers (apalis-postgres, River for Rust), on a
//! real PostgreSQL server, in one run.
//!
//! ```text
//! cargo run --release -p taskfence-bench -- [--quick | --long] [--lifecycle | --peers | --holding | --enqueue] [--rounds N] [--out DIR] [--database-url URL]
//! cargo run --release -p taskfence-bench -- --sustained [--quick] [--phase-secs S] [--rate R] [--out DIR]
//! cargo run --release -p taskfence-bench --features apalis -- --sqlite [--quick] [--rounds N]
//! cargo run --release -p taskfence-bench -- --limits [--quick] [--rounds N]
//! ```
//!
//! Prints a Markdown report and writes `DIR/bench-results.md` and
//! `DIR/throughput.svg` (default `DIR`: `target/bench`). The server is
//! `--database-url`, else `DATABASE_URL`, else
//! `postgres://postgres@127.0.0.1:5432/test`. Every section works in a fresh
//! schema of its own and drops it afterwards. See `docs/PERFORMANCE.md`.

use std::path::PathBuf;
use std::time::Instant;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

mod completion;
mod contention;
mod db;
mod enqueue;
mod holding;
mod lifecycle;
mod limits;
mod memory;
mod peers;
mod report;
mod scale;
mod sqlite;
mod stats;
mod sustained;
mod trips;

/// The harness's error type: any error, reported and the run stops.
pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// How big a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Tiny sizes, one round: CI runs it so the harness cannot rot.
    Quick,
    /// 10^4, 10^5 and 10^6 rows; several rounds (about 10 minutes here).
    Normal,
    /// Normal plus 10^7 rows (loading takes a long time).
    Long,
}

/// Sizes and repetitions of one run.
#[derive(Debug, Clone)]
pub struct Config {
    /// How much to run.
    pub mode: Mode,
    /// Where the report and the figure go.
    pub out: PathBuf,
    /// The PostgreSQL server.
    pub url: String,
    /// Only the lifecycle section (ours vs the ceiling), printed, nothing written.
    pub lifecycle_only: bool,
    /// Run only the peers and the idle-queue latency, and print them.
    pub peers_only: bool,
    /// Run only what a consumer holds (before/after), and print it.
    pub holding_only: bool,
    /// Run only the bulk enqueue (submit vs submit_many), and print it.
    pub enqueue_only: bool,
    /// Run only SQLite beside apalis-sqlite (and MemoryStore, PgStore), and print it.
    pub sqlite_only: bool,
    /// Run only what deciding limits costs, and print it.
    pub limits_only: bool,
    /// Concurrent workers of the lifecycle throughput section.
    pub workers: Vec<usize>,
    /// Rounds of each (workers, ours/ceiling) pair, alternating; medians are reported.
    pub lifecycle_rounds: usize,
    /// Seconds one round of one pair runs.
    pub lifecycle_secs: f64,
    /// Rounds, and completions of each kind per round, for textbook vs ours.
    pub completion_rounds: usize,
    /// Completions of each kind per round.
    pub completion_ops: usize,
    /// Existing rows of the scaling section.
    pub sizes: Vec<u64>,
    /// Rounds, and lifecycles per size per round, of the scaling section.
    pub scale_rounds: usize,
    /// Lifecycles per size per round.
    pub scale_ops: usize,
    /// `purge_expired(100)` calls per size.
    pub purge_calls: usize,
    /// Rounds of 32 workers racing for one task.
    pub contention_rounds: usize,
    /// Seconds per MemoryStore measurement.
    pub memory_secs: f64,
    /// Rounds of the peers section (every system at every worker count).
    pub peer_rounds: usize,
    /// Run only the sustained-load phases (on a private cluster) and write their report.
    pub sustained: bool,
    /// Seconds per sustained phase (default 300; 2 in quick mode).
    pub phase_secs: Option<f64>,
    /// The sustained run's offered rate (default: 70 % of the lowest measured peak).
    pub rate: Option<f64>,
    /// The sustained run's systems, by name (`taskfence`, `awa`, `apalis`; default: every one).
    pub systems: Vec<String>,
    /// How many of the sustained phases to run, from the first (default: all nine).
    pub phases: Option<usize>,
}

impl Config {
    fn new(mode: Mode, out: PathBuf, url: String) -> Self {
        let quick = mode == Mode::Quick;
        let mut sizes = if quick {
            vec![100, 1_000]
        } else {
            vec![10_000, 100_000, 1_000_000]
        };
        if mode == Mode::Long {
            sizes.push(10_000_000);
        }
        Self {
            mode,
            out,
            url,
            lifecycle_only: false,
            peers_only: false,
            holding_only: false,
            enqueue_only: false,
            sqlite_only: false,
            limits_only: false,
            workers: vec![1, 8, 32],
            lifecycle_rounds: if quick { 1 } else { 5 },
            lifecycle_secs: if quick { 0.3 } else { 2.0 },
            completion_rounds: if quick { 1 } else { 5 },
            completion_ops: if quick { 10 } else { 200 },
            sizes,
            scale_rounds: if quick { 1 } else { 10 },
            scale_ops: if quick { 10 } else { 100 },
            purge_calls: if quick { 1 } else { 8 },
            contention_rounds: if quick { 2 } else { 20 },
            memory_secs: if quick { 0.2 } else { 1.0 },
            peer_rounds: if quick { 1 } else { 3 },
            sustained: false,
            phase_secs: None,
            rate: None,
            systems: Vec::new(),
            phases: None,
        }
    }

    fn from_args() -> Res<Self> {
        let mut mode = Mode::Normal;
        let mut out = PathBuf::from("target/bench");
        let mut url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let mut lifecycle_only = false;
        let mut peers_only = false;
        let (mut sustained, mut phase_secs, mut rate) = (false, None, None);
        let (mut systems, mut phases) = (Vec::new(), None);
        let mut holding_only = false;
        let mut enqueue_only = false;
        let mut sqlite_only = false;
        let mut limits_only = false;
        let mut rounds = None;
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => mode = Mode::Quick,
                "--long" => mode = Mode::Long,
                "--lifecycle" => lifecycle_only = true,
                "--peers" => peers_only = true,
                "--sustained" => sustained = true,
                "--phase-secs" => {
                    phase_secs = Some(args.next().ok_or("--phase-secs needs seconds")?.parse()?);
                }
                "--rate" => rate = Some(args.next().ok_or("--rate needs tasks per second")?.parse()?),
                "--system" => systems.push(args.next().ok_or("--system needs taskfence, awa or apalis")?),
                "--phases" => phases = Some(args.next().ok_or("--phases needs a count")?.parse()?),
                "--holding" => holding_only = true,
                "--enqueue" => enqueue_only = true,
                "--sqlite" => sqlite_only = true,
                "--limits" => limits_only = true,
                "--rounds" => rounds = Some(args.next().ok_or("--rounds needs a count")?.parse()?),
                "--out" => out = args.next().ok_or("--out needs a directory")?.into(),
                "--database-url" => url = args.next().ok_or("--database-url needs a URL")?,
                "--print-sql" => {
                    // PgStore's statements for a schema, e.g. to EXPLAIN them by hand.
                    let schema = args.next().ok_or("--print-sql needs a schema name")?;
                    let pool = PgPoolOptions::new().connect_lazy(&url)?;
                    let store = taskfence::PgStore::builder(pool).schema(schema).build()?;
                    for (name, sql) in store.statements() {
                        println!("-- {name}\n{sql};\n");
                    }
                    std::process::exit(0);
                }
                "-h" | "--help" => {
                    println!(
                        "usage: taskfence-bench [--quick | --long] [--lifecycle | --peers | --holding | --enqueue | --sqlite] [--rounds N] [--out DIR] [--database-url URL]\n\
                         writes DIR/bench-results.md and DIR/throughput.svg (default DIR: target/bench);\n\
                         --lifecycle runs only the lifecycle section and prints it;\n\
                         --peers runs only the peers and the idle-queue latency and prints them;\n\
                         --sustained runs the sustained-load phases on a private cluster and writes\n\
                         DIR/sustained-results.md, DIR/sustained-depth.svg and DIR/sustained-p99.svg\n\
                         (--phase-secs S per phase, default 300; --rate R tasks/s, default 70 % of the lowest peak;\n\
                         --system NAME, repeated, runs only those systems: taskfence, awa, apalis;\n\
                         --phases N runs only the first N of the nine phases);\n\
                         --holding runs only what a consumer holds (before/after, and one kill) and prints it;\n\
                         --enqueue runs only the bulk enqueue (submit vs submit_many) and prints it;\n\
                         --sqlite runs only SqliteStore beside apalis-sqlite (and MemoryStore, PgStore) and prints it;\n\
                         --limits runs only what deciding limits costs (no limit, a hot key, many keys, a bucket) and prints it;\n\
                         --rounds N sets the rounds of the peers and --sqlite sections"
                    );
                    std::process::exit(0);
                }
                other => return Err(format!("unknown argument {other:?} (try --help)").into()),
            }
        }
        let base = Self::new(mode, out, url);
        Ok(Self {
            peer_rounds: rounds.unwrap_or(base.peer_rounds),
            sqlite_only,
            limits_only,
            lifecycle_only,
            peers_only,
            sustained,
            phase_secs,
            rate,
            systems,
            phases,
            holding_only,
            enqueue_only,
            ..base
        })
    }

    /// The largest worker count: the pool must serve that many at once, plus
    /// the connections still sending sqlx's release-time ping.
    fn pool_size(&self) -> u32 {
        let most = self.workers.iter().copied().max().unwrap_or(1);
        u32::try_from(most + 4).unwrap_or(u32::MAX)
    }
}

/// A pool like the one `PgStore`'s docs recommend: no acquire-time ping.
/// `session` adds per-connection settings (e.g. `synchronous_commit`).
pub async fn pool(cfg: &Config, size: u32, session: &[(&str, &str)]) -> Res<PgPool> {
    let options: PgConnectOptions = cfg.url.parse()?;
    let options = options.options(session.iter().copied());
    Ok(PgPoolOptions::new()
        .max_connections(size)
        .min_connections(size)
        .test_before_acquire(false)
        .connect_with(options)
        .await?)
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("taskfence-bench: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Res<()> {
    let cfg = Config::from_args()?;
    let started = Instant::now();
    if cfg.sustained {
        let mut report = sustained::run(&cfg).await?;
        report.finish(started.elapsed());
        std::fs::write(cfg.out.join("sustained-results.md"), report.markdown())?;
        println!("{}", report.markdown());
        return Ok(());
    }
    let pool = pool(&cfg, cfg.pool_size(), &[]).await?;
    let mut report = report::Report::new(&cfg, db::describe(&pool).await?);

    if cfg.lifecycle_only {
        lifecycle::run(&cfg, &pool, &mut report).await?;
        report.finish(started.elapsed());
        println!("{}", report.markdown());
        pool.close().await;
        return Ok(());
    }
    if cfg.enqueue_only {
        enqueue::run(&cfg, &pool, &mut report).await?;
        report.finish(started.elapsed());
        println!("{}", report.markdown());
        pool.close().await;
        return Ok(());
    }
    if cfg.sqlite_only {
        sqlite::run(&cfg, &pool, &mut report).await?;
        report.finish(started.elapsed());
        println!("{}", report.markdown());
        pool.close().await;
        return Ok(());
    }
    if cfg.limits_only {
        limits::run(&cfg, &pool, &mut report).await?;
        report.finish(started.elapsed());
        println!("{}", report.markdown());
        pool.close().await;
        return Ok(());
    }
    if cfg.holding_only {
        holding::run(&cfg, &pool).await?;
        pool.close().await;
        return Ok(());
    }
    if cfg.peers_only {
        peers::run(&cfg, &pool, &mut report).await?;
        peers::wake_latency(&cfg, &pool, &mut report).await?;
        report.finish(started.elapsed());
        println!("{}", report.markdown());
        pool.close().await;
        return Ok(());
    }
    eprintln!("[bench] round trips per operation");
    trips::run(&cfg, &pool, &mut report).await?;
    eprintln!("[bench] lifecycle throughput, ours vs the raw-SQL ceiling");
    lifecycle::run(&cfg, &pool, &mut report).await?;
    eprintln!("[bench] peers: taskfence, batched, the ceiling, apalis and River on one workload");
    peers::run(&cfg, &pool, &mut report).await?;
    eprintln!("[bench] submit to start on an idle queue");
    peers::wake_latency(&cfg, &pool, &mut report).await?;
    eprintln!("[bench] bulk enqueue, submit vs submit_many");
    enqueue::run(&cfg, &pool, &mut report).await?;
    eprintln!("[bench] completion latency, the textbook locking transaction vs ours");
    completion::run(&cfg, &pool, &mut report).await?;
    eprintln!("[bench] 32 workers racing for one task");
    contention::run(&cfg, &pool, &mut report).await?;
    eprintln!("[bench] latency as the table grows: {:?} rows", cfg.sizes);
    scale::run(&cfg, &pool, &mut report).await?;
    eprintln!("[bench] MemoryStore");
    memory::run(&cfg, &mut report).await?;

    report.finish(started.elapsed());
    let (md, svg) = report.write(&cfg.out)?;
    println!("{}", report.markdown());
    eprintln!("[bench] wrote {} and {}", md.display(), svg.display());
    pool.close().await;
    Ok(())
}
