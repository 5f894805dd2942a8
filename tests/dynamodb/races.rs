//! Races on one table from two clients (two replicas of a service, each with
//! its own connection pool): 32 racing claims acquire once, 32 racing
//! completions save once, under both acceptance rules.

use std::time::Duration;

use taskfence::policy::AcceptanceRule;
use taskfence::store::AttemptOutcome;
use taskfence::testing::{Fixture, new_task, one_winner, race};
use taskfence::{Claim, ClaimRequest, Fenced, Rejection, Response, TaskStore};
use taskfence_test_support::dynamo;

const RACERS: usize = 32;
const LEASE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claims_from_two_clients_acquire_once() {
    let f = dynamo::fixture().await;
    let stores = [
        f.store(),
        std::sync::Arc::new(dynamo::replica(&f, f.clock().clone())) as _,
    ];
    let task = stores[0].submit(new_task("send-1")).await.unwrap().into_task();
    let claims = race(RACERS, |i| {
        let store: std::sync::Arc<dyn TaskStore> = stores[i % 2].clone();
        async move {
            store
                .claim(task.id, ClaimRequest::new(format!("w{i}"), LEASE))
                .await
                .expect("claim")
        }
    })
    .await;
    one_winner(&claims, &format!("{RACERS} racing claims"));
    assert!(
        claims
            .iter()
            .all(|c| c.is_acquired() || matches!(c, Claim::Busy { .. })),
        "the others are told to wait"
    );
    let stored = stores[1].get(task.id).await.unwrap().unwrap();
    assert_eq!(stored.version, 1, "one assignment");
    assert_eq!(stores[1].attempts(task.id).await.unwrap().len(), 1, "one attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_completions_from_two_clients_save_once() {
    let f = dynamo::fixture().await;
    let stores = [
        f.store(),
        std::sync::Arc::new(dynamo::replica(&f, f.clock().clone())) as _,
    ];
    for rule in [
        AcceptanceRule::CurrentAssignment,
        AcceptanceRule::FirstValidAnswer,
    ] {
        let key = format!("send-{}", rule.as_str());
        let task = stores[0]
            .submit(new_task(&key).acceptance(rule))
            .await
            .unwrap()
            .into_task();
        // Under FirstValidAnswer three attempts hold leases (two taken over);
        // under CurrentAssignment one lease is completed by duplicates of its worker.
        let mut leases = Vec::new();
        let holders = if rule == AcceptanceRule::FirstValidAnswer {
            3
        } else {
            1
        };
        for h in 0..holders {
            let Claim::Acquired(lease) = stores[h % 2]
                .claim(task.id, ClaimRequest::new(format!("holder-{h}"), LEASE))
                .await
                .unwrap()
            else {
                panic!("the lease is free")
            };
            leases.push(lease);
            if h + 1 < holders {
                f.advance(LEASE + Duration::from_secs(1)).await;
            }
        }
        let results = race(RACERS, |i| {
            let store: std::sync::Arc<dyn TaskStore> = stores[i % 2].clone();
            let lease = leases[i % leases.len()].clone();
            async move {
                let saved = store
                    .complete(lease, Response::from(format!("answer {i}")))
                    .await
                    .expect("complete");
                (i, saved)
            }
        })
        .await;
        let winner = one_winner(&results, &format!("{rule:?}: {RACERS} racing completions"));
        let expected = Response::from(format!("answer {}", results[winner].0));
        for (_, r) in &results {
            if let Fenced::Rejected(rejection) = r {
                assert!(
                    matches!(rejection, Rejection::AlreadyCompleted(t) if t.response.as_ref() == Some(&expected)),
                    "{rule:?}: losers see the winner's response: {rejection:?}"
                );
            }
        }
        assert_eq!(
            stores[1].get(task.id).await.unwrap().unwrap().response,
            Some(expected)
        );
        let completed = stores[0]
            .attempts(task.id)
            .await
            .unwrap()
            .iter()
            .filter(|a| a.outcome == AttemptOutcome::Completed)
            .count();
        assert_eq!(completed, 1, "{rule:?}: one attempt is the one saved");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_reopens_from_two_clients_accept_once() {
    let f = dynamo::fixture().await;
    let stores = [
        f.store(),
        std::sync::Arc::new(dynamo::replica(&f, f.clock().clone())) as _,
    ];
    let task = stores[0].submit(new_task("send-1")).await.unwrap().into_task();
    assert!(stores[0].cancel(task.id, "stop").await.unwrap().is_accepted());
    let answers = race(RACERS, |i| {
        let store: std::sync::Arc<dyn TaskStore> = stores[i % 2].clone();
        async move {
            store
                .reopen(
                    task.id,
                    taskfence::store::ReopenRequest::new(format!("ops-{i}"), "again"),
                )
                .await
                .expect("reopen")
        }
    })
    .await;
    one_winner(&answers, &format!("{RACERS} racing reopens"));
    assert!(
        answers
            .iter()
            .all(|a| a.is_accepted()
                || a.rejection() == Some(&Rejection::NotTerminal(taskfence::Status::Pending))),
        "the others find it live: {answers:?}"
    );
    assert_eq!(f.count("R#").await, 1, "one reopening item");
    assert_eq!(stores[1].due(10).await.unwrap(), [task.id], "due for re-dispatch");
}
