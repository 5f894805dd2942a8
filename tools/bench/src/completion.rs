//! Completion latency: the textbook locking transaction (BEGIN; SELECT … FOR
//! UPDATE; guarded UPDATE; COMMIT — four round trips) against ours (the
//! guarded UPDATE alone, one round trip), alternating call by call.
//!
//! The textbook's UPDATE is ours, verbatim (`PgStore::statements()["complete_current"]`,
//! what `PgStore::complete` runs for these current-assignment tasks),
//! so the two sides write exactly the same rows and differ only in the
//! transaction around it: the difference is the three extra round trips.

use std::time::Instant;

use sqlx::postgres::PgPool;
use taskfence::{Lease, PgStore, Response, TaskStore};

use crate::db::{BenchSchema, RESPONSE};
use crate::lifecycle::{fresh_key, new_task};
use crate::report::Report;
use crate::stats::{Samples, dratio, ms};
use crate::{Config, Res};

async fn lease(store: &PgStore) -> Res<Lease> {
    let task = store.submit(new_task(&fresh_key("c"))).await?.into_task();
    match store
        .claim(task.id, taskfence::ClaimRequest::new("w", crate::db::LEASE))
        .await?
    {
        taskfence::Claim::Acquired(lease) => Ok(lease),
        other => Err(format!("claim of a fresh task: {other:?}").into()),
    }
}

/// The textbook completion of `lease`, on a pooled connection.
pub(crate) async fn textbook(pool: &PgPool, select: &str, update: &str, lease: &Lease) -> Res<()> {
    let mut tx = pool.begin().await?;
    sqlx::query(sqlx::AssertSqlSafe(select))
        .bind(lease.task_id().as_uuid())
        .fetch_optional(&mut *tx)
        .await?
        .ok_or("textbook: no such task")?;
    sqlx::query(sqlx::AssertSqlSafe(update))
        .bind(lease.task_id().as_uuid())
        .bind(i64::try_from(lease.version())?)
        .bind(&RESPONSE[..])
        .bind(lease.attempt_id().as_uuid())
        .fetch_optional(&mut *tx)
        .await?
        .ok_or("textbook: completion refused")?;
    tx.commit().await?;
    Ok(())
}

pub(crate) async fn run(cfg: &Config, pool: &PgPool, report: &mut Report) -> Res<()> {
    report.section(
        "Completion latency: the textbook locking transaction vs ours",
        &format!(
            "Sequential completions of claimed tasks, one client, alternating textbook and ours call \
             by call ({} rounds × {} of each). Textbook: `BEGIN; SELECT id … FOR UPDATE; <our complete \
             statement>; COMMIT` (4 round trips). Ours: `PgStore::complete` (1 round trip). Both on \
             pooled connections. Measured with the server's `synchronous_commit` and again with \
             `synchronous_commit = off` for the session, which takes the WAL flush (the same one \
             commit on both sides) out and leaves the round trips. The last column is one bare round trip (`SELECT 1` on a \
             pooled connection) measured in the same loop: the textbook pays three more of them.",
            cfg.completion_rounds, cfg.completion_ops
        ),
    );
    let schema = BenchSchema::create(cfg, pool).await?;
    let select = format!("SELECT id FROM {}.tasks WHERE id = $1 FOR UPDATE", schema.q());
    let update = schema.statement("complete_current");
    let mut rows = Vec::new();
    for (label, session) in [
        ("server default (`on`)", &[][..]),
        ("`off` (session)", &[("synchronous_commit", "off")][..]),
    ] {
        let pool = crate::pool(cfg, 4, session).await?;
        let store = PgStore::builder(pool.clone()).schema(schema.name()).build()?;
        let (mut ours, mut book, mut rtt) = (Samples::default(), Samples::default(), Samples::default());
        // One unmeasured pair prepares the statements on the connections.
        for warm in [true, false] {
            let rounds = if warm { 1 } else { cfg.completion_rounds };
            let per_round = if warm { 4 } else { cfg.completion_ops };
            for _ in 0..rounds {
                let mut leases = Vec::with_capacity(2 * per_round);
                for _ in 0..2 * per_round {
                    leases.push(lease(&store).await?);
                }
                let mut leases = leases.into_iter();
                while let (Some(a), Some(b)) = (leases.next(), leases.next()) {
                    let t = Instant::now();
                    textbook(&pool, &select, &update, &b).await?;
                    let tb = t.elapsed();
                    let t = Instant::now();
                    store
                        .complete(a, Response::new(RESPONSE.to_vec()))
                        .await?
                        .into_result()
                        .map_err(|r| format!("complete rejected: {r}"))?;
                    let to = t.elapsed();
                    let t = Instant::now();
                    sqlx::query("SELECT 1").fetch_one(&pool).await?;
                    let tr = t.elapsed();
                    if !warm {
                        rtt.push(tr);
                        book.push(tb);
                        ours.push(to);
                    }
                }
            }
        }
        rows.push(vec![
            label.to_owned(),
            ms(book.p50()),
            ms(ours.p50()),
            dratio(book.p50(), ours.p50()),
            ms(book.p99()),
            ms(ours.p99()),
            dratio(book.p99(), ours.p99()),
            ms(rtt.p50()),
        ]);
        pool.close().await;
    }
    report.table(
        &[
            "synchronous_commit",
            "textbook p50 (ms)",
            "ours p50 (ms)",
            "textbook / ours p50",
            "textbook p99 (ms)",
            "ours p99 (ms)",
            "textbook / ours p99",
            "one round trip (`SELECT 1`) p50 (ms)",
        ],
        rows,
    );
    drop(schema);
    Ok(())
}
