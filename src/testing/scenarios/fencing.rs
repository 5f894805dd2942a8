//! Guarantees 1, 5 and 8: only the current, live assignment may write, and one response is saved.

use std::time::Duration;

use super::*;
use crate::effect::EffectOutcome;
use crate::store::{AttemptOutcome, Fenced, Rejection};
use crate::task::{Response, Status};
use crate::testing::{Fixture, RollbackFixture, race};

/// Guarantee 5: after a takeover, every fenced write of the old lease says `Superseded`.
pub async fn superseded_lease_is_rejected_everywhere(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let old = acquire(&*store, t.id, "old").await;
    f.advance(PAST_LEASE).await;
    let _new = acquire(&*store, t.id, "new").await;
    assert_superseded_writes(&*store, &old, 2).await;
    let superseded = Rejection::Superseded { current_version: 2 };
    assert_eq!(
        store
            .complete(old, Response::from("late"))
            .await
            .unwrap()
            .rejection(),
        Some(&superseded),
        "complete"
    );
    let now = task(&*store, t.id).await;
    assert_eq!(
        (now.status, now.version, now.response),
        (Status::Running, 2, None),
        "nothing changed"
    );
}

/// Guarantee 5 and 8: completing after the lease expired (on the store's clock) is refused.
pub async fn complete_after_lease_expiry_is_rejected(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let lease = acquire(&*store, t.id, "slow").await;
    f.advance(PAST_LEASE).await;
    let late = store.complete(lease, Response::from("late")).await.unwrap();
    assert_eq!(late.rejection(), Some(&Rejection::LeaseExpired));
    assert_eq!(task(&*store, t.id).await.response, None);
    assert!(
        store.claim(t.id, request("next")).await.unwrap().is_acquired(),
        "the task can be taken over"
    );
}

/// The paused worker under the default rule (`CurrentAssignment`): it
/// returns after a takeover with an answer, is rejected, and the new worker's
/// answer is the one saved.
pub async fn paused_worker_after_takeover_is_rejected(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let paused = acquire(&*store, t.id, "paused").await;
    f.advance(PAST_LEASE).await;
    let fresh = acquire(&*store, t.id, "fresh").await;
    assert_eq!(
        fresh.version(),
        paused.version() + 1,
        "the takeover gets a newer version"
    );
    let stale = store
        .complete(paused, Response::from("stale answer"))
        .await
        .unwrap();
    assert_eq!(
        stale.rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
    let saved = store
        .complete(fresh, Response::from("fresh answer"))
        .await
        .unwrap()
        .accepted()
        .expect("accepted");
    assert_eq!(saved.response, Some(Response::from("fresh answer")));
    assert_eq!(
        task(&*store, t.id).await.response,
        Some(Response::from("fresh answer"))
    );
    let outcomes: Vec<_> = store
        .attempts(t.id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.outcome)
        .collect();
    assert_eq!(outcomes, [AttemptOutcome::Expired, AttemptOutcome::Completed]);
}

/// Guarantee 1: a second completion is refused with the first response, which never changes.
pub async fn double_complete_keeps_first_response(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let lease = acquire(&*store, t.id, "a").await;
    let copy = lease.clone();
    assert!(
        store
            .complete(lease, Response::from("first"))
            .await
            .unwrap()
            .is_accepted()
    );
    match store.complete(copy, Response::from("second")).await.unwrap() {
        Fenced::Rejected(Rejection::AlreadyCompleted(done)) => {
            assert_eq!(done.response, Some(Response::from("first")));
        }
        other => panic!("expected AlreadyCompleted, got {other:?}"),
    }
    let done = task(&*store, t.id).await;
    assert_eq!(
        (done.status, done.response),
        (Status::Completed, Some(Response::from("first")))
    );
}

/// Guarantee 1 under a race: N concurrent completes with the same lease, one accepted.
pub async fn concurrent_completes_accept_once(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let lease = acquire(&*store, t.id, "a").await;
    let results = race(RACERS, |i| {
        let (store, lease) = (store.clone(), lease.clone());
        async move {
            (
                i,
                store
                    .complete(lease, Response::from(format!("answer {i}")))
                    .await
                    .expect("complete"),
            )
        }
    })
    .await;
    let winners: Vec<usize> = results
        .iter()
        .filter(|(_, r)| r.is_accepted())
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(winners.len(), 1, "exactly one of {RACERS} completes is accepted");
    let expected = Response::from(format!("answer {}", winners[0]));
    for (_, r) in &results {
        if let Fenced::Rejected(rejection) = r {
            assert!(
                matches!(rejection, Rejection::AlreadyCompleted(t) if t.response.as_ref() == Some(&expected)),
                "losers see the winner's response: {rejection:?}"
            );
        }
    }
    assert_eq!(task(&*store, t.id).await.response, Some(expected));
}

/// Renewals keep a long call alive past the first lease; after a takeover they fail.
pub async fn renew_keeps_lease_alive_and_fails_after_takeover(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let mut lease = acquire(&*store, t.id, "long").await;
    let first_expiry = lease.expires_at();
    for _ in 0..3 {
        f.advance(Duration::from_secs(20)).await;
        assert!(
            store.renew(&mut lease, LEASE).await.unwrap().is_accepted(),
            "renewal within the lease"
        );
        assert!(matches!(
            store.claim(t.id, request("other")).await.unwrap(),
            Claim::Busy { .. }
        ));
    }
    assert!(
        lease.expires_at() > first_expiry,
        "renewal moves the expiry forward"
    );
    // 60 s after the first lease would have expired, the call is still the holder and completes.
    let mut kept = lease.clone();
    assert!(
        store
            .complete(lease, Response::from("long answer"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert!(matches!(
        store.renew(&mut kept, LEASE).await.unwrap(),
        Fenced::Rejected(Rejection::AlreadyCompleted(_))
    ));

    // Once the lease lapses and another worker takes over, renewal is refused.
    let t2 = submit(&*store, new_task("send-2")).await;
    let mut lapsed = acquire(&*store, t2.id, "lapsed").await;
    f.advance(PAST_LEASE).await;
    assert_eq!(
        store.renew(&mut lapsed, LEASE).await.unwrap().rejection(),
        Some(&Rejection::LeaseExpired)
    );
    let _taker = acquire(&*store, t2.id, "taker").await;
    assert_eq!(
        store.renew(&mut lapsed, LEASE).await.unwrap().rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
}

/// Guarantee 5 across the caller's transaction: a claim rolled back with it
/// leaves a lease whose version the next claim grants again, to another
/// attempt. The fence compares the attempt id as well as the version, so
/// every write of that lease is refused (`Superseded`), the store's own
/// fence included, and the holder's answer is the one saved.
pub async fn lease_of_a_rolled_back_claim_is_refused_everywhere(f: &dyn RollbackFixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let Claim::Acquired(undone) = f.claim_rolled_back(t.id, request("rolled-back")).await else {
        panic!("the claim in the transaction acquires");
    };
    assert_eq!(
        task(&*store, t.id).await.version,
        0,
        "the rollback undid the claim"
    );
    let holder = acquire(&*store, t.id, "holder").await;
    assert_eq!(
        (holder.version(), undone.version()),
        (1, 1),
        "the same version is granted again"
    );
    assert_ne!(holder.attempt_id(), undone.attempt_id(), "to another attempt");
    let superseded = Rejection::Superseded { current_version: 1 };
    assert_eq!(
        f.fence_in_transaction(&undone).await.unwrap().rejection(),
        Some(&superseded),
        "the store's fence in a transaction"
    );
    assert_eq!(
        store.begin_effect(&undone, "notify").await.unwrap().rejection(),
        Some(&superseded),
        "begin_effect"
    );
    assert_eq!(
        store
            .finish_effect(&undone, "notify", EffectOutcome::done("m-1"))
            .await
            .unwrap()
            .rejection(),
        Some(&superseded),
        "finish_effect"
    );
    let renewed = store
        .renew_many(std::slice::from_mut(&mut undone.clone()), LEASE)
        .await
        .unwrap();
    assert_eq!(renewed[0].rejection(), Some(&superseded), "renew_many");
    let completed = store
        .complete_many(vec![(undone.clone(), Response::from("undone, batched"))])
        .await
        .unwrap();
    assert_eq!(
        completed[0].as_ref().unwrap().rejection(),
        Some(&superseded),
        "complete_many"
    );
    assert_superseded_writes(&*store, &undone, 1).await;
    assert_eq!(
        store
            .complete(undone, Response::from("undone"))
            .await
            .unwrap()
            .rejection(),
        Some(&superseded),
        "complete"
    );
    let now = task(&*store, t.id).await;
    assert_eq!(
        (now.status, now.version, now.response),
        (Status::Running, 1, None),
        "nothing changed"
    );
    assert!(
        store.effects(t.id).await.unwrap().is_empty(),
        "no effect recorded"
    );
    let saved = store
        .complete(holder, Response::from("holder's answer"))
        .await
        .unwrap()
        .accepted()
        .expect("the holder completes");
    assert_eq!(saved.response, Some(Response::from("holder's answer")));
}

/// The same under [`FirstValidAnswer`](crate::policy::AcceptanceRule::FirstValidAnswer),
/// which saves an earlier assignment's answer: the rolled-back claim's
/// version was granted to another attempt, so its answer is never saved,
/// even after that attempt's lease is taken over.
pub async fn first_valid_answer_never_saves_a_rolled_back_claim(f: &dyn RollbackFixture) {
    let store = f.store();
    let first_valid = new_task("send-1").acceptance(crate::policy::AcceptanceRule::FirstValidAnswer);
    let t = submit(&*store, first_valid).await;
    let Claim::Acquired(undone) = f.claim_rolled_back(t.id, request("rolled-back")).await else {
        panic!("the claim in the transaction acquires");
    };
    let holder = acquire(&*store, t.id, "holder").await;
    f.advance(PAST_LEASE).await;
    let _next = acquire(&*store, t.id, "next").await;
    assert_eq!(
        store
            .complete(undone, Response::from("undone"))
            .await
            .unwrap()
            .rejection(),
        Some(&Rejection::Superseded { current_version: 2 }),
        "the undone claim's answer"
    );
    let saved = store
        .complete(holder, Response::from("holder's answer"))
        .await
        .unwrap()
        .accepted()
        .expect("the granted earlier attempt's answer is a valid first answer");
    assert_eq!(saved.response, Some(Response::from("holder's answer")));
}
