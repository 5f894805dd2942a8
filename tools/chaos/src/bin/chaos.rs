//! The chaos orchestrator and checker.
//!
//! 1. Starts a private PostgreSQL cluster (or uses `--url`), creates a fresh
//!    schema with taskfence's tables and the harness's queue.
//! 2. Spawns `--workers` `chaos-worker` processes.
//! 3. Submits `--tasks` tasks over `--submit-secs` (every tenth one twice: a
//!    repeated submission must return the same task); a dispatcher publishes
//!    each handoff as two queue messages, so every task is delivered at least twice.
//! 4. Meanwhile injects faults for real, in turn: `SIGKILL` of a worker in the
//!    middle of a provider call (then a replacement is spawned), `SIGSTOP` of a
//!    worker mid-call for longer than the lease (then `SIGCONT`), and
//!    `pg_terminate_backend` on every worker connection; plus `--restarts`
//!    server restarts spread over the run.
//! 5. Waits until every task is terminal, stops the workers, and runs the
//!    checker. Exits 1 when a must-be-zero count is not zero, 2 on a harness error.
//!
//! ```text
//! cargo run -p chaos --release --bin chaos -- --tasks 10000 --workers 8 --submit-secs 300
//! ```
//!
//! `--trace-dir DIR` (an empty directory) makes every worker record its store
//! calls there, for the trace replay (`chaos::trace`).
//!
//! `--limits` is the limits mode: every task names a concurrency key (one in
//! three over `--in-order-keys` keys of limit 1, the others over
//! `--shared-keys` keys of limit 3) and the rate bucket `provider`, defined first at `--rate-per-sec`
//! with `--burst`; workers make a provider call only under a lease that
//! covers it and never abort one (`chaos-worker --limits`); the checker adds
//! each key's most calls in flight against its limit, limit 1's order, and
//! the bucket's most claims per second against `burst + rate`
//! (`checker::check_limits`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use chaos::args::Args;
use chaos::checker;
use chaos::queue::{self, Queue, quote};
use chaos::{APP_PREFIX, OPERATION, SCOPE};
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use taskfence::throttle::{ConcurrencyKey, RateBucket};
use taskfence::{InputHash, NewTask, PgStore, RequestKey, RetryPolicy, TaskStore};
use taskfence_test_support::PrivateServer;
use taskfence_test_support::TempSchema;
use tokio::process::{Child, Command};

/// The kinds of fault, in the order the injector takes turns.
const KINDS: [&str; 3] = [
    "sigkill mid-call",
    "sigstop past the lease",
    "pg_terminate_backend",
];
const RESTART: &str = "postgresql restart";
/// Every run's schema is named `taskfence_chaos_<unix secs>_<unique>`.
const SCHEMA_PREFIX: &str = "taskfence_chaos_";
/// The limits mode's one rate bucket, named by every task.
const BUCKET: &str = "provider";

/// The limits mode's choices (`--limits`).
#[derive(Debug, Clone, Copy)]
struct LimitsConfig {
    /// Keys of limit 1 (in-order conversations).
    in_order_keys: u32,
    /// Keys of limit 3.
    shared_keys: u32,
    /// The bucket's tokens per second.
    rate_per_sec: u32,
    /// The bucket's burst.
    burst: u32,
}

impl LimitsConfig {
    /// The concurrency key of the `i`-th task: one task in three goes to
    /// the in-order keys, two to the shared ones (so a shared key has enough
    /// work to fill its limit), each group's keys in turn.
    fn key(&self, i: u32) -> ConcurrencyKey {
        let in_order = self.shared_keys == 0 || (self.in_order_keys > 0 && i.is_multiple_of(3));
        if in_order {
            // The c-th task of the in-order keys.
            let c = if self.shared_keys == 0 { i } else { i / 3 };
            ConcurrencyKey::new(format!("conversation-{}", c % self.in_order_keys.max(1)), 1)
        } else {
            // The j-th task of the shared keys (every task but one in three).
            let j = if self.in_order_keys == 0 { i } else { i - i / 3 - 1 };
            ConcurrencyKey::new(format!("tenant-{}", j % self.shared_keys), 3)
        }
    }

    fn bucket(&self) -> RateBucket {
        RateBucket::per_second(BUCKET, self.rate_per_sec).burst(self.burst)
    }
}

#[derive(Debug, Clone)]
struct Config {
    tasks: u32,
    workers: u32,
    concurrency: u32,
    lease: Duration,
    submit_for: Duration,
    fault_every: Duration,
    restarts: u32,
    drain: Duration,
    max_attempts: u32,
    worker_bin: PathBuf,
    worker_args: Vec<String>,
    log_dir: Option<PathBuf>,
    trace_dir: Option<PathBuf>,
    keep: bool,
    limits: Option<LimitsConfig>,
}

impl Config {
    fn from_args(args: &Args) -> Self {
        let worker_bin = args.string("worker-bin").map_or_else(
            || {
                std::env::current_exe()
                    .expect("own path")
                    .with_file_name("chaos-worker")
            },
            PathBuf::from,
        );
        let mut worker_args = Vec::new();
        for name in [
            "call-min-ms",
            "call-max-ms",
            "retryable-permille",
            "permanent-permille",
            "lost-reply-permille",
        ] {
            if let Some(v) = args.string(name) {
                worker_args.extend([format!("--{name}"), v]);
            }
        }
        let limits = args.flag("limits").then(|| LimitsConfig {
            in_order_keys: args.get("in-order-keys", 6),
            shared_keys: args.get("shared-keys", 2),
            rate_per_sec: args.get("rate-per-sec", 5),
            burst: args.get("burst", 3),
        });
        if limits.is_some() {
            worker_args.push("--limits".to_owned());
        }
        Self {
            tasks: args.get("tasks", 200),
            workers: args.get("workers", 3),
            concurrency: args.get("concurrency", 4),
            lease: Duration::from_millis(args.get("lease-ms", 2000)),
            submit_for: Duration::from_secs(args.get("submit-secs", 30)),
            fault_every: Duration::from_millis(args.get("fault-every-ms", 3000)),
            restarts: args.get("restarts", 1),
            drain: Duration::from_secs(args.get("drain-secs", 120)),
            max_attempts: args.get("max-attempts", 8),
            worker_bin,
            worker_args,
            log_dir: args.string("log-dir").map(PathBuf::from),
            trace_dir: args.string("trace-dir").map(PathBuf::from),
            keep: args.flag("keep"),
            limits,
        }
    }
}

/// Where the server is, and how to restart it.
enum Server {
    Private(PrivateServer),
    /// An existing server; restarts run this shell command (or are refused).
    External {
        url: String,
        restart: Option<String>,
    },
}

impl Server {
    fn url(&self) -> String {
        match self {
            Server::Private(s) => s.url(),
            Server::External { url, .. } => url.clone(),
        }
    }
}

/// The worker processes, by slot; a killed one is replaced in its slot.
struct Workers {
    config: Config,
    url: String,
    schema: String,
    children: Vec<Child>,
    spawned: u32,
}

impl Workers {
    fn spawn_one(&mut self) -> Child {
        self.spawned += 1;
        let id = format!("w{}", self.spawned);
        let stderr = match &self.config.log_dir {
            Some(dir) => std::fs::File::create(dir.join(format!("{}-{id}.log", self.schema)))
                .map_or_else(|_| Stdio::null(), Stdio::from),
            None => Stdio::null(),
        };
        Command::new(&self.config.worker_bin)
            .args(["--url", &self.url, "--schema", &self.schema, "--worker", &id])
            .args(["--lease-ms", &self.config.lease.as_millis().to_string()])
            .args(["--concurrency", &self.config.concurrency.to_string()])
            .args(&self.config.worker_args)
            .args(
                self.config
                    .trace_dir
                    .iter()
                    .flat_map(|dir| ["--trace-dir".into(), dir.clone().into_os_string()]),
            )
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.config.worker_bin.display()))
    }

    fn pids(&self) -> Vec<i32> {
        self.children
            .iter()
            .filter_map(|c| c.id().and_then(|p| i32::try_from(p).ok()))
            .collect()
    }

    fn slot_of(&self, pid: i32) -> Option<usize> {
        self.children
            .iter()
            .position(|c| c.id().and_then(|p| i32::try_from(p).ok()) == Some(pid))
    }

    async fn stop_all(&mut self) {
        for child in &mut self.children {
            let _ = child.kill().await;
        }
    }
}

fn signal(pid: i32, sig: &str) -> bool {
    std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::from_env();
    let config = Config::from_args(&args);
    let server = match args.string("url") {
        Some(url) => Server::External {
            url,
            restart: args.string("restart-command"),
        },
        None => Server::Private(PrivateServer::start()),
    };
    if config.restarts > 0 && matches!(server, Server::External { restart: None, .. }) {
        eprintln!("--restarts with --url needs --restart-command");
        return ExitCode::from(2);
    }
    // SIGTERM / SIGINT end the run early but still stop the workers (dropped
    // with the run) and the private server (dropped below).
    let interrupted = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
    };
    let server = Arc::new(server);
    let outcome = tokio::select! {
        outcome = run(&config, server.clone()) => outcome,
        () = interrupted => Err("interrupted".into()),
    };
    drop(server);
    match outcome {
        Ok(clean) if clean => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("chaos: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(config: &Config, server: Arc<Server>) -> Result<bool, Box<dyn std::error::Error>> {
    let url = server.url();
    let unique = uuid::Uuid::now_v7().simple().to_string();
    // Dropped when the run ends, also on an error or an interruption; schemas
    // left by killed runs are dropped after an hour. `--keep` leaves it for
    // inspection: its drop never runs.
    let temp = TempSchema::new(&url, SCHEMA_PREFIX).await;
    let schema = temp.name().to_owned();
    let _dropped_at_the_end = if config.keep {
        temp.keep();
        None
    } else {
        Some(temp)
    };
    let options: PgConnectOptions = url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(
            options
                .application_name("chaos-orchestrator")
                .disable_statement_logging(),
        )
        .await?;
    let store = PgStore::builder(pool.clone()).schema(&schema).build()?;
    store.migrate().await?;
    queue::setup(&pool, &schema).await?;
    let queue = Queue::new(pool.clone(), &schema);
    println!(
        "chaos: schema {schema}, {} tasks, {} workers × {} concurrent, lease {:?}, {} restarts",
        config.tasks, config.workers, config.concurrency, config.lease, config.restarts
    );

    let started = Instant::now();
    let mut workers = Workers {
        config: config.clone(),
        url: url.clone(),
        schema: schema.clone(),
        children: Vec::new(),
        spawned: 0,
    };
    for _ in 0..config.workers {
        let child = workers.spawn_one();
        workers.children.push(child);
    }

    let submitted = Arc::new(AtomicI64::new(0));
    let submitting_done = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    if let Some(limits) = config.limits {
        let bucket = limits.bucket();
        store.define_bucket(bucket.clone()).await?;
        queue.record_bucket(&bucket).await?;
        println!(
            "chaos: limits mode: {} keys of limit 1, {} of limit 3, bucket {BUCKET} {} per second, burst {}",
            limits.in_order_keys, limits.shared_keys, limits.rate_per_sec, limits.burst
        );
    }
    let submitter = tokio::spawn(submit_all(
        store.clone(),
        queue.clone(),
        config.clone(),
        unique.clone(),
        submitted.clone(),
        submitting_done.clone(),
    ));
    let dispatcher = tokio::spawn(dispatch_loop(store.clone(), queue.clone(), stop.clone()));

    let faults = inject_faults(
        config,
        &server,
        &pool,
        &queue,
        &mut workers,
        &submitting_done,
        started,
    )
    .await;
    submitter.await??;
    println!(
        "chaos: {} tasks submitted in {:.1} s; draining",
        submitted.load(Ordering::SeqCst),
        started.elapsed().as_secs_f64()
    );

    let drained = drain(&pool, &schema, submitted.load(Ordering::SeqCst), config.drain).await;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    workers.stop_all().await;
    dispatcher.await?;
    if !drained {
        println!("chaos: not every task was terminal after {:?}", config.drain);
    }

    let report = checker::check(&pool, &schema, submitted.load(Ordering::SeqCst)).await?;
    let limits = match config.limits {
        Some(_) => Some(checker::check_limits(&pool, &schema).await?),
        None => None,
    };
    println!(
        "\nchaos run: {} tasks, {} worker processes ({} spawned in all) × {} concurrent deliveries, \
         lease {} ms, {:.1} s wall clock\n",
        config.tasks,
        config.workers,
        workers.spawned,
        config.concurrency,
        config.lease.as_millis(),
        elapsed.as_secs_f64()
    );
    println!("| fault injected | count |\n| --- | ---: |");
    for (kind, n) in &faults {
        println!("| {kind} | {n} |");
    }
    println!();
    print!("{}", report.table());
    println!();
    if let Some(limits) = &limits {
        print!("{}", limits.table());
        println!();
    }
    for (kind, n) in &faults {
        println!("FAULT {} {n}", kind.replace(' ', "_"));
    }
    let mut zeros = report.must_be_zero().to_vec();
    if let Some(limits) = &limits {
        zeros.extend(limits.must_be_zero());
        for k in &limits.keys {
            println!("KEY {} {} {} {}", k.key, k.calls, k.max_in_flight, k.limit);
        }
        for b in &limits.buckets {
            println!(
                "BUCKET {} {} {} {}",
                b.name, b.claims, b.max_claims_per_window, b.bound
            );
        }
        println!("THROTTLED {}", limits.throttled_deliveries);
    }
    for (name, n) in &zeros {
        println!("ZERO {} {n}", name.replace(' ', "_"));
    }
    let clean = zeros.iter().all(|(_, n)| *n == 0) && report.submitted == i64::from(config.tasks);
    println!("RESULT {}", if clean { "clean" } else { "VIOLATIONS" });

    pool.close().await;
    Ok(clean)
}

/// Submits every task at an even pace over `submit_for`; every tenth twice.
async fn submit_all(
    store: PgStore,
    queue: Queue,
    config: Config,
    run: String,
    submitted: Arc<AtomicI64>,
    done: Arc<AtomicBool>,
) -> Result<(), String> {
    let policy = RetryPolicy::default()
        .max_attempts(config.max_attempts)
        .initial_backoff(Duration::from_millis(100))
        .max_backoff(Duration::from_secs(2))
        .jitter(0.2);
    let pace = config.submit_for.as_secs_f64() / f64::from(config.tasks.max(1));
    let start = Instant::now();
    for i in 0..config.tasks {
        let due = start + Duration::from_secs_f64(pace * f64::from(i));
        tokio::time::sleep_until(due.into()).await;
        let request_key = format!("req-{run}-{i}");
        // The limits are recorded before the task exists, so a worker's
        // fenced call log always finds them.
        let key = config.limits.map(|l| l.key(i));
        if let Some(key) = &key {
            while let Err(e) = queue.record_limits(&request_key, i64::from(i), key, BUCKET).await {
                eprintln!("chaos: recording limits failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let new = || {
            let task = NewTask::new(
                RequestKey::new(SCOPE, OPERATION, request_key.clone()),
                InputHash::of([run.as_bytes(), &i.to_be_bytes()]),
            )
            .payload(format!("message {i}"))
            .policy(policy);
            match &key {
                Some(key) => task.concurrency(key.clone()).rate_bucket(BUCKET),
                None => task,
            }
        };
        let first = submit_until_ok(&store, new).await;
        if i % 10 == 0 {
            let again = submit_until_ok(&store, new).await;
            if again.id != first.id {
                return Err(format!("a repeated submission of key {i} returned another task"));
            }
        }
        submitted.fetch_add(1, Ordering::SeqCst);
    }
    done.store(true, Ordering::SeqCst);
    Ok(())
}

/// A submission retried through connection losses and restarts (the same key
/// and inputs: a retry is never new work).
async fn submit_until_ok(store: &PgStore, new: impl Fn() -> NewTask) -> taskfence::Task {
    loop {
        match store.submit(new()).await {
            Ok(s) => return s.into_task(),
            Err(e) => {
                eprintln!("chaos: submit failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Publishes handoffs as two queue messages each, until told to stop.
async fn dispatch_loop(store: PgStore, queue: Queue, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        let round = store
            .dispatch(200, |stamp| {
                let queue = queue.clone();
                async move { queue.publish(stamp.task_id.as_uuid(), 2).await }
            })
            .await;
        match round {
            Ok(r) if !r.published.is_empty() => continue,
            Ok(_) => {}
            Err(e) => eprintln!("chaos: dispatch failed, retrying: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Injects faults in turn every `fault_every` until the submissions are done
/// (and at least one of each kind happened), restarts spread over the window.
async fn inject_faults(
    config: &Config,
    server: &Arc<Server>,
    pool: &PgPool,
    queue: &Queue,
    workers: &mut Workers,
    submitting_done: &AtomicBool,
    started: Instant,
) -> BTreeMap<&'static str, u32> {
    let mut counts: BTreeMap<&'static str, u32> = KINDS.iter().map(|k| (*k, 0)).collect();
    if config.restarts > 0 {
        counts.insert(RESTART, 0);
    }
    let restart_at: Vec<Duration> = (1..=config.restarts)
        .map(|i| {
            config
                .submit_for
                .mul_f64(f64::from(i) / f64::from(config.restarts + 1))
        })
        .collect();
    let mut turn = 0usize;
    let give_up = started + config.submit_for + config.drain;
    loop {
        let all_kinds = counts.values().all(|n| *n > 0);
        if (submitting_done.load(Ordering::SeqCst) && all_kinds) || Instant::now() > give_up {
            return counts;
        }
        tokio::time::sleep(config.fault_every).await;
        let restarts_done = counts.get(RESTART).copied().unwrap_or(0) as usize;
        if restart_at
            .get(restarts_done)
            .is_some_and(|at| started.elapsed() >= *at)
        {
            let server = server.clone();
            let ok = tokio::task::spawn_blocking(move || restart(&server)).await;
            if matches!(ok, Ok(true)) {
                *counts.entry(RESTART).or_default() += 1;
                println!("chaos: {RESTART} at {:.1} s", started.elapsed().as_secs_f64());
            }
            continue;
        }
        let kind = KINDS[turn % KINDS.len()];
        turn += 1;
        let injected = match kind {
            "sigkill mid-call" => kill_mid_call(queue, workers).await,
            "sigstop past the lease" => stop_past_lease(queue, workers, config.lease).await,
            _ => terminate_connections(pool).await,
        };
        if injected {
            *counts.entry(kind).or_default() += 1;
        }
    }
}

fn restart(server: &Server) -> bool {
    match server {
        Server::Private(s) => {
            s.restart();
            true
        }
        Server::External {
            restart: Some(cmd), ..
        } => std::process::Command::new("sh")
            .args(["-c", cmd])
            .status()
            .is_ok_and(|s| s.success()),
        Server::External { restart: None, .. } => false,
    }
}

/// Polls (for up to 5 s) for a worker in the middle of a provider call.
async fn find_mid_call(queue: &Queue, workers: &Workers) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(pid)) = queue.worker_mid_call(&workers.pids()).await {
            return Some(pid);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

async fn kill_mid_call(queue: &Queue, workers: &mut Workers) -> bool {
    let Some(pid) = find_mid_call(queue, workers).await else {
        return false;
    };
    let Some(slot) = workers.slot_of(pid) else {
        return false;
    };
    if !signal(pid, "KILL") {
        return false;
    }
    let _ = workers.children[slot].wait().await;
    let replacement = workers.spawn_one();
    workers.children[slot] = replacement;
    true
}

async fn stop_past_lease(queue: &Queue, workers: &Workers, lease: Duration) -> bool {
    let Some(pid) = find_mid_call(queue, workers).await else {
        return false;
    };
    if !signal(pid, "STOP") {
        return false;
    }
    // Past the lease, and past the message's visibility, so another worker
    // takes the task over while this one is frozen mid-call.
    tokio::time::sleep(lease * 2 + Duration::from_secs(1)).await;
    signal(pid, "CONT")
}

async fn terminate_connections(pool: &PgPool) -> bool {
    let killed: sqlx::Result<i64> = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE starts_with(application_name, $1) AND datname = current_database()",
    )
    .bind(APP_PREFIX)
    .fetch_one(pool)
    .await;
    matches!(killed, Ok(n) if n > 0)
}

/// Waits (bounded) until the store holds every submitted task and all are terminal.
async fn drain(pool: &PgPool, schema: &str, submitted: i64, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let sql = format!(
        "SELECT count(*) FILTER (WHERE status IN ('completed', 'failed', 'cancelled')) FROM {}.tasks",
        quote(schema)
    );
    while Instant::now() < deadline {
        if let Ok(done) = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.as_str()))
            .fetch_one(pool)
            .await
            && done >= submitted
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}
