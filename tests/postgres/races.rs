//! 32 concurrent racers on the real server, each on its own connection:
//! one task per key, one acquired claim, one accepted completion.

use crate::common;

use std::time::Duration;

use taskfence::store::AttemptOutcome;
use taskfence::testing::race;
use taskfence::{Claim, ClaimRequest, Fenced, Rejection, Response, Status, TaskStore};

const RACERS: usize = 32;

use common::{acquire, new_task, one_winner};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_duplicate_submits_make_one_task() {
    let f = common::fixture_with(RACERS as u32).await;
    let store = f.pg_store().clone();
    let results = race(RACERS, |_| {
        let store = store.clone();
        async move { store.submit(new_task("pressed-send-once")).await.expect("submit") }
    })
    .await;
    assert_eq!(
        results.iter().filter(|s| s.is_created()).count(),
        1,
        "one creates"
    );
    let id = results[0].task().id;
    assert!(
        results.iter().all(|s| s.task().id == id),
        "all 32 see the same task"
    );
    assert_eq!(
        (f.count("tasks").await, f.count("handoffs").await),
        (1, 1),
        "one row each"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_claims_acquire_once() {
    let f = common::fixture_with(RACERS as u32).await;
    let store = f.pg_store().clone();
    let task = store.submit(new_task("k")).await.unwrap().into_task();
    let claims = race(RACERS, |i| {
        let store = store.clone();
        async move {
            store
                .claim(
                    task.id,
                    ClaimRequest::new(format!("worker-{i}"), Duration::from_secs(30)),
                )
                .await
                .expect("claim")
        }
    })
    .await;
    one_winner(&claims, "racing claims (one Acquired)");
    assert!(
        claims
            .iter()
            .all(|c| matches!(c, Claim::Acquired(_) | Claim::Busy { .. })),
        "the rest are Busy: {claims:?}"
    );
    let now = store.get(task.id).await.unwrap().unwrap();
    assert_eq!((now.status, now.version), (Status::Running, 1));
    assert_eq!(store.attempts(task.id).await.unwrap().len(), 1, "one attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_completes_with_the_same_lease_accept_once() {
    let f = common::fixture_with(RACERS as u32).await;
    let store = f.pg_store().clone();
    let task = store.submit(new_task("k")).await.unwrap().into_task();
    let lease = acquire(&store, task.id, "w").await;
    let results = race(RACERS, |i| {
        let (store, lease) = (store.clone(), lease.clone());
        async move {
            let r = store
                .complete(lease, Response::from(format!("answer {i}")))
                .await
                .expect("complete");
            (i, r)
        }
    })
    .await;
    let winner = one_winner(&results, "racing completions (one Accepted)");
    let saved = Response::from(format!("answer {}", results[winner].0));
    for (_, r) in &results {
        if let Fenced::Rejected(rejection) = r {
            assert!(
                matches!(rejection, Rejection::AlreadyCompleted(t) if t.response.as_ref() == Some(&saved)),
                "losers see the winner's answer: {rejection:?}"
            );
        }
    }
    let done = store.get(task.id).await.unwrap().unwrap();
    assert_eq!((done.status, done.response), (Status::Completed, Some(saved)));
    let attempts = store.attempts(task.id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].outcome, AttemptOutcome::Completed);
}

/// A queue drained by 32 `claim_next` callers through a pool of two
/// connections (each caller waits for a connection, then skips the rows the
/// other holds): every task is handed out once, none is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_claim_next_callers_on_two_connections_take_each_task_once() {
    const TASKS: usize = 300;
    let f = common::fixture_with(2).await;
    let store = f.pg_store().clone();
    let mut submitted = std::collections::HashSet::new();
    for i in 0..TASKS {
        submitted.insert(
            store
                .submit(new_task(&format!("q-{i}")))
                .await
                .unwrap()
                .into_task()
                .id,
        );
    }
    let taken = race(RACERS, |i| {
        let store = store.clone();
        async move {
            let mut mine = Vec::new();
            loop {
                let next = taskfence::ClaimNext::new(format!("worker-{i}"), Duration::from_secs(30), 5);
                let leases = store.claim_next(next).await.expect("claim_next");
                if leases.is_empty() {
                    return mine;
                }
                mine.extend(leases.iter().map(|l| l.task_id()));
            }
        }
    })
    .await;
    let handed: Vec<_> = taken.into_iter().flatten().collect();
    let distinct: std::collections::HashSet<_> = handed.iter().copied().collect();
    assert_eq!(handed.len(), TASKS, "each task handed out once");
    assert_eq!(distinct, submitted, "every task handed out");
    assert_eq!(f.count("attempts").await, 0, "no attempt was replaced");
}
