//! Guarantee 7: the retry budget (attempts, deadline, backoff, failure kinds) lives with the task.

use std::time::Duration;

use super::*;
use crate::policy::{Failure, OnAmbiguous, RetryPolicy};
use crate::store::{AttemptOutcome, Rejection, Retry};
use crate::task::Response;
use crate::task::Status;
use crate::testing::Fixture;

/// Guarantee 7: attempts are counted at claim; a takeover after a crash counts.
pub async fn attempts_counted_at_claim_including_takeover(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    assert_eq!(t.attempts(), 0);
    let first = acquire(&*store, t.id, "crashes").await;
    assert_eq!((first.attempt(), first.version()), (1, 1));
    assert_eq!(
        task(&*store, t.id).await.attempts(),
        1,
        "counted at claim, before any outcome"
    );
    f.advance(PAST_LEASE).await; // the worker crashed: it never reports
    let second = acquire(&*store, t.id, "takes over").await;
    assert_eq!((second.attempt(), second.version()), (2, 2));
    assert_ne!(first.attempt_id(), second.attempt_id());
    let attempts = store.attempts(t.id).await.unwrap();
    assert_eq!(attempts.iter().map(|a| a.number).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(attempts[0].worker, "crashes");
    assert_eq!(attempts[1].outcome, AttemptOutcome::Running);
}

/// Guarantee 7: when max attempts are spent the task is terminal, for everyone.
pub async fn max_attempts_exhausted_is_terminal(f: &dyn Fixture) {
    let store = f.store();
    let policy = RetryPolicy::default().max_attempts(2).jitter(0.0);
    let t = submit(&*store, new_task("send-1").policy(policy)).await;
    // Attempt 1 fails and is retried.
    let lease = acquire(&*store, t.id, "a").await;
    let retry = store
        .fail(lease, Failure::retryable("rate limited"))
        .await
        .unwrap()
        .accepted()
        .unwrap();
    assert!(
        matches!(retry, Retry::Scheduled { attempts_left: 1, .. }),
        "{retry:?}"
    );
    f.advance(Duration::from_secs(2)).await;
    // Attempt 2 crashes; its lease expires; the budget is spent.
    let _crashed = acquire(&*store, t.id, "b").await;
    f.advance(PAST_LEASE).await;
    match store.claim(t.id, request("c")).await.unwrap() {
        Claim::Failed(failed) => assert_eq!((failed.status, failed.attempts()), (Status::Failed, 2)),
        other => panic!("expected Failed after 2 attempts, got {other:?}"),
    }
    let failed = task(&*store, t.id).await;
    assert_eq!(failed.status, Status::Failed, "terminal, visible to everyone");
    assert!(
        failed
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("attempts exhausted"))
    );
    assert!(
        matches!(store.claim(t.id, request("d")).await.unwrap(), Claim::Failed(_)),
        "claims keep saying so"
    );
    assert_eq!(
        store.attempts(t.id).await.unwrap().len(),
        2,
        "no attempt beyond the budget"
    );

    // A failure of the last attempt is terminal at once.
    let t2 = submit(&*store, new_task("send-2").policy(policy.max_attempts(1))).await;
    let lease = acquire(&*store, t2.id, "a").await;
    let out = store
        .fail(lease, Failure::retryable("again"))
        .await
        .unwrap()
        .accepted()
        .unwrap();
    assert!(
        matches!(out, Retry::Exhausted(ref t) if t.status == Status::Failed),
        "{out:?}"
    );
}

/// Guarantee 7: the elapsed-time deadline makes the task terminal too.
pub async fn deadline_exhausted_is_terminal(f: &dyn Fixture) {
    let store = f.store();
    let policy = RetryPolicy::default()
        .max_attempts(10)
        .jitter(0.0)
        .initial_backoff(Duration::from_secs(20))
        .deadline(Duration::from_secs(60));
    // A retry that would start past the deadline is not scheduled.
    let t = submit(&*store, new_task("send-1").policy(policy)).await;
    f.advance(Duration::from_secs(45)).await;
    let lease = acquire(&*store, t.id, "a").await;
    let out = store
        .fail(lease, Failure::retryable("busy"))
        .await
        .unwrap()
        .accepted()
        .unwrap();
    match out {
        Retry::Exhausted(t) => assert!(t.last_error.unwrap().contains("deadline exhausted")),
        other => panic!("expected Exhausted by deadline, got {other:?}"),
    }
    // A task never claimed before its deadline fails at its first claim after it.
    let t2 = submit(&*store, new_task("send-2").policy(policy)).await;
    f.advance(Duration::from_secs(61)).await;
    assert!(matches!(
        store.claim(t2.id, request("b")).await.unwrap(),
        Claim::Failed(_)
    ));
    assert_eq!(
        task(&*store, t2.id).await.attempts(),
        0,
        "no attempt after the deadline"
    );
}

/// A claim during backoff answers `Backoff{not_before}` and writes nothing; after it, the claim succeeds.
pub async fn claim_during_backoff_waits(f: &dyn Fixture) {
    let store = f.store();
    let policy = RetryPolicy::default()
        .jitter(0.0)
        .initial_backoff(Duration::from_secs(10));
    let t = submit(&*store, new_task("send-1").policy(policy)).await;
    let lease = acquire(&*store, t.id, "a").await;
    let Retry::Scheduled {
        not_before,
        attempts_left,
    } = store
        .fail(lease, Failure::retryable("429"))
        .await
        .unwrap()
        .accepted()
        .unwrap()
    else {
        panic!("expected a retry");
    };
    assert_eq!(attempts_left, policy.max_attempts - 1);
    let records = f.record_count().await;
    match store.claim(t.id, request("b")).await.unwrap() {
        Claim::Backoff { not_before: nb } => assert_eq!(nb, not_before),
        other => panic!("expected Backoff, got {other:?}"),
    }
    assert_eq!(f.record_count().await, records);
    f.advance(Duration::from_secs(11)).await;
    let retried = acquire(&*store, t.id, "b").await;
    assert_eq!(retried.attempt(), 2);
}

/// Permanent failures stop at once; ambiguous ones follow `on_ambiguous`.
pub async fn permanent_and_ambiguous_failures_follow_policy(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("permanent")).await;
    let lease = acquire(&*store, t.id, "a").await;
    let out = store
        .fail(lease, Failure::permanent("content refused"))
        .await
        .unwrap()
        .accepted()
        .unwrap();
    assert!(
        matches!(out, Retry::Exhausted(ref t) if t.status == Status::Failed),
        "{out:?}"
    );

    let retry = submit(
        &*store,
        new_task("ambiguous-retry").policy(RetryPolicy::default().on_ambiguous(OnAmbiguous::Retry)),
    )
    .await;
    let lease = acquire(&*store, retry.id, "a").await;
    let out = store
        .fail(lease, Failure::ambiguous("timeout after send"))
        .await
        .unwrap()
        .accepted()
        .unwrap();
    assert!(
        matches!(out, Retry::Scheduled { .. }),
        "ambiguous + Retry schedules a retry: {out:?}"
    );

    let stop = submit(
        &*store,
        new_task("ambiguous-stop").policy(RetryPolicy::default().on_ambiguous(OnAmbiguous::Stop)),
    )
    .await;
    let lease = acquire(&*store, stop.id, "a").await;
    let out = store
        .fail(lease, Failure::ambiguous("timeout after send"))
        .await
        .unwrap()
        .accepted()
        .unwrap();
    assert!(
        matches!(out, Retry::Exhausted(_)),
        "ambiguous + Stop is terminal: {out:?}"
    );
    let attempts = store.attempts(stop.id).await.unwrap();
    assert_eq!(
        attempts[0].outcome,
        AttemptOutcome::Failed(crate::policy::FailureKind::Ambiguous)
    );
    assert_eq!(attempts[0].error.as_deref(), Some("timeout after send"));
}

/// A worker's own retry delay (a provider's `Retry-After`) replaces the
/// backoff, within the budget: the attempt still counts, the last attempt
/// still ends the task, and a delay past the deadline stops it.
pub async fn requested_retry_delay_replaces_the_backoff_within_the_budget(f: &dyn Fixture) {
    let store = f.store();
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .jitter(0.0)
        .initial_backoff(Duration::from_secs(60));
    let t = submit(&*store, new_task("send-1").policy(policy)).await;
    let lease = acquire(&*store, t.id, "w").await;
    let asked = Failure::retryable("429 Retry-After: 5").retry_after(Duration::from_secs(5));
    let Retry::Scheduled {
        not_before,
        attempts_left,
    } = fail_accepted(&*store, lease, asked.clone()).await
    else {
        panic!("a retry within the budget")
    };
    assert_eq!(attempts_left, 1);
    let waited = not_before - task(&*store, t.id).await.not_before.expect("backing off");
    assert_eq!(waited, time::Duration::ZERO, "the stored backoff is the answer's");
    assert!(matches!(
        store.claim(t.id, request("w")).await.unwrap(),
        Claim::Backoff { .. }
    ));
    f.advance(Duration::from_secs(6)).await;
    let last = acquire(&*store, t.id, "w").await; // after 5 s, not the policy's 60 s
    assert!(
        matches!(fail_accepted(&*store, last, asked).await, Retry::Exhausted(_)),
        "the last attempt ends the task whatever delay it asks for"
    );

    let with_deadline = new_task("send-2").policy(policy.deadline(Duration::from_secs(30)));
    let d = submit(&*store, with_deadline).await;
    let lease = acquire(&*store, d.id, "w").await;
    let too_late = Failure::retryable("429 Retry-After: 120").retry_after(Duration::from_secs(120));
    assert!(matches!(
        fail_accepted(&*store, lease, too_late).await,
        Retry::Exhausted(_)
    ));
    let failed = task(&*store, d.id).await;
    assert_eq!(failed.status, Status::Failed);
    assert!(
        failed
            .last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("deadline exhausted")),
        "{:?}",
        failed.last_error
    );
}

/// A claim given back unstarted costs no attempt: a task allowed one
/// attempt, claimed and released unstarted ten times (a prefetch given back
/// at ten stops), still runs once; the version rose with every claim.
pub async fn unstarted_releases_cost_no_attempt(f: &dyn Fixture) {
    let store = f.store();
    let once = RetryPolicy::default().max_attempts(1);
    let t = submit(&*store, new_task("send-1").policy(once)).await;
    for round in 1..=10u64 {
        let lease = acquire(&*store, t.id, "prefetching").await;
        assert_eq!(lease.version(), round, "every claim is a new assignment");
        let given_back = store.release_unstarted(lease).await.unwrap();
        assert!(given_back.is_accepted(), "round {round}: {given_back:?}");
        let back = task(&*store, t.id).await;
        assert_eq!(back.status, Status::Pending, "round {round}: due again at once");
        assert_eq!(
            (back.version, back.attempts_in_budget(), back.attempts_left()),
            (round, 0, 1),
            "round {round}: the claim was refunded"
        );
    }
    let lease = acquire(&*store, t.id, "runs it").await;
    assert_eq!(lease.version(), 11);
    let done = store.complete(lease, Response::from("sent")).await.unwrap();
    assert!(done.is_accepted(), "{done:?}");
    let attempts = store.attempts(t.id).await.unwrap();
    assert_eq!(attempts.len(), 11, "the journal keeps every claim");
    assert!(
        attempts[..10]
            .iter()
            .all(|a| a.outcome == AttemptOutcome::ReturnedUnstarted && a.finished_at.is_some()),
        "{attempts:?}"
    );
    assert_eq!(attempts[10].outcome, AttemptOutcome::Completed);
    assert_eq!(
        attempts.iter().filter(|a| a.outcome.counts()).count(),
        1,
        "one attempt counted"
    );
}

/// A crash after the claim still counts: nothing gives the claim back, so
/// its lease expiring on the store's clock spends the attempt, even after
/// unstarted releases were refunded.
pub async fn crash_after_claim_still_counts(f: &dyn Fixture) {
    let store = f.store();
    let once = RetryPolicy::default().max_attempts(1);
    let t = submit(&*store, new_task("send-1").policy(once)).await;
    let lease = acquire(&*store, t.id, "prefetching").await;
    assert!(store.release_unstarted(lease).await.unwrap().is_accepted());
    let _crashed = acquire(&*store, t.id, "crashes").await;
    f.advance(PAST_LEASE).await; // the process died holding the lease
    match store.claim(t.id, request("next")).await.unwrap() {
        Claim::Failed(failed) => {
            assert_eq!(failed.status, Status::Failed);
            assert_eq!((failed.version, failed.attempts_in_budget()), (2, 1));
        }
        other => panic!("the crash spent the only attempt, got {other:?}"),
    }
    let outcomes: Vec<_> = store
        .attempts(t.id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.outcome)
        .collect();
    assert_eq!(
        outcomes,
        [AttemptOutcome::ReturnedUnstarted, AttemptOutcome::Expired]
    );
}

/// Only the current lease refunds, once: an expired or superseded lease's
/// unstarted release is refused and refunds nothing, and a second release
/// of the same lease is refused.
pub async fn stale_unstarted_release_is_refused_and_refunds_nothing(f: &dyn Fixture) {
    let store = f.store();
    let twice = RetryPolicy::default().max_attempts(2);
    let t = submit(&*store, new_task("send-1").policy(twice)).await;

    // Expired, not yet taken over.
    let expired = acquire(&*store, t.id, "paused").await;
    f.advance(PAST_LEASE).await;
    assert_eq!(
        store
            .release_unstarted(expired.clone())
            .await
            .unwrap()
            .rejection(),
        Some(&Rejection::LeaseExpired)
    );
    assert_eq!(
        task(&*store, t.id).await.attempts_in_budget(),
        1,
        "nothing refunded"
    );

    // Superseded by a takeover.
    let current = acquire(&*store, t.id, "takes over").await;
    assert_eq!(
        store.release_unstarted(expired).await.unwrap().rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
    let held = task(&*store, t.id).await;
    assert_eq!(
        (held.status, held.attempts_in_budget(), held.attempts_left()),
        (Status::Running, 2, 0),
        "nothing refunded, the current lease untouched"
    );

    // The current lease refunds its own claim, once.
    assert!(
        store
            .release_unstarted(current.clone())
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(
        store.release_unstarted(current).await.unwrap().rejection(),
        Some(&Rejection::NotRunning(Status::Pending))
    );
    let back = task(&*store, t.id).await;
    assert_eq!(
        (
            back.status,
            back.version,
            back.attempts_in_budget(),
            back.attempts_left()
        ),
        (Status::Pending, 2, 1, 1)
    );
    // The refunded attempt is there to run.
    let last = acquire(&*store, t.id, "runs it").await;
    assert!(
        store
            .complete(last, Response::from("sent"))
            .await
            .unwrap()
            .is_accepted()
    );
}
