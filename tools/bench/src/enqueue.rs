//! Bulk enqueue: `submit` one task at a time against `submit_many` in
//! batches of 100, the same fresh keys on both sides, one client. Rounds
//! alternate the two; the medians are reported.

use std::time::Instant;

use sqlx::postgres::PgPool;
use taskfence::{NewTask, PgStore, TaskStore};

use crate::db::BenchSchema;
use crate::lifecycle::{fresh_key, new_task};
use crate::report::Report;
use crate::stats::{median, ratio};
use crate::{Config, Res};

/// Submissions per `submit_many` call.
const BATCH: usize = 100;

fn tasks(n: usize) -> Vec<NewTask> {
    (0..n).map(|_| new_task(&fresh_key("enqueue"))).collect()
}

/// Tasks per second submitting `n` new tasks one by one.
async fn one_by_one(store: &PgStore, n: usize) -> Res<f64> {
    let batch = tasks(n);
    let started = Instant::now();
    for task in batch {
        if !store.submit(task).await?.is_created() {
            return Err("submit of a fresh key found an existing task".into());
        }
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Tasks per second submitting `n` new tasks in batches of [`BATCH`].
async fn batched(store: &PgStore, n: usize) -> Res<f64> {
    let all = tasks(n);
    let started = Instant::now();
    for chunk in all.chunks(BATCH) {
        for answer in store.submit_many(chunk.to_vec()).await? {
            if !answer?.is_created() {
                return Err("submit_many of a fresh key found an existing task".into());
            }
        }
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

pub(crate) async fn run(cfg: &Config, pool: &PgPool, report: &mut Report) -> Res<()> {
    let (rounds, n) = if cfg.mode == crate::Mode::Quick {
        (1, 2 * BATCH)
    } else {
        (5, 20 * BATCH)
    };
    report.section(
        "Bulk enqueue: submit vs submit_many",
        &format!(
            "New tasks submitted by one client, {n} per side per round, {rounds} rounds alternating the \
             two sides; medians. One by one: `PgStore::submit` per task (one round trip each). \
             Batched: `PgStore::submit_many` with {BATCH} tasks per call (one statement per call), \
             each task deduplicated and answered on its own."
        ),
    );
    let schema = BenchSchema::create(cfg, pool).await?;
    let store = PgStore::builder(pool.clone()).schema(schema.name()).build()?;
    // One unmeasured call of each prepares the statements.
    one_by_one(&store, 4).await?;
    batched(&store, 4).await?;
    let (mut single, mut many) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        single.push(one_by_one(&store, n).await?);
        many.push(batched(&store, n).await?);
    }
    let (single, many) = (median(&single), median(&many));
    report.table(
        &[
            "one by one (tasks/s)",
            &format!("batches of {BATCH} (tasks/s)"),
            "batched / one by one",
        ],
        vec![vec![
            format!("{single:.0}"),
            format!("{many:.0}"),
            ratio(many, single),
        ]],
    );
    drop(schema);
    Ok(())
}
