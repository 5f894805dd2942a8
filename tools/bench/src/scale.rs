//! Cost as the table grows: submit, claim and complete latency, `due` and
//! `purge_expired`, and the planner's cost of each hot statement, with
//! 10^4, 10^5, 10^6 (10^7 in `--long`) existing tasks.
//!
//! All sizes are loaded first and then measured interleaved (round by round,
//! size by size), so a burst of load on the machine hits every size alike.

use std::time::Instant;

use sqlx::Row;
use sqlx::postgres::PgPool;
use taskfence::{Claim, ClaimRequest, Response, TaskStore};
use uuid::Uuid;

use crate::db::{BenchSchema, LEASE, RESPONSE};
use crate::lifecycle::{fresh_key, new_task};
use crate::report::Report;
use crate::stats::{Samples, count, dratio, ms};
use crate::{Config, Res};

#[derive(Default)]
struct Figures {
    submit: Samples,
    claim: Samples,
    complete: Samples,
    due: Samples,
    purge: Samples,
    purged: u64,
    load_secs: f64,
    costs: Vec<(&'static str, f64)>,
}

pub(crate) async fn run(cfg: &Config, pool: &PgPool, report: &mut Report) -> Res<()> {
    let mut schemas = Vec::new();
    let mut figures: Vec<Figures> = Vec::new();
    for &n in &cfg.sizes {
        let schema = BenchSchema::create(cfg, pool).await?;
        let t = Instant::now();
        schema.fill(n).await?;
        let mut f = Figures {
            load_secs: t.elapsed().as_secs_f64(),
            ..Figures::default()
        };
        eprintln!("[bench]   loaded {n} rows in {:.1} s", f.load_secs);
        let pending: Uuid = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM {}.tasks WHERE status = 'pending' LIMIT 1",
            schema.q()
        )))
        .fetch_one(pool)
        .await?
        .try_get(0)?;
        // `claim_fresh` and `complete_current`: what `PgStore::claim` and
        // `PgStore::complete` run for these never-claimed, current-assignment tasks.
        for (label, name) in [
            ("claim", "claim_fresh"),
            ("complete", "complete_current"),
            ("due", "due"),
            ("purge_expired", "purge_expired"),
        ] {
            f.costs.push((label, schema.plan_cost(name, pending).await?));
        }
        schemas.push(schema);
        figures.push(f);
    }
    // One unmeasured lifecycle per size prepares the statements.
    for (round, measured) in std::iter::once(false)
        .chain(std::iter::repeat_n(true, cfg.scale_rounds))
        .enumerate()
    {
        for k in 0..schemas.len() {
            let i = (k + round) % schemas.len();
            let store = &schemas[i].store;
            let f = &mut figures[i];
            let ops = if measured { cfg.scale_ops } else { 2 };
            for _ in 0..ops {
                let t = Instant::now();
                let task = store.submit(new_task(&fresh_key("s"))).await?.into_task();
                let submit = t.elapsed();
                let t = Instant::now();
                let lease = match store.claim(task.id, ClaimRequest::new("w", LEASE)).await? {
                    Claim::Acquired(lease) => lease,
                    other => return Err(format!("claim of a fresh task: {other:?}").into()),
                };
                let claim = t.elapsed();
                let t = Instant::now();
                store
                    .complete(lease, Response::new(RESPONSE.to_vec()))
                    .await?
                    .into_result()
                    .map_err(|r| format!("complete rejected: {r}"))?;
                let complete = t.elapsed();
                if measured {
                    f.submit.push(submit);
                    f.claim.push(claim);
                    f.complete.push(complete);
                }
            }
            for _ in 0..5 {
                let t = Instant::now();
                store.due(100).await?;
                if measured {
                    f.due.push(t.elapsed());
                }
            }
        }
    }
    for _ in 0..cfg.purge_calls {
        for (schema, f) in schemas.iter().zip(figures.iter_mut()) {
            let t = Instant::now();
            f.purged += schema.store.purge_expired(100).await?;
            f.purge.push(t.elapsed());
        }
    }

    report.section(
        "Latency as the table grows",
        &format!(
            "Each size is its own schema, bulk-loaded with one `INSERT … SELECT generate_series` per \
             table (70 % completed, 10 % of all rows past retention, 10 % pending, 10 % running, 10 % \
             failed; each task's one attempt in its row, one handoff per task; 64-byte payloads, 256-byte responses), then \
             `ANALYZE`d. Then {} rounds × {} lifecycles per size, sizes interleaved round by round; \
             `due(100)` 5 times per size per round; `purge_expired(100)` {} times per size at the end. \
             One client, sequential calls through the pool. Ratios are to the smallest size.",
            cfg.scale_rounds, cfg.scale_ops, cfg.purge_calls
        ),
    );
    let base = &figures[0];
    let mut rows = Vec::new();
    for (n, f) in cfg.sizes.iter().zip(&figures) {
        for (op, s, b) in [
            ("submit", &f.submit, &base.submit),
            ("claim", &f.claim, &base.claim),
            ("complete", &f.complete, &base.complete),
            ("due(100)", &f.due, &base.due),
            ("purge_expired(100)", &f.purge, &base.purge),
        ] {
            rows.push(vec![
                count(*n),
                op.to_owned(),
                s.len().to_string(),
                ms(s.p50()),
                ms(s.p99()),
                dratio(s.p50(), b.p50()),
                dratio(s.p99(), b.p99()),
            ]);
        }
    }
    report.table(
        &[
            "existing tasks",
            "operation",
            "calls",
            "p50 (ms)",
            "p99 (ms)",
            "p50 / smallest",
            "p99 / smallest",
        ],
        rows,
    );
    let mut rows = Vec::new();
    for (n, f) in cfg.sizes.iter().zip(&figures) {
        let mut row = vec![count(*n), format!("{:.1}", f.load_secs), f.purged.to_string()];
        row.extend(f.costs.iter().map(|(_, c)| format!("{c:.2}")));
        rows.push(row);
    }
    report.note(
        "Planner cost (`EXPLAIN`, total cost of the root node) of the hot statements at each size; \
         `jit_above_cost` is 100 000, so none of them is JIT-compiled. Load time is the bulk insert of \
         both tables plus `ANALYZE`.",
    );
    report.table(
        &[
            "existing tasks",
            "load (s)",
            "rows purged",
            "cost: claim",
            "cost: complete",
            "cost: due",
            "cost: purge_expired",
        ],
        rows,
    );
    drop(schemas);
    Ok(())
}
