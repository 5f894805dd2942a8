//! `cargo run -p demo`: a chat reply pipeline on taskfence, with the
//! faults that make idempotency hard injected on purpose, and a check at the
//! end that every completed task has exactly one saved reply.
//!
//! The pieces live in the library (`src/lib.rs`).

use std::error::Error;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use taskfence::{MemoryStore, TaskStore};

use demo::report::{self, RunInfo};
use demo::sim::{self, Config};
use demo::timebase::{REAL_TIME_SCALE, Timebase};

const USAGE: &str = "Usage: cargo run -p demo -- [--tasks N] [--workers N] [--seed N] [--faults RATE] \
                     [--database-url URL] [--real-time]";

fn help() -> String {
    let d = Config::default();
    format!(
        "Runs a chat reply pipeline on taskfence with faults injected on purpose, prints the story of one
conversation, a summary of the run, and checks that every completed task has one saved reply.

{USAGE}

Options:
  --tasks N            reply tasks to create, Sends and Regenerates [default: {tasks}]
  --workers N          workers taking messages from the queue [default: {workers}]
  --seed N             seed of every random choice [default: {seed}]. On the embedded store
                       time is simulated, so the same seed replays the same run exactly
  --faults RATE        probability of each injected fault, 0.0 to 1.0 [default: {faults}];
                       0 runs without faults
  --database-url URL   run on PostgreSQL (taskfence::PgStore) instead of the embedded
                       MemoryStore, in the schema taskfence_demo (recreated at each run,
                       kept afterwards for inspection). Time is real there, running {scale}x
                       faster than shown (a 30 s lease lasts {lease_ms} ms), so timing varies
                       from run to run and the counts may differ; the invariant holds all the same
  --real-time          run the embedded store on real time too, as --database-url does
  -h, --help           print this help

Exit status: 0 when the invariant holds, 1 when it does not or the store fails, 2 for bad flags.
",
        tasks = d.tasks,
        workers = d.workers,
        seed = d.seed,
        faults = d.faults,
        scale = REAL_TIME_SCALE,
        lease_ms = sim::LEASE.as_millis() / u128::from(REAL_TIME_SCALE),
    )
}

#[derive(Debug)]
struct Args {
    config: Config,
    database_url: Option<String>,
    real_time: bool,
}

/// Parses the flags; `Ok(None)` means help was asked for.
fn parse(mut args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut parsed = Args {
        config: Config::default(),
        database_url: None,
        real_time: false,
    };
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_owned(), Some(value.to_owned())),
            _ => (arg, None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        fn number<T: std::str::FromStr>(name: &str, text: String) -> Result<T, String> {
            text.parse()
                .map_err(|_| format!("{name}: {text:?} is not a valid number"))
        }
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--tasks" => parsed.config.tasks = number("--tasks", value("--tasks")?)?,
            "--workers" => parsed.config.workers = number("--workers", value("--workers")?)?,
            "--seed" => parsed.config.seed = number("--seed", value("--seed")?)?,
            "--faults" => parsed.config.faults = number("--faults", value("--faults")?)?,
            "--database-url" => parsed.database_url = Some(value("--database-url")?),
            "--real-time" => parsed.real_time = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    parsed.config.validate()?;
    Ok(Some(parsed))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // It reads no `TASKFENCE_*` variable: one set is a mistake, reported.
    if let Some(unknown) = taskfence::config::unknown_env(&[]) {
        eprintln!("warning: {unknown}");
    }
    let args = match parse(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            print!("{}", help());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}\nTry --help.");
            return ExitCode::from(2);
        }
    };
    match demo(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the demo and prints it; `Ok(false)` when the invariant is violated.
async fn demo(args: Args) -> Result<bool, Box<dyn Error>> {
    let (store, tb, backend): (Arc<dyn TaskStore>, Timebase, String) = match &args.database_url {
        Some(url) => {
            let store = postgres(url).await?;
            (
                store,
                Timebase::new_real(),
                format!("PostgreSQL, real time {REAL_TIME_SCALE}x faster than shown"),
            )
        }
        None if args.real_time => (
            Arc::new(MemoryStore::new()),
            Timebase::new_real(),
            format!("MemoryStore, real time {REAL_TIME_SCALE}x faster than shown"),
        ),
        None => {
            let (tb, clock) = Timebase::new_virtual();
            (
                Arc::new(MemoryStore::with_clock(clock)),
                tb,
                "MemoryStore, simulated time".to_owned(),
            )
        }
    };
    let bar = Progress::new(args.config.tasks as u64);
    let started = Instant::now();
    let outcome = sim::run(&args.config, store, tb, &mut |done| bar.set(done)).await?;
    bar.finish();
    let info = RunInfo {
        backend,
        config: args.config,
        elapsed: started.elapsed(),
    };
    println!("{}", report::render(&outcome, &info));
    Ok(outcome.summary.invariant_holds())
}

/// A progress bar that stays hidden for runs shorter than a couple of
/// seconds, and when stderr is not a terminal.
struct Progress {
    bar: ProgressBar,
    started: Instant,
    shown: std::cell::Cell<bool>,
}

impl Progress {
    const SHOW_AFTER: Duration = Duration::from_secs(2);

    fn new(total: u64) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("{elapsed:>3} [{wide_bar}] {pos}/{len} tasks done, eta {eta}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        Self {
            bar,
            started: Instant::now(),
            shown: std::cell::Cell::new(false),
        }
    }

    fn set(&self, done: u64) {
        if !self.shown.get() && self.started.elapsed() > Self::SHOW_AFTER && std::io::stderr().is_terminal() {
            self.shown.set(true);
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        self.bar.set_position(done);
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// The schema `--database-url` runs in. It is dropped and created afresh at
/// the start of every run, and left afterwards for inspection.
const DEMO_SCHEMA: &str = "taskfence_demo";

/// Opens the PostgreSQL backend for `--database-url`: a `PgStore` in
/// [`DEMO_SCHEMA`], emptied and migrated, so each run starts from nothing.
async fn postgres(url: &str) -> Result<Arc<dyn TaskStore>, Box<dyn Error>> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        // The URL may hold a password: name the flag, not the value.
        .map_err(|e| format!("cannot connect to the --database-url server: {e}"))?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {DEMO_SCHEMA} CASCADE"
    )))
    .execute(&pool)
    .await?;
    let store = taskfence::PgStore::builder(pool).schema(DEMO_SCHEMA).build()?;
    store.migrate().await?;
    Ok(Arc::new(store))
}
