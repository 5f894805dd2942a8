//! Guarantees 1, 5 and 8: only the current, live assignment may write, and one response is saved.

use std::time::Duration;

use super::*;
use crate::store::{AttemptOutcome, Fenced, Rejection};
use crate::task::{Response, Status};
use crate::testing::{Fixture, race};

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
