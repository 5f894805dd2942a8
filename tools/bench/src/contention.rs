//! 32 workers claim the same task at once: exactly one wins, the others are
//! told `Busy`; how long the losers wait.
//!
//! Two claims race, round by round in alternating order:
//! - ours: `PgStore::claim` (a loser's first-claim statement writes nothing
//!   after the wait, then a read answers it `Busy`);
//! - the ceiling's bare `UPDATE … WHERE id = $1 AND (claimable) RETURNING`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgPool;
use taskfence::{Claim, ClaimRequest, PgStore, Response, TaskStore};

use crate::db::{BenchSchema, LEASE, RESPONSE, Raw};
use crate::lifecycle::{fresh_key, new_task};
use crate::report::Report;
use crate::stats::{Samples, ms};
use crate::{Config, Res};

const RACERS: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contender {
    Ours,
    Ceiling,
}

impl Contender {
    fn label(self) -> &'static str {
        match self {
            Self::Ours => "ours (`PgStore::claim`)",
            Self::Ceiling => "ceiling (bare `UPDATE … RETURNING`)",
        }
    }
}

/// What a racer saw: how long its claim took and whether it won (with the
/// version it won, to complete the task afterwards).
type Outcome = (Duration, Option<i64>, Option<taskfence::Lease>);

struct Race {
    store: PgStore,
    raw: Arc<Raw>,
    pool: PgPool,
}

impl Race {
    async fn round(&self, who: Contender) -> Res<Vec<Outcome>> {
        let (id, task_id) = match who {
            Contender::Ceiling => (self.raw.submit(&self.pool, &fresh_key("race")).await?, None),
            _ => {
                let task = self.store.submit(new_task(&fresh_key("race"))).await?.into_task();
                (task.id.as_uuid(), Some(task.id))
            }
        };
        let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
        let racers: Vec<_> = (0..RACERS)
            .map(|i| {
                let barrier = barrier.clone();
                let (store, raw, pool) = (self.store.clone(), self.raw.clone(), self.pool.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let t = Instant::now();
                    let won: Outcome = match who {
                        Contender::Ours => {
                            let task_id = task_id.expect("ours has a TaskId");
                            match store
                                .claim(task_id, ClaimRequest::new(format!("w{i}"), LEASE))
                                .await?
                            {
                                Claim::Acquired(lease) => (t.elapsed(), Some(0), Some(lease)),
                                Claim::Busy { .. } => (t.elapsed(), None, None),
                                other => return Err(format!("a loser was told {other:?}, not Busy").into()),
                            }
                        }
                        Contender::Ceiling => {
                            let version = raw.try_claim(&pool, id).await?;
                            (t.elapsed(), version, None)
                        }
                    };
                    Res::Ok(won)
                })
            })
            .collect();
        let mut outcomes = Vec::with_capacity(RACERS);
        for r in racers {
            outcomes.push(r.await??);
        }
        let won = outcomes.iter().filter(|(_, v, _)| v.is_some()).count();
        if won != 1 {
            return Err(format!("{}: {won} of {RACERS} racers acquired the same task", who.label()).into());
        }
        // Complete the winner's task, so each round leaves a finished task.
        for (_, version, lease) in &mut outcomes {
            match (who, *version, lease.take()) {
                (Contender::Ours, Some(_), Some(lease)) => {
                    self.store
                        .complete(lease, Response::new(RESPONSE.to_vec()))
                        .await?
                        .into_result()
                        .map_err(|r| format!("winner's completion rejected: {r}"))?;
                }
                (Contender::Ceiling, Some(v), _) => self.raw.complete(&self.pool, id, v).await?,
                _ => {}
            }
        }
        Ok(outcomes)
    }
}

pub(crate) async fn run(cfg: &Config, pool: &PgPool, report: &mut Report) -> Res<()> {
    let schema = BenchSchema::create(cfg, pool).await?;
    let race = Race {
        store: schema.store.clone(),
        raw: Arc::new(Raw::new(&schema)),
        pool: pool.clone(),
    };
    let all = [Contender::Ours, Contender::Ceiling];
    let mut figures: Vec<(Samples, Samples)> = vec![Default::default(); all.len()];
    // Round 0 is a warm-up (statements prepared on every connection).
    for round in 0..=cfg.contention_rounds {
        for k in 0..all.len() {
            let i = (k + round) % all.len();
            let outcomes = race.round(all[i]).await?;
            if round == 0 {
                continue;
            }
            for (took, won, _) in outcomes {
                if won.is_some() {
                    figures[i].0.push(took);
                } else {
                    figures[i].1.push(took);
                }
            }
        }
    }
    report.section(
        "32 workers racing for one task",
        &format!(
            "{} rounds per claim statement, alternating: a fresh task, 32 tasks released together by a \
             barrier each claim it on their own pooled connection. Every round had exactly one \
             winner (checked, or the run fails); every loser was answered `Busy` (ours) or got no \
             row. Latency from the barrier to the answer (for ours, including the read that \
             answers a loser once its first-claim statement wrote nothing).",
            cfg.contention_rounds
        ),
    );
    let mut rows = Vec::new();
    for (who, (winners, losers)) in all.iter().zip(&figures) {
        for (role, s) in [("winner", winners), ("losers", losers)] {
            rows.push(vec![
                who.label().to_owned(),
                role.to_owned(),
                s.len().to_string(),
                ms(s.p50()),
                ms(s.p99()),
                ms(s.max()),
            ]);
        }
    }
    report.table(
        &[
            "claim statement",
            "",
            "claims",
            "p50 (ms)",
            "p99 (ms)",
            "max (ms)",
        ],
        rows,
    );
    drop(schema);
    Ok(())
}
