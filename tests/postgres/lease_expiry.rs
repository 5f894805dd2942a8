//! Real lease expiry on the real server: random plans of several concurrent
//! workers with 300 ms leases, where real time passes (no clock offset). A
//! worker "works" for a random while, sometimes renewing, sometimes far past
//! its lease, sometimes crashing (dropping the lease); others take over.
//!
//! Exact agreement with a model is impossible here (real timing decides who
//! wins), so each case asserts the invariants instead:
//! - at most one completion is accepted per task, and the saved response is
//!   the accepted one, written by the task's last assignment;
//! - attempts never exceed the budget;
//! - a write sent after its lease expired (same machine: the server's clock is
//!   this clock) is rejected, never accepted;
//! - every task reaches a terminal state (bounded wait).

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use sqlx::PgPool;
use taskfence::testing::{Fixture, PgFixture};
use taskfence::{
    Claim, ClaimRequest, Failure, InputHash, NewTask, RequestKey, Response, RetryPolicy, Status, TaskId,
    TaskStore,
};
use time::OffsetDateTime;

const LEASE: Duration = Duration::from_millis(300);
const MAX_ATTEMPTS: u32 = 4;

/// What a worker does with a task it acquired.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    Complete,
    Fail,
    /// Drops the lease without a word (a crash).
    Crash,
}

/// One step of a worker's plan.
#[derive(Debug, Clone, Copy)]
struct Step {
    task: usize,
    /// How long the "provider call" takes: up to twice the lease.
    work: Duration,
    /// Renew every third of the lease while working.
    renew: bool,
    outcome: Outcome,
}

fn step(tasks: usize) -> impl Strategy<Value = Step> {
    (
        0..tasks,
        0u64..600,
        prop::bool::weighted(0.5),
        prop_oneof![6 => Just(Outcome::Complete), 2 => Just(Outcome::Fail), 1 => Just(Outcome::Crash)],
    )
        .prop_map(|(task, ms, renew, outcome)| Step {
            task,
            work: Duration::from_millis(ms),
            renew,
            outcome,
        })
}

fn plan() -> impl Strategy<Value = (usize, Vec<Vec<Step>>)> {
    (1usize..=3).prop_flat_map(|tasks| {
        (
            Just(tasks),
            prop::collection::vec(prop::collection::vec(step(tasks), 1..6), 2..=4),
        )
    })
}

/// What the workers saw, for the final checks.
#[derive(Debug, Default)]
struct Log {
    /// Accepted completions: task → (version, response).
    accepted: HashMap<TaskId, Vec<(u64, Response)>>,
    /// Writes sent after their lease's expiry that were accepted (must stay empty).
    late_accepted: Vec<(TaskId, u64, &'static str)>,
    /// Writes sent after their lease's expiry (rejected, as they must be).
    late_rejected: usize,
}

async fn work_once(store: &dyn TaskStore, ids: &[TaskId], worker: usize, s: Step, log: &Mutex<Log>) -> bool {
    let id = ids[s.task];
    let claim = store
        .claim(id, ClaimRequest::new(format!("worker-{worker}"), LEASE))
        .await
        .expect("claim");
    let mut lease = match claim {
        Claim::Acquired(lease) => lease,
        Claim::Busy { .. } | Claim::Backoff { .. } | Claim::Throttled(_) => return false,
        Claim::Completed(_) | Claim::Failed(_) | Claim::Cancelled(_) | Claim::NotFound => return true,
    };
    // "Call the provider", renewing on the way if the plan says so.
    let until = tokio::time::Instant::now() + s.work;
    while tokio::time::Instant::now() < until {
        let nap = (LEASE / 3).min(until - tokio::time::Instant::now());
        tokio::time::sleep(nap).await;
        if s.renew {
            let sent = OffsetDateTime::now_utc();
            let late = sent > lease.expires_at();
            let got = store.renew(&mut lease, LEASE).await.expect("renew");
            note(log, id, lease.version(), late, got.is_accepted(), "renew");
        }
    }
    let version = lease.version();
    let sent = OffsetDateTime::now_utc();
    let late = sent > lease.expires_at();
    match s.outcome {
        Outcome::Complete => {
            let answer = Response::from(format!("answer of worker {worker} at v{version}"));
            let got = store.complete(lease, answer.clone()).await.expect("complete");
            note(log, id, version, late, got.is_accepted(), "complete");
            if got.is_accepted() {
                log.lock()
                    .unwrap()
                    .accepted
                    .entry(id)
                    .or_default()
                    .push((version, answer));
            }
        }
        Outcome::Fail => {
            let got = store
                .fail(lease, Failure::retryable("provider 503"))
                .await
                .expect("fail");
            note(log, id, version, late, got.is_accepted(), "fail");
        }
        Outcome::Crash => drop(lease),
    }
    false
}

fn note(log: &Mutex<Log>, id: TaskId, version: u64, late: bool, accepted: bool, what: &'static str) {
    let mut log = log.lock().unwrap();
    match (late, accepted) {
        (true, true) => log.late_accepted.push((id, version, what)),
        (true, false) => log.late_rejected += 1,
        _ => {}
    }
}

async fn run_case(url: &str, pool: &PgPool, tasks: usize, plans: Vec<Vec<Step>>) {
    let fixture = PgFixture::on_pool(url, pool.clone()).await;
    let store: Arc<dyn TaskStore> = fixture.store();
    let policy = RetryPolicy::default()
        .max_attempts(MAX_ATTEMPTS)
        .initial_backoff(Duration::from_millis(50))
        .max_backoff(Duration::from_millis(200));
    let mut ids = Vec::new();
    for t in 0..tasks {
        let new = NewTask::new(
            RequestKey::new("lease-expiry", "chat.reply", format!("req-{t}")),
            InputHash::of([format!("{t}")]),
        )
        .policy(policy);
        ids.push(store.submit(new).await.expect("submit").into_task().id);
    }
    let ids = Arc::new(ids);
    let log = Arc::new(Mutex::new(Log::default()));
    // Every task is in some worker's plan (else nobody would ever finish it).
    let mut plans = plans;
    for task in 0..tasks {
        if !plans.iter().flatten().any(|s| s.task == task) {
            plans[0].push(Step {
                task,
                work: Duration::ZERO,
                renew: false,
                outcome: Outcome::Complete,
            });
        }
    }

    // Each worker cycles through its plan until every task is terminal (bounded).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let handles: Vec<_> = plans
        .into_iter()
        .enumerate()
        .map(|(worker, plan)| {
            let (store, ids, log) = (store.clone(), ids.clone(), log.clone());
            tokio::spawn(async move {
                // Only the tasks of this worker's plan: it stops when they are all terminal.
                let mut done: Vec<bool> = (0..ids.len())
                    .map(|t| !plan.iter().any(|s| s.task == t))
                    .collect();
                for s in plan.iter().cycle() {
                    if done.iter().all(|d| *d) || tokio::time::Instant::now() > deadline {
                        break;
                    }
                    if !done[s.task] {
                        done[s.task] = work_once(&*store, &ids, worker, *s, &log).await;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("worker panicked");
    }

    let log = std::mem::take(&mut *log.lock().unwrap());
    assert!(
        log.late_accepted.is_empty(),
        "writes sent after the lease expired were accepted: {:?}",
        log.late_accepted
    );
    for id in ids.iter() {
        let task = store.get(*id).await.expect("get").expect("task exists");
        assert!(
            task.status.is_terminal(),
            "{id} not terminal within 30 s: {task:?}"
        );
        assert!(task.attempts() <= MAX_ATTEMPTS, "{id}: attempts over budget");
        let attempts = store.attempts(*id).await.expect("attempts");
        assert!(
            attempts.len() <= MAX_ATTEMPTS as usize,
            "{id}: {} attempt rows",
            attempts.len()
        );
        let accepted = log.accepted.get(id).map_or(&[][..], Vec::as_slice);
        assert!(
            accepted.len() <= 1,
            "{id}: {} completions accepted",
            accepted.len()
        );
        match (task.status, accepted.first()) {
            (Status::Completed, Some((version, answer))) => {
                assert_eq!(
                    task.response.as_ref(),
                    Some(answer),
                    "{id}: the saved response is the accepted one"
                );
                assert_eq!(task.version, *version, "{id}: saved by the last assignment");
            }
            (Status::Completed, None) => panic!("{id}: completed without an accepted completion"),
            (_, Some(_)) => panic!(
                "{id}: a completion was accepted but the task is {:?}",
                task.status
            ),
            (_, None) => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn real_leases_expire_and_fence(plan in plan()) {
        let (tasks, plans) = plan;
        let (url, pool) = common::shared_pool(8); // outside block_on: its first use connects on the shared runtime
        common::shared_runtime().block_on(run_case(url, pool, tasks, plans));
    }
}

/// A worker that sleeps far past its lease while another takes over: the
/// late completion is rejected and the taker's response is the one saved.
#[test]
fn a_worker_paused_past_its_lease_is_fenced_off() {
    let slow = Step {
        task: 0,
        work: LEASE * 2,
        renew: false,
        outcome: Outcome::Complete,
    };
    let quick = Step {
        task: 0,
        work: Duration::ZERO,
        renew: false,
        outcome: Outcome::Complete,
    };
    let (url, pool) = common::shared_pool(8);
    common::shared_runtime().block_on(async {
        let fixture = PgFixture::on_pool(url, pool.clone()).await;
        let store = fixture.store();
        let id = store
            .submit(NewTask::new(
                RequestKey::new("lease-expiry", "chat.reply", "pause"),
                InputHash::of(["p"]),
            ))
            .await
            .expect("submit")
            .into_task()
            .id;
        let log = Mutex::new(Log::default());
        let ids = [id];
        // The slow worker claims first, then the quick one waits for its lease to lapse.
        let slow_run = work_once(&*store, &ids, 0, slow, &log);
        let quick_run = async {
            common::eventually(Duration::from_secs(5), || async {
                let t = store.get(id).await.expect("get").expect("task");
                (t.version == 1).then_some(())
            })
            .await;
            loop {
                if work_once(&*store, &ids, 1, quick, &log).await
                    || log.lock().unwrap().accepted.contains_key(&id)
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::join!(slow_run, quick_run);
        let log = std::mem::take(&mut *log.lock().unwrap());
        assert!(log.late_accepted.is_empty(), "{:?}", log.late_accepted);
        assert!(
            log.late_rejected >= 1,
            "the slow worker's late completion was sent and rejected"
        );
        let task = store.get(id).await.expect("get").expect("task");
        assert_eq!(task.version, 2);
        assert_eq!(task.response, Some(Response::from("answer of worker 1 at v2")));
        assert_eq!(
            store.attempts(id).await.expect("attempts").len(),
            2,
            "two attempts"
        );
        assert_eq!(
            (fixture.count("tasks").await, fixture.count("handoffs").await),
            (1, 1),
            "one task, one handoff"
        );
    });
}
