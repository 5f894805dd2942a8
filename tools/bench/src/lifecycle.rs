//! Lifecycle throughput: submit + claim + complete per task, N concurrent
//! workers, ours against the raw-SQL ceiling, alternating in the same run.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgPool;
use taskfence::{Claim, ClaimRequest, NewTask, RequestKey, Response, TaskStore};

use crate::db::{self, BenchSchema, LEASE, PAYLOAD, RESPONSE, Raw};
use crate::report::Report;
use crate::stats::{median, ratio};
use crate::{Config, Res};

static KEYS: AtomicU64 = AtomicU64::new(0);

/// A request key never used before in this process.
pub(crate) fn fresh_key(prefix: &str) -> String {
    format!("{prefix}-{}", KEYS.fetch_add(1, Ordering::Relaxed))
}

/// The task every benchmark submits for `key`.
pub(crate) fn new_task(key: &str) -> NewTask {
    NewTask::new(RequestKey::new("user-1", "chat.reply", key), db::input_hash(key)).payload(PAYLOAD.to_vec())
}

/// Ours: submit, claim, complete through the `TaskStore` trait, checking each answer.
pub(crate) async fn ours(store: &dyn TaskStore, key: &str) -> Res<()> {
    let submitted = store.submit(new_task(key)).await?;
    if !submitted.is_created() {
        return Err(format!("submit of a fresh key {key} found an existing task").into());
    }
    let lease = match store
        .claim(submitted.task().id, ClaimRequest::new("w", LEASE))
        .await?
    {
        Claim::Acquired(lease) => lease,
        other => return Err(format!("claim of a fresh task: {other:?}").into()),
    };
    store
        .complete(lease, Response::new(RESPONSE.to_vec()))
        .await?
        .into_result()
        .map_err(|r| format!("complete rejected: {r}"))?;
    Ok(())
}

/// Runs `workers` loops of `step` for `secs`; returns completed steps per second.
pub(crate) async fn burst<F, Fut>(workers: usize, secs: f64, step: F) -> Res<f64>
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Res<()>> + Send + 'static,
{
    let step = Arc::new(step);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let step = step.clone();
            tokio::spawn(async move {
                let mut done = 0u64;
                while Instant::now() < deadline {
                    step(fresh_key("k")).await?;
                    done += 1;
                }
                Res::Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h.await??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Side {
    Ours,
    Ceiling,
}

async fn side(
    side: Side,
    workers: usize,
    secs: f64,
    store: &Arc<dyn TaskStore>,
    raw: &Arc<Raw>,
    pool: &PgPool,
) -> Res<f64> {
    match side {
        Side::Ours => {
            let store = store.clone();
            burst(workers, secs, move |key| {
                let store = store.clone();
                async move { ours(&*store, &key).await }
            })
            .await
        }
        Side::Ceiling => {
            let (raw, pool) = (raw.clone(), pool.clone());
            burst(workers, secs, move |key| {
                let (raw, pool) = (raw.clone(), pool.clone());
                async move { raw.lifecycle(&pool, &key).await }
            })
            .await
        }
    }
}

pub(crate) async fn run(cfg: &Config, pool: &PgPool, report: &mut Report) -> Res<()> {
    let schema = BenchSchema::create(cfg, pool).await?;
    let store: Arc<dyn TaskStore> = Arc::new(schema.store.clone());
    let raw = Arc::new(Raw::new(&schema));
    let most = cfg.workers.iter().copied().max().unwrap_or(1);
    // Warm-up: every pooled connection prepares every statement once.
    for s in [Side::Ours, Side::Ceiling] {
        side(s, most, cfg.lifecycle_secs.min(1.0), &store, &raw, pool).await?;
    }
    let mut rates: BTreeMap<(usize, Side), Vec<f64>> = BTreeMap::new();
    let mut ratios: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for round in 0..cfg.lifecycle_rounds {
        for (i, &workers) in cfg.workers.iter().enumerate() {
            // Alternate which side goes first, so drift in the machine's load
            // does not favour one side.
            let order = if (round + i) % 2 == 0 {
                [Side::Ours, Side::Ceiling]
            } else {
                [Side::Ceiling, Side::Ours]
            };
            let mut pair = BTreeMap::new();
            for s in order {
                let rate = side(s, workers, cfg.lifecycle_secs, &store, &raw, pool).await?;
                rates.entry((workers, s)).or_default().push(rate);
                pair.insert(s, rate);
            }
            ratios
                .entry(workers)
                .or_default()
                .push(pair[&Side::Ours] / pair[&Side::Ceiling]);
        }
    }
    report.section(
        "Lifecycle throughput: ours vs the raw-SQL ceiling",
        &format!(
            "Tasks per second, each worker looping submit → claim → complete on a fresh key. \
             Ours: `PgStore` through the `TaskStore` trait (the task row, which holds its latest attempt, and a handoff row). \
             Ceiling: the same `tasks` table shape with the same indexes, three hand-written \
             autocommit statements (INSERT … ON CONFLICT DO NOTHING RETURNING; fenced UPDATE … \
             RETURNING; guarded UPDATE … RETURNING), same pool, same durability. {} rounds of {} s \
             per side, alternating; medians. The ratio is the median of the per-round ratios.",
            cfg.lifecycle_rounds, cfg.lifecycle_secs
        ),
    );
    let mut rows = Vec::new();
    for &workers in &cfg.workers {
        let o = median(&rates[&(workers, Side::Ours)]);
        let c = median(&rates[&(workers, Side::Ceiling)]);
        let r = median(&ratios[&workers]);
        rows.push(vec![
            workers.to_string(),
            format!("{o:.0}"),
            format!("{c:.0}"),
            format!("{:.0} %", r * 100.0),
            ratio(o, c),
        ]);
    }
    report.table(
        &[
            "workers",
            "ours (tasks/s)",
            "ceiling (tasks/s)",
            "ours / ceiling (median of rounds)",
            "ratio of medians",
        ],
        rows,
    );
    drop(schema);
    Ok(())
}
