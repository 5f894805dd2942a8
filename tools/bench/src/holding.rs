//! What a consumer holds: the default consumer side by side with the one
//! that held as many tasks ready as it ran, each on the full lease (the
//! defaults before `ready_lease`), at concurrency 16 on PostgreSQL.
//!
//! Per round and per configuration: N tasks submitted, then the consumer
//! processes them (no-op work, or work of a few milliseconds) and is
//! killed halfway — its run dropped, so nothing is released and no lease
//! renewed, as a `SIGKILL` leaves the store. Measured: processing
//! throughput up to the kill, the leases the process held (sampled while
//! it ran, and at the kill), and how long the leases it held at the kill
//! keep their tasks from any other process (store clock).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgPool;
use taskfence::runtime::{ConsumerConfig, StoreQueue};
use taskfence::{PgStore, Response, TaskStore};

use crate::db::{BenchSchema, LEASE, RESPONSE};
use crate::lifecycle::{fresh_key, new_task};
use crate::stats::median;
use crate::{Config, Mode, Res};

/// The process's concurrency.
const CONCURRENCY: usize = 16;

/// The two ways of holding tasks measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holding {
    /// `prefetch = concurrency`, ready tasks on the full lease.
    Before,
    /// The defaults: a quarter of the concurrency ready, on a third of the lease.
    After,
}

impl Holding {
    fn name(self) -> &'static str {
        match self {
            Holding::Before => "prefetch 16, ready on the full lease (before)",
            Holding::After => "defaults: prefetch 4, ready lease 10 s (after)",
        }
    }

    fn config(self) -> ConsumerConfig {
        let config = ConsumerConfig::new("bench", LEASE)
            .concurrency(CONCURRENCY)
            .idle(Duration::from_millis(1), Duration::from_millis(20));
        match self {
            Holding::Before => config.prefetch(CONCURRENCY).ready_lease(LEASE),
            Holding::After => config,
        }
    }
}

/// One round's figures.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    /// Completions a second up to the kill.
    rate: f64,
    /// Most leases held at once while it ran (sampled).
    held_max: f64,
    /// Leases held at the kill.
    held_at_kill: f64,
    /// Of those, the ones with more than the default ready lease left
    /// (held on the full lease).
    full_at_kill: f64,
    /// Seconds until the last lease held at the kill expires.
    unavailable_max: f64,
    /// Task-seconds of unavailability the kill caused (the sum over held leases).
    task_seconds: f64,
}

/// Runs the comparison and prints it as a Markdown table.
pub(crate) async fn run(cfg: &Config, pool: &PgPool) -> Res<()> {
    let (n, rounds) = if cfg.mode == Mode::Quick {
        (400, 1)
    } else {
        (4_000, 3)
    };
    let mut out = String::from(
        "| work | consumer | processing (tasks/s) | ÷ before | leases held, max | held at the kill (on > 10 s + on ≤ 10 s) | unavailable after the kill, max | task-seconds unavailable |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for work in [Duration::ZERO, Duration::from_millis(5)] {
        let mut all: Vec<(Holding, Vec<Figures>)> = vec![(Holding::Before, vec![]), (Holding::After, vec![])];
        for round in 0..rounds {
            // Alternate which goes first.
            for k in 0..2 {
                let i = (k + round) % 2;
                let holding = all[i].0;
                eprintln!(
                    "[bench] holding: {} work {work:?}, round {}",
                    holding.name(),
                    round + 1
                );
                let figures = measure(cfg, pool, holding, n, work).await?;
                all[i].1.push(figures);
            }
        }
        let med = |figs: &[Figures], f: fn(&Figures) -> f64| median(&figs.iter().map(f).collect::<Vec<_>>());
        let before_rate = med(&all[0].1, |f| f.rate);
        for (holding, figs) in &all {
            let rate = med(figs, |f| f.rate);
            out.push_str(&format!(
                "| {} | {} | {:.0} | {:.2}× | {:.0} | {:.0} ({:.0} + {:.0}) | {:.1} s | {:.0} |\n",
                if work.is_zero() {
                    "no-op".to_owned()
                } else {
                    format!("{} ms", work.as_millis())
                },
                holding.name(),
                rate,
                rate / before_rate,
                med(figs, |f| f.held_max),
                med(figs, |f| f.held_at_kill),
                med(figs, |f| f.full_at_kill),
                med(figs, |f| f.held_at_kill - f.full_at_kill),
                med(figs, |f| f.unavailable_max),
                med(figs, |f| f.task_seconds),
            ));
        }
    }
    println!(
        "## What a consumer holds (concurrency {CONCURRENCY}, lease {} s, N = {n}, {rounds} round(s), medians)\n\n{out}",
        LEASE.as_secs()
    );
    Ok(())
}

async fn measure(cfg: &Config, main: &PgPool, holding: Holding, n: u64, work: Duration) -> Res<Figures> {
    let schema = BenchSchema::create(cfg, main).await?;
    let pool = crate::pool(cfg, u32::try_from(CONCURRENCY + 4)?, &[]).await?;
    let pg = PgStore::builder(pool.clone()).schema(schema.name()).build()?;
    let store: Arc<dyn TaskStore> = Arc::new(pg);
    for _ in 0..n {
        store
            .submit(new_task(&fresh_key("holding")).without_handoff())
            .await?;
    }
    let tasks = format!("{}.tasks", schema.q());
    let held_sql = format!(
        "SELECT count(*) FROM {tasks} WHERE status = 'running' AND lease_until > {}.store_clock()",
        schema.q()
    );
    let completed_sql = format!("SELECT count(*) FROM {tasks} WHERE status = 'completed'");

    let consumer = StoreQueue::new(store.clone()).consumer(holding.config())?;
    let start = Instant::now();
    let running = tokio::spawn(consumer.run(move |_ctx| async move {
        if !work.is_zero() {
            tokio::time::sleep(work).await;
        }
        Ok(Response::new(RESPONSE.to_vec()))
    }));
    let mut held_max = 0_i64;
    let done = loop {
        let held: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(held_sql.as_str()))
            .fetch_one(&pool)
            .await?;
        held_max = held_max.max(held);
        let done: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(completed_sql.as_str()))
            .fetch_one(&pool)
            .await?;
        if done as u64 >= n / 2 {
            break done;
        }
        if start.elapsed() > Duration::from_secs(120) {
            return Err(format!("{} completed only {done} of {n} in 120 s", holding.name()).into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let rate = done as f64 / start.elapsed().as_secs_f64();
    // The kill: the run dropped, nothing released, nothing renewed again.
    running.abort();
    let _ = running.await;
    let at_kill = format!(
        "SELECT count(*)::float8,
                count(*) FILTER (WHERE lease_until - s.now > interval '{ready} seconds')::float8,
                coalesce(extract(epoch FROM max(lease_until - s.now)), 0)::float8,
                coalesce(extract(epoch FROM sum(lease_until - s.now)), 0)::float8
         FROM {tasks}, (SELECT {q}.store_clock() AS now) AS s
         WHERE status = 'running' AND lease_until > s.now",
        ready = Holding::After.config().ready_lease.as_secs(),
        q = schema.q(),
    );
    let (held_at_kill, full_at_kill, unavailable_max, task_seconds): (f64, f64, f64, f64) =
        sqlx::query_as(sqlx::AssertSqlSafe(at_kill.as_str()))
            .fetch_one(&pool)
            .await?;
    pool.close().await;
    drop(schema);
    Ok(Figures {
        rate,
        held_max: held_max as f64,
        held_at_kill,
        full_at_kill,
        unavailable_max,
        task_seconds,
    })
}
