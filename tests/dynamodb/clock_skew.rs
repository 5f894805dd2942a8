//! DynamoDB has no clock a condition can read: each replica compares leases
//! with its own. Two stores on one table with clocks skewed on purpose show
//! what holds under any skew (at most one saved response; a superseded
//! assignment never saves — versions decide) and what depends on bounded
//! skew (when a lease counts as expired: a fast clock takes over early,
//! wasting work, never saving twice).

use std::time::Duration;

use taskfence::clock::ManualClock;
use taskfence::policy::AcceptanceRule;
use taskfence::testing::{Fixture, new_task, one_winner, race};
use taskfence::{Claim, ClaimRequest, Fenced, Rejection, Response, Status, TaskStore};
use taskfence_test_support::dynamo;

const LEASE: Duration = Duration::from_secs(30);

/// A clock `skew` ahead of `base`'s instant (moved separately from it).
fn ahead(base: &ManualClock, skew: Duration) -> ManualClock {
    let clock = ManualClock::new(taskfence::clock::Clock::now(base));
    clock.advance(skew);
    clock
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_clock_takes_over_early_and_the_superseded_worker_never_saves() {
    let f = dynamo::fixture().await;
    let slow = f.dynamo_store();
    let fast_clock = ahead(f.clock(), Duration::from_secs(25));
    let fast = dynamo::replica(&f, fast_clock.clone());
    let task = slow.submit(new_task("send-1")).await.unwrap().into_task();

    let Claim::Acquired(first) = slow.claim(task.id, ClaimRequest::new("a", LEASE)).await.unwrap() else {
        panic!("fresh")
    };
    // 25 s ahead, the fast replica still sees the 30 s lease as live…
    assert!(matches!(
        fast.claim(task.id, ClaimRequest::new("b", LEASE)).await.unwrap(),
        Claim::Busy { .. }
    ));
    // …10 s later (real time for both) it sees it expired: 20 s early for worker "a".
    f.advance(Duration::from_secs(10)).await;
    fast_clock.advance(Duration::from_secs(10));
    let Claim::Acquired(second) = fast.claim(task.id, ClaimRequest::new("b", LEASE)).await.unwrap() else {
        panic!("the fast clock sees the lease expired")
    };
    assert_eq!(second.version(), 2);

    // Worker "a"'s lease is live on its own clock, and it is refused all the same:
    // the version decides, not the clock.
    let mut renewing = first.clone();
    assert_eq!(
        slow.renew(&mut renewing, LEASE).await.unwrap().rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
    assert_eq!(
        slow.complete(first, Response::from("a's answer"))
            .await
            .unwrap()
            .rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
    let saved = fast.complete(second, Response::from("b's answer")).await.unwrap();
    assert!(
        saved.is_accepted(),
        "wasted work by 'a', one saved response by 'b'"
    );
    let stored = slow.get(task.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.response),
        (Status::Completed, Some(Response::from("b's answer")))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_far_behind_never_saves_a_superseded_assignment() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    // An hour behind: every lease looks live to this replica.
    let behind_clock = ManualClock::new(taskfence::clock::Clock::now(f.clock()) - Duration::from_secs(3600));
    let behind = dynamo::replica(&f, behind_clock);
    for rule in [
        AcceptanceRule::CurrentAssignment,
        AcceptanceRule::FirstValidAnswer,
    ] {
        let task = store
            .submit(new_task(rule.as_str()).acceptance(rule))
            .await
            .unwrap()
            .into_task();
        let Claim::Acquired(first) = store.claim(task.id, ClaimRequest::new("a", LEASE)).await.unwrap()
        else {
            panic!("fresh")
        };
        f.advance(LEASE + Duration::from_secs(1)).await;
        let Claim::Acquired(second) = store.claim(task.id, ClaimRequest::new("b", LEASE)).await.unwrap()
        else {
            panic!("expired")
        };
        // Worker "b" saves; "a", on the lagging replica, tries afterwards.
        assert!(
            store
                .complete(second, Response::from("b"))
                .await
                .unwrap()
                .is_accepted()
        );
        let late = behind.complete(first, Response::from("a")).await.unwrap();
        assert!(
            matches!(late, Fenced::Rejected(Rejection::AlreadyCompleted(ref t)) if t.response == Some(Response::from("b"))),
            "{rule:?}: {late:?}"
        );
    }
    // Under CurrentAssignment a superseded lease is refused before anything is saved, too.
    let task = store.submit(new_task("pending")).await.unwrap().into_task();
    let Claim::Acquired(first) = store.claim(task.id, ClaimRequest::new("a", LEASE)).await.unwrap() else {
        panic!("fresh")
    };
    f.advance(LEASE + Duration::from_secs(1)).await;
    let Claim::Acquired(_second) = store.claim(task.id, ClaimRequest::new("b", LEASE)).await.unwrap() else {
        panic!("expired")
    };
    assert_eq!(
        behind
            .complete(first, Response::from("a"))
            .await
            .unwrap()
            .rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
    assert_eq!(store.get(task.id).await.unwrap().unwrap().response, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_replicas_with_skewed_clocks_save_once() {
    let f = dynamo::fixture().await;
    let clocks = [
        f.clock().clone(),
        ahead(f.clock(), Duration::from_secs(40)),
        ManualClock::new(taskfence::clock::Clock::now(f.clock()) - Duration::from_secs(40)),
    ];
    let stores: Vec<std::sync::Arc<dyn TaskStore>> = clocks
        .iter()
        .map(|c| std::sync::Arc::new(dynamo::replica(&f, c.clone())) as _)
        .collect();
    let task = stores[0]
        .submit(new_task("send-1").acceptance(AcceptanceRule::FirstValidAnswer))
        .await
        .unwrap()
        .into_task();
    // Claims from all three: the fast replica takes over leases the others think live.
    let mut leases = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        if let Claim::Acquired(lease) = store
            .claim(task.id, ClaimRequest::new(format!("w{i}"), LEASE))
            .await
            .unwrap()
        {
            leases.push(lease);
        }
    }
    for c in &clocks {
        c.advance(LEASE + Duration::from_secs(1));
    }
    if let Claim::Acquired(lease) = stores[1]
        .claim(task.id, ClaimRequest::new("late", LEASE))
        .await
        .unwrap()
    {
        leases.push(lease);
    }
    assert!(
        leases.len() >= 2,
        "skew let more than one assignment start: {}",
        leases.len()
    );
    let results = race(24, |i| {
        let (store, lease) = (stores[i % stores.len()].clone(), leases[i % leases.len()].clone());
        async move {
            store
                .complete(lease, Response::from(format!("answer {i}")))
                .await
                .expect("complete")
        }
    })
    .await;
    one_winner(&results, "completions under any skew (one saved response)");
}
