//! Sustained load (`--sustained`): the conditions under which job queues on
//! PostgreSQL fail, run on a private cluster with PostgreSQL's default
//! settings (autovacuum on), the same phases for every system in one run.
//!
//! First each system's end-to-end peak is measured (its workers running
//! while its producers enqueue a backlog as fast as they can); the offered
//! rate is 70 % of the lowest peak (`--rate` sets it), so that every system
//! can keep up with the clean load. Then per system, in a database of its
//! own, with `W` workers: clean load; 1.5× overload; recovery; a transaction
//! holding an xid (xmin pinned); the time after its release; four
//! `REPEATABLE READ` readers; client connections terminated every second; a
//! server restart; recovery. Every second: work started, pickup latency
//! (enqueue to the work function's start) p50/p99, queue depth (enqueued −
//! started: a task run again after a lost completion counts twice, so after
//! a kill or the restart the depth reads low) and dead tuples; per phase,
//! write transactions per task started. Afterwards the load stops, the
//! queue drains, and the database is checked: every enqueued task
//! completed, and (taskfence) no task saved twice, no task over its retry
//! budget.

mod chart;
mod pressure;
mod systems;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use taskfence_test_support::{PrivateServer, TempDatabase};
use tokio::sync::Semaphore;

use crate::report::Report;
use crate::stats::{Samples, ms};
use crate::{Config, Mode, Res};
use pressure::{Applied, HARNESS, Pressure};
use systems::{Kind, Probe, Producer, System};

/// One phase of the run.
struct Phase {
    name: &'static str,
    /// The offered rate, as a multiple of the base rate.
    load: f64,
    pressure: Pressure,
}

const PHASES: [Phase; 9] = [
    Phase {
        name: "clean",
        load: 1.0,
        pressure: Pressure::None,
    },
    Phase {
        name: "overload 1.5×",
        load: 1.5,
        pressure: Pressure::None,
    },
    Phase {
        name: "recovery",
        load: 1.0,
        pressure: Pressure::None,
    },
    Phase {
        name: "xmin held (idle in transaction)",
        load: 1.0,
        pressure: Pressure::HeldXmin,
    },
    Phase {
        name: "after the release",
        load: 1.0,
        pressure: Pressure::None,
    },
    Phase {
        name: "4 REPEATABLE READ readers",
        load: 1.0,
        pressure: Pressure::Readers,
    },
    Phase {
        name: "connections killed every second",
        load: 1.0,
        pressure: Pressure::Terminations,
    },
    Phase {
        name: "server restart",
        load: 1.0,
        pressure: Pressure::Restart,
    },
    Phase {
        name: "recovery after restart",
        load: 1.0,
        pressure: Pressure::None,
    },
];

/// The phase whose end the recovery is timed from, and the one it is timed in.
const HELD: usize = 3;
const RELEASED: usize = 4;

/// One second of one system's run.
#[derive(Debug, Clone)]
pub(crate) struct Second {
    pub(crate) t: f64,
    pub(crate) phase: usize,
    pub(crate) started: u64,
    pub(crate) p99: Option<Duration>,
    pub(crate) depth: u64,
    pub(crate) dead: i64,
}

/// One system's run: its seconds, the pickups per phase, and the check.
pub(crate) struct Run {
    pub(crate) kind: Kind,
    pub(crate) seconds: Vec<Second>,
    pickups: Vec<Samples>,
    /// Per phase, transaction ids assigned in the cluster (write
    /// transactions); `None` where a reading failed (the restart).
    writes: Vec<Option<i64>>,
    enqueued: u64,
    not_completed: i64,
    enqueue_errors: u64,
    violations: Option<(i64, i64)>,
}

/// Sizes of a sustained run.
struct Sizes {
    workers: usize,
    phase_secs: f64,
    backlog: u64,
    /// How long the queue may take to drain once the load stops.
    drain: Duration,
    /// The phases run: the first this many of [`PHASES`].
    phases: usize,
}

fn sizes(cfg: &Config) -> Sizes {
    let quick = cfg.mode == Mode::Quick;
    Sizes {
        workers: if quick { 4 } else { 32 },
        phase_secs: cfg.phase_secs.unwrap_or(if quick { 2.0 } else { 300.0 }),
        backlog: if quick { 100 } else { 20_000 },
        drain: Duration::from_secs(if quick { 30 } else { 300 }),
        phases: cfg.phases.unwrap_or(PHASES.len()).clamp(1, PHASES.len()),
    }
}

pub(crate) async fn run(cfg: &Config) -> Res<Report> {
    let sizes = sizes(cfg);
    let kinds = Kind::selected(&cfg.systems)?;
    let server = Arc::new(PrivateServer::start());
    let admin = harness_pool(&server.url().parse()?).await?;
    let mut report = Report::new(cfg, crate::db::describe(&admin).await?);
    admin.close().await;

    let mut peaks = Vec::new();
    for &kind in &kinds {
        eprintln!(
            "[bench] sustained: {}'s peak: {} tasks enqueued while its workers run",
            kind.name(),
            sizes.backlog
        );
        peaks.push((kind, peak(&server, kind, &sizes).await?));
    }
    let lowest = peaks.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let rate = cfg.rate.unwrap_or((0.7 * lowest).max(1.0));
    let mut runs = Vec::new();
    for &kind in &kinds {
        eprintln!("[bench] sustained: {} at {rate:.0} tasks/s", kind.name());
        let run = phases(&server, kind, rate, &sizes).await?;
        eprintln!("[bench] sustained: {}", check_row(&run).join(" | "));
        runs.push(run);
    }
    drop(server);

    describe(&mut report, &sizes, rate, &peaks);
    tables(&mut report, &runs, rate);
    let out = &cfg.out;
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("sustained-depth.svg"),
        chart::depth(&runs, phase_names(&sizes)),
    )?;
    std::fs::write(
        out.join("sustained-p99.svg"),
        chart::p99(&runs, phase_names(&sizes)),
    )?;
    Ok(report)
}

fn phase_names(sizes: &Sizes) -> Vec<&'static str> {
    PHASES[..sizes.phases].iter().map(|p| p.name).collect()
}

/// A small pool of the harness's own (spared by the terminator).
async fn harness_pool(options: &PgConnectOptions) -> Res<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(2)
        .test_before_acquire(false)
        .connect_with(options.clone().application_name(HARNESS))
        .await?)
}

/// `kind`'s end-to-end peak: `W` workers running while `W` producers
/// enqueue `backlog` tasks as fast as they can, timed until every one has
/// started. Producers and workers share the machine and the server, as the
/// offered load and the workers do in the phases; a peak measured on a
/// backlog enqueued beforehand (processing alone) is one no system reaches
/// while it is also taking enqueues.
async fn peak(server: &PrivateServer, kind: Kind, sizes: &Sizes) -> Res<f64> {
    let db = TempDatabase::create_at(&server.url()).await;
    let mut system = System::set_up(kind, &db.options(), sizes.workers).await?;
    let probe = Arc::new(Probe::default());
    system.start(sizes.workers, probe.clone()).await?;
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..sizes.workers)
        .map(|_| {
            let (producer, next, n) = (system.producer.clone(), next.clone(), sizes.backlog);
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Res::Ok(());
                    }
                    producer.enqueue(i).await?;
                }
            })
        })
        .collect();
    for p in producers {
        p.await??;
    }
    let limit = Duration::from_secs(60 + sizes.backlog / 10);
    while probe.count() < sizes.backlog {
        if start.elapsed() > limit {
            return Err(format!(
                "{}: {} of {} started within {limit:?}",
                kind.name(),
                probe.count(),
                sizes.backlog
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = sizes.backlog as f64 / start.elapsed().as_secs_f64();
    eprintln!("[bench] sustained: {}'s peak: {rate:.0} tasks/s", kind.name());
    system.stop().await?;
    system.close().await;
    drop(db);
    Ok(rate)
}

/// The offered load: enqueues at `rate × load` per second, each retried
/// until it succeeds (the connection it ran on may have been killed), at
/// most 256 in flight.
struct Load {
    /// Tasks per second, as `f64` bits.
    rate: AtomicU64,
    enqueued: AtomicU64,
    errors: AtomicU64,
    stop: AtomicU64,
}

impl Load {
    fn set(&self, rate: f64) {
        self.rate.store(rate.to_bits(), Ordering::Relaxed);
    }

    async fn drive(self: Arc<Self>, producer: Producer) {
        let in_flight = Arc::new(Semaphore::new(256));
        let (mut due, mut sent) = (0.0f64, 0u64);
        let mut last = Instant::now();
        while self.stop.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let now = Instant::now();
            due += f64::from_bits(self.rate.load(Ordering::Relaxed)) * (now - last).as_secs_f64();
            last = now;
            while (sent as f64) < due {
                let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                    break;
                };
                let (load, producer, i) = (self.clone(), producer.clone(), sent);
                sent += 1;
                tokio::spawn(async move {
                    while producer.enqueue(i).await.is_err() {
                        load.errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    load.enqueued.fetch_add(1, Ordering::Relaxed);
                    drop(permit);
                });
            }
            // What could not be sent for want of room is not owed later.
            due = due.min(sent as f64);
        }
        let _ = in_flight.acquire_many(256).await;
    }
}

/// The cluster's next transaction id: the difference of two readings is the
/// write transactions between them (read-only ones take no id).
async fn next_xid(pool: &PgPool) -> Res<i64> {
    Ok(
        sqlx::query_scalar("SELECT txid_snapshot_xmax(txid_current_snapshot())")
            .fetch_one(pool)
            .await?,
    )
}

/// Dead tuples in the database's tables (`pg_stat_user_tables`, as fresh as
/// the statistics are: about a second behind).
async fn dead_tuples(pool: &PgPool) -> Res<i64> {
    Ok(
        sqlx::query_scalar("SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables")
            .fetch_one(pool)
            .await?,
    )
}

/// Every phase on `kind`, then the drain and the check.
async fn phases(server: &Arc<PrivateServer>, kind: Kind, rate: f64, sizes: &Sizes) -> Res<Run> {
    let db = TempDatabase::create_at(&server.url()).await;
    let options = db.options();
    let mut system = System::set_up(kind, &options, sizes.workers).await?;
    let monitor = harness_pool(&options).await?;
    let probe = Arc::new(Probe::default());
    system.start(sizes.workers, probe.clone()).await?;
    let load = Arc::new(Load {
        rate: AtomicU64::new(0f64.to_bits()),
        enqueued: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        stop: AtomicU64::new(0),
    });
    let driving = tokio::spawn(load.clone().drive(system.producer.clone()));

    let begun = Instant::now();
    let (mut seconds, mut pickups, mut writes) = (Vec::new(), Vec::new(), Vec::new());
    let (mut last_started, mut dead) = (0u64, 0i64);
    for (index, phase) in PHASES[..sizes.phases].iter().enumerate() {
        eprintln!("[bench] sustained: {}, {}", kind.name(), phase.name);
        load.set(rate * phase.load);
        let applied = Applied::start(phase.pressure, &options, server, sizes.phase_secs).await?;
        let xid_before = next_xid(&monitor).await.ok();
        let mut samples = Samples::default();
        let end = Instant::now() + Duration::from_secs_f64(sizes.phase_secs);
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_secs(1).min(end - Instant::now())).await;
            let started = probe.count();
            let mut second = Samples::default();
            for micros in probe.take() {
                second.push(Duration::from_micros(micros));
                samples.push(Duration::from_micros(micros));
            }
            // Kept from the last reading while the server restarts.
            if let Ok(now) = dead_tuples(&monitor).await {
                dead = now;
            }
            seconds.push(Second {
                t: begun.elapsed().as_secs_f64(),
                phase: index,
                started: started - last_started,
                p99: (second.len() > 0).then(|| second.p99()),
                depth: load.enqueued.load(Ordering::Relaxed).saturating_sub(started),
                dead,
            });
            last_started = started;
        }
        applied.end().await?;
        let xid_after = next_xid(&monitor).await.ok();
        writes.push(xid_before.zip(xid_after).map(|(b, a)| a - b));
        eprintln!(
            "[bench] sustained: {}",
            phase_row(kind, index, rate, &seconds, &samples, writes[index]).join(" | ")
        );
        pickups.push(samples);
    }
    load.stop.store(1, Ordering::Relaxed);
    driving.await?;
    let enqueued = load.enqueued.load(Ordering::Relaxed);
    // Drain: every enqueued task durably completed.
    let limit = Instant::now() + sizes.drain;
    let not_completed = loop {
        let not_completed = system.not_completed(enqueued).await?;
        if not_completed <= 0 || Instant::now() > limit {
            break not_completed;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let violations = system.violations().await?;
    system.stop().await?;
    system.close().await;
    monitor.close().await;
    drop(db);
    Ok(Run {
        kind,
        seconds,
        pickups,
        writes,
        enqueued,
        not_completed,
        enqueue_errors: load.errors.load(Ordering::Relaxed),
        violations,
    })
}

fn describe(report: &mut Report, sizes: &Sizes, rate: f64, peaks: &[(Kind, f64)]) {
    let peaks = peaks
        .iter()
        .map(|(k, p)| format!("{} {p:.0}/s", k.name()))
        .collect::<Vec<_>>()
        .join(", ");
    report.section(
        "Sustained load",
        &format!(
            "A private PostgreSQL cluster started by the harness (`initdb`, `pg_ctl`) with \
             PostgreSQL's default settings (autovacuum on) except: {}. Each system in a database \
             of its own, with its own migrations, {} workers, a no-op work function. Peaks, each with \
             its workers running while its producers enqueue {} tasks as fast as they can: \
             {peaks}; offered rate {rate:.0} tasks/s (70 % of the lowest \
             peak), 1.5× in the overload phase. Phases of {:.0} s each, in order: {}. Per second: \
             work functions started, pickup latency (enqueue to the work function's start, the \
             enqueue's own commit included), queue depth (enqueued − started; a task run again after a \
             lost completion counts twice, so after kills and the restart it reads low), dead \
             tuples of the system's tables (`pg_stat_user_tables`); per phase, write \
             transactions per task started (transaction ids the cluster assigned, over the work \
             started; – where the restart broke a reading). Enqueues that fail (a killed connection, \
             the restart) are retried until they succeed; taskfence's retry is the same request \
             key, so it cannot make a second task. Charts: `sustained-depth.svg`, \
             `sustained-p99.svg`. Afterwards the load stops and the queue has {} s to drain; \
             then the check, from each system's tables: tasks not completed (awa: its jobs in \
             any other state, as its `admin::state_counts` reports them, since it truncates \
             finished ones), and for taskfence (whose tables record them) tasks with two \
             completed attempts and tasks over their retry budget.",
            taskfence_test_support::private_server::NON_DEFAULT.join(" "),
            sizes.workers,
            sizes.backlog,
            sizes.phase_secs,
            phase_names(sizes).join("; "),
            sizes.drain.as_secs(),
        ),
    );
}

const PHASE_COLUMNS: [&str; 9] = [
    "system",
    "phase",
    "offered (tasks/s)",
    "started (tasks/s)",
    "pickup p50 (ms)",
    "pickup p99 (ms)",
    "max depth",
    "dead tuples at the end",
    "write transactions / task",
];

/// One phase of one system's run as a row of [`PHASE_COLUMNS`]: the table's,
/// and the progress line printed as the phase ends (a long run's figures
/// survive an interrupted run).
fn phase_row(
    kind: Kind,
    index: usize,
    rate: f64,
    seconds: &[Second],
    samples: &Samples,
    writes: Option<i64>,
) -> Vec<String> {
    let phase = &PHASES[index];
    let seconds: Vec<&Second> = seconds.iter().filter(|s| s.phase == index).collect();
    let secs = seconds.len().max(1) as f64;
    let started: u64 = seconds.iter().map(|s| s.started).sum();
    let (p50, p99) = if samples.len() > 0 {
        (ms(samples.p50()), ms(samples.p99()))
    } else {
        ("–".to_owned(), "–".to_owned())
    };
    vec![
        kind.name().to_owned(),
        phase.name.to_owned(),
        format!("{:.0}", rate * phase.load),
        format!("{:.0}", started as f64 / secs),
        p50,
        p99,
        seconds.iter().map(|s| s.depth).max().unwrap_or(0).to_string(),
        seconds.last().map_or(0, |s| s.dead).to_string(),
        match writes {
            Some(w) if started > 0 => format!("{:.2}", w as f64 / started as f64),
            _ => "–".to_owned(),
        },
    ]
}

fn tables(report: &mut Report, runs: &[Run], rate: f64) {
    let mut rows = Vec::new();
    for run in runs {
        for index in 0..run.pickups.len() {
            rows.push(phase_row(
                run.kind,
                index,
                rate,
                &run.seconds,
                &run.pickups[index],
                run.writes[index],
            ));
        }
    }
    report.table(&PHASE_COLUMNS, rows);

    report.table(&CHECK_COLUMNS, runs.iter().map(check_row).collect());
}

const CHECK_COLUMNS: [&str; 7] = [
    "system",
    "enqueued",
    "not completed after the drain",
    "saved twice",
    "over budget",
    "enqueue errors retried",
    "recovery after the xmin release",
];

/// One system's check after the drain, as a row of [`CHECK_COLUMNS`].
fn check_row(run: &Run) -> Vec<String> {
    let (twice, over) = run.violations.map_or(
        ("not recorded".to_owned(), "not recorded".to_owned()),
        |(t, o)| (t.to_string(), o.to_string()),
    );
    vec![
        run.kind.name().to_owned(),
        run.enqueued.to_string(),
        run.not_completed.max(0).to_string(),
        twice,
        over,
        run.enqueue_errors.to_string(),
        match recovery(run) {
            Some(s) => format!("{s:.0} s"),
            None if run.pickups.len() <= RELEASED => "not run".to_owned(),
            None => "not within the phase".to_owned(),
        },
    ]
}

/// Seconds from the held transaction's release until the queue depth is
/// back under the clean phase's maximum.
fn recovery(run: &Run) -> Option<f64> {
    let clean = run
        .seconds
        .iter()
        .filter(|s| s.phase == 0)
        .map(|s| s.depth)
        .max()?;
    let released = run
        .seconds
        .iter()
        .filter(|s| s.phase == HELD)
        .map(|s| s.t)
        .fold(0.0, f64::max);
    run.seconds
        .iter()
        .find(|s| s.phase == RELEASED && s.depth <= clean)
        .map(|s| s.t - released)
}
