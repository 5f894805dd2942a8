//! An operator's reopening: a failed or cancelled task gets a fresh budget,
//! while the fencing of every earlier lease stays intact.

use std::time::Duration;

use super::*;
use crate::error::{Error, InvalidInput};
use crate::policy::{AcceptanceRule, Failure, RetryPolicy};
use crate::store::{AttemptOutcome, Fenced, Rejection, ReopenRequest, Retry};
use crate::task::{Response, Status};
use crate::testing::Fixture;

fn by_ops() -> ReopenRequest {
    ReopenRequest::new("ops@example", "provider quota raised")
}

/// Fails `lease` with a retryable error and returns the store's decision.
async fn fail(store: &dyn TaskStore, lease: Lease) -> Retry {
    crate::testing::fail_accepted(store, lease, Failure::retryable("provider down")).await
}

/// A failed task reopens with exactly a fresh budget; versions keep rising,
/// the journal keeps every attempt, and an old lease never saves.
pub async fn reopen_gives_failed_task_a_fresh_budget(f: &dyn Fixture) {
    let store = f.store();
    let policy = RetryPolicy::default().max_attempts(2).jitter(0.0);
    let t = submit(&*store, new_task("send-1").policy(policy)).await;
    let first = acquire(&*store, t.id, "a").await;
    assert!(matches!(fail(&*store, first).await, Retry::Scheduled { .. }));
    f.advance(Duration::from_secs(2)).await;
    let second = acquire(&*store, t.id, "b").await;
    assert!(matches!(fail(&*store, second.clone()).await, Retry::Exhausted(_)));
    assert_eq!(task(&*store, t.id).await.status, Status::Failed);

    let reopened = match store.reopen(t.id, by_ops()).await.unwrap() {
        Fenced::Accepted(task) => task,
        Fenced::Rejected(r) => panic!("a failed task must reopen, got {r}"),
    };
    assert_eq!(reopened.status, Status::Pending);
    assert_eq!(
        (reopened.version, reopened.budget_base),
        (2, 2),
        "the version never goes back"
    );
    assert_eq!(
        (reopened.attempts(), reopened.attempts_left()),
        (2, 2),
        "a fresh budget of 2"
    );
    assert_eq!(reopened.finished_at, None);
    assert_eq!(
        task(&*store, t.id).await,
        reopened,
        "what retry returned is what is stored"
    );
    assert_eq!(
        store.due(10).await.unwrap(),
        [t.id],
        "a reopened task is due at once, for re-dispatch"
    );

    // The old lease can never save, not even now that the task is live again.
    assert!(
        !store
            .complete(second, Response::from("late"))
            .await
            .unwrap()
            .is_accepted()
    );

    // Exactly two more attempts, numbered on from the old ones.
    let third = acquire(&*store, t.id, "c").await;
    assert_eq!((third.version(), third.attempt()), (3, 3));
    assert!(matches!(
        fail(&*store, third).await,
        Retry::Scheduled { attempts_left: 1, .. }
    ));
    f.advance(Duration::from_secs(2)).await;
    let fourth = acquire(&*store, t.id, "d").await;
    assert!(
        matches!(fail(&*store, fourth).await, Retry::Exhausted(_)),
        "the fresh budget is 2 attempts, not more"
    );

    let attempts = store.attempts(t.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.number).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert!(
        attempts
            .iter()
            .all(|a| a.outcome == AttemptOutcome::Failed(crate::policy::FailureKind::Retryable))
    );
}

/// The fresh budget takes the request's policy, and its deadline counts from the reopening.
pub async fn reopen_gives_new_policy_and_fresh_deadline(f: &dyn Fixture) {
    let store = f.store();
    let hour = Duration::from_secs(3600);
    let t = submit(
        &*store,
        new_task("send-1").policy(RetryPolicy::default().deadline(hour)),
    )
    .await;
    f.advance(hour + Duration::from_secs(1)).await;
    assert!(
        matches!(store.claim(t.id, request("a")).await.unwrap(), Claim::Failed(_)),
        "past its deadline"
    );

    let policy = RetryPolicy::default().max_attempts(7).deadline(hour);
    let reopened = store
        .reopen(t.id, by_ops().policy(policy))
        .await
        .unwrap()
        .accepted()
        .unwrap();
    assert_eq!(reopened.policy, policy);
    assert_eq!(reopened.attempts_left(), 7);
    let lease = acquire(&*store, t.id, "b").await;
    assert_eq!(
        lease.task().policy,
        policy,
        "the policy is stored, not just returned"
    );
    assert!(
        store
            .complete(lease, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );
}

/// A completed task keeps its response; a live one needs no reopening; an unknown
/// one is not found. Each refusal writes nothing.
pub async fn reopen_refuses_completed_live_and_unknown_tasks(f: &dyn Fixture) {
    let store = f.store();
    let done = submit(&*store, new_task("done")).await;
    let lease = acquire(&*store, done.id, "a").await;
    assert!(
        store
            .complete(lease, Response::from("saved"))
            .await
            .unwrap()
            .is_accepted()
    );
    let pending = submit(&*store, new_task("pending")).await;
    let running = submit(&*store, new_task("running")).await;
    let _held = acquire(&*store, running.id, "b").await;
    let before = f.record_count().await;
    let snapshots = [
        task(&*store, done.id).await,
        task(&*store, pending.id).await,
        task(&*store, running.id).await,
    ];

    match store.reopen(done.id, by_ops()).await.unwrap() {
        Fenced::Rejected(Rejection::AlreadyCompleted(saved)) => {
            assert_eq!(saved.response, Some(Response::from("saved")));
        }
        other => panic!("a completed task cannot be reopened, got {other:?}"),
    }
    assert_eq!(
        store.reopen(pending.id, by_ops()).await.unwrap().rejection(),
        Some(&Rejection::NotTerminal(Status::Pending))
    );
    assert_eq!(
        store.reopen(running.id, by_ops()).await.unwrap().rejection(),
        Some(&Rejection::NotTerminal(Status::Running))
    );
    let unknown = TaskId::new();
    assert!(matches!(store.reopen(unknown, by_ops()).await, Err(Error::NotFound(id)) if id == unknown));

    assert_eq!(f.record_count().await, before, "refused retries write nothing");
    for snapshot in snapshots {
        assert_eq!(task(&*store, snapshot.id).await, snapshot);
    }
}

/// A cancelled task reopens; the lease that ran before the cancellation never
/// saves, under either acceptance rule.
pub async fn reopen_of_cancelled_task_keeps_old_leases_fenced(f: &dyn Fixture) {
    let store = f.store();
    for rule in [
        AcceptanceRule::CurrentAssignment,
        AcceptanceRule::FirstValidAnswer,
    ] {
        let t = submit(&*store, new_task(&format!("send-{rule:?}")).acceptance(rule)).await;
        let before_cancel = acquire(&*store, t.id, "a").await;
        assert!(store.cancel(t.id, "wrong recipient").await.unwrap().is_accepted());
        let reopened = store.reopen(t.id, by_ops()).await.unwrap().accepted().unwrap();
        assert_eq!(
            (reopened.status, reopened.version, reopened.budget_base),
            (Status::Pending, 1, 1)
        );

        let late = store
            .complete(before_cancel.clone(), Response::from("stale"))
            .await
            .unwrap();
        assert!(
            !late.is_accepted(),
            "{rule:?}: a lease from before the retry saved: {late:?}"
        );
        let current = acquire(&*store, t.id, "b").await;
        assert_eq!(current.version(), 2);
        let late = store
            .complete(before_cancel, Response::from("stale"))
            .await
            .unwrap();
        assert_eq!(
            late.rejection(),
            Some(&Rejection::Superseded { current_version: 2 }),
            "{rule:?}"
        );
        let saved = store
            .complete(current, Response::from("fresh"))
            .await
            .unwrap()
            .accepted()
            .unwrap();
        assert_eq!(saved.response, Some(Response::from("fresh")), "{rule:?}");
    }
}

/// Bad reopen requests get a typed error and write nothing.
pub async fn bad_reopen_requests_are_refused_and_write_nothing(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    assert!(store.cancel(t.id, "stop").await.unwrap().is_accepted());
    let snapshot = task(&*store, t.id).await;
    let before = f.record_count().await;
    let bad = [
        ReopenRequest::new("", "why"),
        ReopenRequest::new("ops", "a\0b"),
        ReopenRequest::new("x".repeat(crate::limits::MAX_WORKER_LEN + 1), "why"),
        by_ops().policy(RetryPolicy::default().max_attempts(0)),
    ];
    for request in bad {
        let result = store.reopen(t.id, request.clone()).await;
        assert!(
            matches!(result, Err(Error::InvalidInput(_))),
            "{request:?} must be refused as invalid input, got {result:?}"
        );
    }
    assert!(matches!(
        store.reopen(t.id, ReopenRequest::new(" ", "why")).await,
        Err(Error::InvalidInput(InvalidInput::Blank { field: "by" }))
    ));
    assert_eq!(f.record_count().await, before);
    assert_eq!(task(&*store, t.id).await, snapshot);
}

/// Every reopening restarts exactly the retention the task was submitted
/// with: not that plus the time until an earlier reopening.
pub async fn reopen_restarts_exactly_the_configured_retention(f: &dyn Fixture) {
    let store = f.store();
    let hour = Duration::from_secs(3600);
    let t = submit(&*store, new_task("kept-1h").retention(hour)).await;
    assert_eq!(t.expires_at - t.created_at, hour);
    for round in 1..=3 {
        f.advance(Duration::from_secs(600)).await;
        assert!(store.cancel(t.id, "stop").await.unwrap().is_accepted());
        let reopened = store.reopen(t.id, by_ops()).await.unwrap().accepted().unwrap();
        assert_eq!(
            reopened.expires_at - reopened.budget_started_at,
            hour,
            "reopening {round} keeps the task for the configured hour from now"
        );
        assert_eq!(task(&*store, t.id).await.expires_at, reopened.expires_at);
    }
}

/// A reopening may change only the attempts of the budget: every other
/// setting of the stored policy stays; bad counts are refused.
pub async fn reopen_can_change_only_max_attempts(f: &dyn Fixture) {
    let store = f.store();
    let policy = RetryPolicy::default()
        .max_attempts(1)
        .initial_backoff(Duration::from_secs(7))
        .jitter(0.0);
    let t = submit(&*store, new_task("one-try").policy(policy)).await;
    let lease = acquire(&*store, t.id, "a").await;
    assert!(matches!(fail(&*store, lease).await, Retry::Exhausted(_)));

    let before = f.record_count().await;
    for bad in [0, crate::limits::MAX_ATTEMPTS + 1] {
        let refused = store.reopen(t.id, by_ops().max_attempts(bad)).await;
        assert!(
            matches!(
                refused,
                Err(Error::InvalidInput(InvalidInput::OutOfRange {
                    field: "max_attempts",
                    ..
                }))
            ),
            "max_attempts {bad}: {refused:?}"
        );
    }
    assert_eq!(f.record_count().await, before, "refusals write nothing");
    assert_eq!(task(&*store, t.id).await.status, Status::Failed);

    let reopened = store
        .reopen(t.id, by_ops().max_attempts(3))
        .await
        .unwrap()
        .accepted()
        .unwrap();
    assert_eq!(
        reopened.policy,
        policy.max_attempts(3),
        "only the attempts changed"
    );
    assert_eq!(reopened.attempts_left(), 3);
    let lease = acquire(&*store, t.id, "b").await;
    assert_eq!(
        lease.task().policy,
        policy.max_attempts(3),
        "stored, not just returned"
    );
}
