//! Guarantees 6 and 1 (claim side): who may work on a task now, and done means done.

use super::*;
use crate::task::Response;
use crate::testing::{Fixture, race};

/// Guarantee 1 (claim side): N concurrent claims, exactly one acquires.
pub async fn concurrent_claims_acquire_once(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let claims = race(RACERS, |i| {
        let store = store.clone();
        async move {
            store
                .claim(t.id, request(&format!("worker-{i}")))
                .await
                .expect("claim")
        }
    })
    .await;
    let acquired = claims.iter().filter(|c| c.is_acquired()).count();
    assert_eq!(acquired, 1, "exactly one of {RACERS} claims acquires");
    assert!(
        claims
            .iter()
            .all(|c| matches!(c, Claim::Acquired(_) | Claim::Busy { .. })),
        "the others see a live lease: {claims:?}"
    );
    assert_eq!(task(&*store, t.id).await.attempts(), 1, "one attempt counted");
}

/// Guarantee 6: a completed task's claim returns the saved response and counts no attempt.
pub async fn claim_of_completed_task_returns_saved_response_without_attempt(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let lease = acquire(&*store, t.id, "a").await;
    store
        .complete(lease, Response::from("saved"))
        .await
        .unwrap()
        .into_result()
        .expect("accepted");
    let records = f.record_count().await;
    match store.claim(t.id, request("b")).await.unwrap() {
        Claim::Completed(done) => assert_eq!(done.response, Some(Response::from("saved"))),
        other => panic!("expected Completed, got {other:?}"),
    }
    assert_eq!(
        task(&*store, t.id).await.attempts(),
        1,
        "no attempt counted for a duplicate delivery"
    );
    assert_eq!(store.attempts(t.id).await.unwrap().len(), 1);
    assert_eq!(
        f.record_count().await,
        records,
        "claiming a completed task writes nothing"
    );
}
