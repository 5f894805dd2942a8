//! The conformance scenarios, one public function each, named after what
//! they check. [`conformance_suite!`](crate::conformance_suite) runs them all;
//! a backend may also call one directly.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use taskfence::testing::{scenarios, MemoryFixture};
//! scenarios::double_complete_keeps_first_response(&MemoryFixture::new()).await;
//! # }
//! ```

use std::time::Duration;

use super::{Fixture, race};
use crate::error::Error;
use crate::limits;
use crate::policy::{Failure, OnAmbiguous, RetryPolicy};
use crate::store::{AttemptOutcome, Claim, ClaimRequest, Fenced, Lease, Rejection, Retry, TaskStore};
use crate::task::{InputHash, NewTask, RequestKey, Response, Status, Task, TaskId};

/// The lease the scenarios claim with.
const LEASE: Duration = Duration::from_secs(30);
/// A little past [`LEASE`].
const PAST_LEASE: Duration = Duration::from_secs(31);
/// Concurrency of the race scenarios.
const RACERS: usize = 32;

fn key(k: &str) -> RequestKey {
    RequestKey::new("scope-a", "chat.reply", k)
}

fn new_task(k: &str) -> NewTask {
    NewTask::new(key(k), InputHash::of(["conversation-1", k])).payload(format!("payload of {k}").into_bytes())
}

fn request(worker: &str) -> ClaimRequest {
    ClaimRequest::new(worker, LEASE)
}

async fn submit(store: &dyn TaskStore, task: NewTask) -> Task {
    store.submit(task).await.expect("submit").into_task()
}

async fn acquire(store: &dyn TaskStore, id: TaskId, worker: &str) -> Lease {
    match store.claim(id, request(worker)).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        other => panic!("{worker} expected to acquire {id}, got {other:?}"),
    }
}

async fn task(store: &dyn TaskStore, id: TaskId) -> Task {
    store.get(id).await.expect("get").expect("task exists")
}

/// Guarantee 2: the same key with the same inputs is the existing task, and nothing new is written.
pub async fn duplicate_submit_returns_same_task(f: &dyn Fixture) {
    let store = f.store();
    let first = store.submit(new_task("send-1")).await.expect("submit");
    assert!(first.is_created(), "first submission creates the task");
    let records = f.record_count().await;
    let second = store.submit(new_task("send-1")).await.expect("resubmit");
    assert!(!second.is_created(), "a repeated submission is not new work");
    assert_eq!(second.task().id, first.task().id, "same task");
    assert_eq!(
        f.record_count().await,
        records,
        "a repeated submission writes nothing"
    );
    let found = store.find(&key("send-1")).await.expect("find").expect("found");
    assert_eq!(found.id, first.task().id);
}

/// Guarantee 3: a reused key with different inputs is a typed error naming the task; nothing is written.
pub async fn key_reuse_with_other_inputs_conflicts_and_writes_nothing(f: &dyn Fixture) {
    let store = f.store();
    let original = submit(&*store, new_task("send-1")).await;
    let records = f.record_count().await;
    let other_inputs = NewTask::new(
        key("send-1"),
        InputHash::of(["conversation-1", "another question"]),
    );
    match store.submit(other_inputs).await {
        Err(Error::KeyConflict { existing }) => assert_eq!(existing, original.id),
        other => panic!("expected KeyConflict, got {other:?}"),
    }
    assert_eq!(
        f.record_count().await,
        records,
        "a conflicting submission writes nothing"
    );
    assert_eq!(
        task(&*store, original.id).await,
        original,
        "the original task is untouched"
    );
}

/// Request keys are scoped: the same key under another scope or operation is independent.
pub async fn same_key_in_another_scope_or_operation_is_independent(f: &dyn Fixture) {
    let store = f.store();
    let hash = InputHash::of(["same inputs"]);
    let a = submit(
        &*store,
        NewTask::new(RequestKey::new("user-a", "chat.reply", "k"), hash),
    )
    .await;
    let b = submit(
        &*store,
        NewTask::new(RequestKey::new("user-b", "chat.reply", "k"), hash),
    )
    .await;
    let c = submit(
        &*store,
        NewTask::new(RequestKey::new("user-a", "doc.index", "k"), hash),
    )
    .await;
    assert_ne!(a.id, b.id, "another scope is another task");
    assert_ne!(a.id, c.id, "another operation is another task");
    // And a different input hash in another scope is no conflict either.
    let d = store
        .submit(NewTask::new(
            RequestKey::new("user-c", "chat.reply", "k"),
            InputHash::of(["other"]),
        ))
        .await
        .expect("no conflict across scopes");
    assert!(d.is_created());
}

/// Guarantee 4: a new key with identical inputs (Regenerate) is a new task.
pub async fn regenerate_with_new_key_is_new_work(f: &dyn Fixture) {
    let store = f.store();
    let hash = InputHash::of(["conversation-1", "message-7"]);
    let first = submit(&*store, NewTask::new(key("send-7"), hash)).await;
    let lease = acquire(&*store, first.id, "w").await;
    assert!(
        store
            .complete(lease, Response::from("first answer"))
            .await
            .unwrap()
            .is_accepted()
    );
    let regenerated = store
        .submit(NewTask::new(key("regenerate-7"), hash))
        .await
        .expect("submit");
    assert!(
        regenerated.is_created(),
        "regenerate is never deduplicated by input hash"
    );
    assert_ne!(regenerated.task().id, first.id);
    assert_eq!(regenerated.task().status, Status::Pending);
    assert_eq!(
        task(&*store, first.id).await.response,
        Some(Response::from("first answer")),
        "first reply unchanged"
    );
}

/// Guarantee 2 under a race: many concurrent duplicate submits make one task.
pub async fn concurrent_duplicate_submits_create_one_task(f: &dyn Fixture) {
    let store = f.store();
    let results = race(RACERS, |_| {
        let store = store.clone();
        async move { store.submit(new_task("send-race")).await.expect("submit") }
    })
    .await;
    let created = results.iter().filter(|s| s.is_created()).count();
    assert_eq!(created, 1, "exactly one submission creates the task");
    let id = results[0].task().id;
    assert!(
        results.iter().all(|s| s.task().id == id),
        "every submission sees the same task"
    );
}

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

/// Guarantee 5: after a takeover, every fenced write of the old lease says `Superseded`.
pub async fn superseded_lease_is_rejected_everywhere(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let mut old = acquire(&*store, t.id, "old").await;
    f.advance(PAST_LEASE).await;
    let _new = acquire(&*store, t.id, "new").await;
    let superseded = Rejection::Superseded { current_version: 2 };
    assert_eq!(
        store.renew(&mut old, LEASE).await.unwrap().rejection(),
        Some(&superseded),
        "renew"
    );
    assert_eq!(
        store.record_operation(&old, "op-1").await.unwrap().rejection(),
        Some(&superseded),
        "record_operation"
    );
    assert_eq!(
        store
            .fail(old.clone(), Failure::retryable("x"))
            .await
            .unwrap()
            .rejection(),
        Some(&superseded),
        "fail"
    );
    assert_eq!(
        store.release(old.clone()).await.unwrap().rejection(),
        Some(&superseded),
        "release"
    );
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

/// The seed's paused worker: it returns after a takeover with an answer, is
/// rejected, and the new worker's answer is the one saved.
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
        AttemptOutcome::Failed(crate::FailureKind::Ambiguous)
    );
    assert_eq!(attempts[0].error.as_deref(), Some("timeout after send"));
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

/// Release gives the task back at once; the attempt stays counted and the old lease is dead.
pub async fn release_gives_task_back_and_keeps_attempt(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let lease = acquire(&*store, t.id, "shutting-down").await;
    let kept = lease.clone();
    assert!(store.release(lease).await.unwrap().is_accepted());
    let released = task(&*store, t.id).await;
    assert_eq!((released.status, released.attempts()), (Status::Pending, 1));
    assert_eq!(
        store
            .complete(kept, Response::from("after release"))
            .await
            .unwrap()
            .rejection(),
        Some(&Rejection::NotRunning(Status::Pending))
    );
    let next = acquire(&*store, t.id, "next").await;
    assert_eq!(next.attempt(), 2, "no wait after a release, and it counted");
    assert_eq!(
        store.attempts(t.id).await.unwrap()[0].outcome,
        AttemptOutcome::Released
    );
}

/// Cancel is terminal; a worker still running the task is rejected with `NotRunning`.
pub async fn cancel_stops_running_worker(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let mut lease = acquire(&*store, t.id, "a").await;
    let cancelled = store
        .cancel(t.id, "user deleted the message")
        .await
        .unwrap()
        .accepted()
        .expect("accepted");
    assert_eq!(cancelled.status, Status::Cancelled);
    assert_eq!(cancelled.last_error.as_deref(), Some("user deleted the message"));
    let not_running = Rejection::NotRunning(Status::Cancelled);
    assert_eq!(
        store.renew(&mut lease, LEASE).await.unwrap().rejection(),
        Some(&not_running)
    );
    assert_eq!(
        store
            .complete(lease, Response::from("too late"))
            .await
            .unwrap()
            .rejection(),
        Some(&not_running)
    );
    assert!(matches!(
        store.claim(t.id, request("b")).await.unwrap(),
        Claim::Cancelled(_)
    ));
    assert!(
        store.cancel(t.id, "again").await.unwrap().is_accepted(),
        "cancel is idempotent"
    );

    let done = submit(&*store, new_task("send-2")).await;
    let lease = acquire(&*store, done.id, "a").await;
    assert!(
        store
            .complete(lease, Response::from("kept"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert!(matches!(
        store.cancel(done.id, "late").await.unwrap(),
        Fenced::Rejected(Rejection::AlreadyCompleted(_))
    ));
    assert_eq!(
        task(&*store, done.id).await.response,
        Some(Response::from("kept"))
    );
    assert!(matches!(
        store.cancel(TaskId::new(), "x").await,
        Err(Error::NotFound(_))
    ));
}

/// `record_operation` is durable and shows in `attempts`.
pub async fn record_operation_is_visible_in_attempts(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let lease = acquire(&*store, t.id, "a").await;
    assert!(
        store
            .record_operation(&lease, "provider-op-123")
            .await
            .unwrap()
            .is_accepted()
    );
    let attempts = store.attempts(t.id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].operation_id.as_deref(), Some("provider-op-123"));
    assert_eq!(attempts[0].id, lease.attempt_id());
}

/// `due` lists expired leases and passed backoffs, nothing else.
pub async fn due_lists_expired_leases_and_passed_backoffs(f: &dyn Fixture) {
    let store = f.store();
    let policy = RetryPolicy::default()
        .jitter(0.0)
        .initial_backoff(Duration::from_secs(10));
    let crashed = submit(&*store, new_task("crashed")).await;
    let backing_off = submit(&*store, new_task("backing-off").policy(policy)).await;
    let live = submit(&*store, new_task("live")).await;
    let done = submit(&*store, new_task("done")).await;
    let _fresh = submit(&*store, new_task("fresh")).await; // never claimed: its handoff covers it

    let _c = acquire(&*store, crashed.id, "a").await;
    let b = acquire(&*store, backing_off.id, "a").await;
    assert!(
        store
            .fail(b, Failure::retryable("busy"))
            .await
            .unwrap()
            .is_accepted()
    );
    let d = acquire(&*store, done.id, "a").await;
    assert!(
        store
            .complete(d, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert!(store.due(100).await.unwrap().is_empty(), "nothing is due yet");

    f.advance(Duration::from_secs(11)).await;
    assert_eq!(
        store.due(100).await.unwrap(),
        [backing_off.id],
        "the passed backoff"
    );
    f.advance(Duration::from_secs(10)).await;
    let mut live_lease = acquire(&*store, live.id, "b").await;
    f.advance(Duration::from_secs(10)).await;
    assert!(store.renew(&mut live_lease, LEASE).await.unwrap().is_accepted());
    let mut due = store.due(100).await.unwrap();
    due.sort();
    let mut expected = vec![crashed.id, backing_off.id];
    expected.sort();
    assert_eq!(
        due, expected,
        "the expired lease and the passed backoff, not the live one"
    );
    assert_eq!(store.due(1).await.unwrap().len(), 1, "the limit holds");
}

/// Guarantee 10: purge removes only expired terminal records; after it a replay is new work.
pub async fn purge_removes_only_expired_records(f: &dyn Fixture) {
    let store = f.store();
    let day = Duration::from_secs(24 * 3600);
    let short = submit(&*store, new_task("short").retention(day)).await;
    let long = submit(&*store, new_task("long").retention(30 * day)).await;
    let pending = submit(&*store, new_task("pending").retention(day)).await;
    for t in [&short, &long] {
        let lease = acquire(&*store, t.id, "a").await;
        assert!(
            store
                .complete(lease, Response::from("done"))
                .await
                .unwrap()
                .is_accepted()
        );
    }
    assert_eq!(store.purge_expired(100).await.unwrap(), 0, "nothing expired yet");
    f.advance(day + Duration::from_secs(1)).await;
    assert_eq!(
        store.purge_expired(100).await.unwrap(),
        1,
        "only the expired, terminal record"
    );
    assert!(store.get(short.id).await.unwrap().is_none());
    assert!(store.find(&key("short")).await.unwrap().is_none());
    assert!(store.attempts(short.id).await.unwrap().is_empty());
    assert!(
        store.get(long.id).await.unwrap().is_some(),
        "unexpired records stay"
    );
    assert!(
        store.get(pending.id).await.unwrap().is_some(),
        "live work is never purged"
    );
    // Documented, not accidental: a replay after purge is new work.
    let replay = store.submit(new_task("short")).await.unwrap();
    assert!(replay.is_created());
    assert_ne!(replay.task().id, short.id);
    assert_eq!(store.purge_expired(100).await.unwrap(), 0);
}

/// Unknown ids: claim answers `NotFound`, fenced writes and cancel fail with `Error::NotFound`.
pub async fn unknown_task_is_not_found(f: &dyn Fixture) {
    let store = f.store();
    let unknown = TaskId::new();
    assert!(matches!(
        store.claim(unknown, request("a")).await.unwrap(),
        Claim::NotFound
    ));
    assert!(store.get(unknown).await.unwrap().is_none());
    assert!(store.attempts(unknown).await.unwrap().is_empty());
    // A lease from another store: its task does not exist here.
    let other = super::MemoryFixture::new();
    let foreign_task = submit(&*other.store(), new_task("elsewhere")).await;
    let foreign = acquire(&*other.store(), foreign_task.id, "a").await;
    let records = f.record_count().await;
    assert!(
        matches!(store.complete(foreign, Response::from("x")).await, Err(Error::NotFound(id)) if id == foreign_task.id)
    );
    assert_eq!(f.record_count().await, records);
}

/// Quotes, SQL metacharacters, backslashes and non-ASCII text are data, stored verbatim.
pub async fn strings_are_stored_verbatim(f: &dyn Fixture) {
    let store = f.store();
    let nasty = "'; DROP TABLE tasks; -- \\ \" % _ $1 ∂ 日本 🚀";
    let k = RequestKey::new(nasty, nasty, nasty);
    let t = submit(
        &*store,
        NewTask::new(k.clone(), InputHash::of([nasty])).payload(nasty.as_bytes().to_vec()),
    )
    .await;
    let found = store.find(&k).await.unwrap().expect("found by the same strings");
    assert_eq!(found.key, k);
    assert_eq!(found.payload, nasty.as_bytes());
    let lease = acquire(&*store, t.id, nasty).await;
    assert!(store.record_operation(&lease, nasty).await.unwrap().is_accepted());
    let response = Response::new(vec![0u8, 159, 146, 150, 255]); // not UTF-8: bytes are bytes
    assert!(
        store
            .complete(lease, response.clone())
            .await
            .unwrap()
            .is_accepted()
    );
    let done = task(&*store, t.id).await;
    assert_eq!(done.response, Some(response));
    let attempt = &store.attempts(t.id).await.unwrap()[0];
    assert_eq!(
        (attempt.worker.as_str(), attempt.operation_id.as_deref()),
        (nasty, Some(nasty))
    );
}

/// One scope can never find, claim-by-key or complete another scope's task by key.
pub async fn scopes_are_isolated(f: &dyn Fixture) {
    let store = f.store();
    let hash = InputHash::of(["private question"]);
    let alice = submit(
        &*store,
        NewTask::new(RequestKey::new("alice", "chat.reply", "k-1"), hash),
    )
    .await;
    assert!(
        store
            .find(&RequestKey::new("bob", "chat.reply", "k-1"))
            .await
            .unwrap()
            .is_none(),
        "bob cannot find alice's key"
    );
    assert!(
        store
            .find(&RequestKey::new("Alice", "chat.reply", "k-1"))
            .await
            .unwrap()
            .is_none(),
        "scopes are exact"
    );
    // Bob submitting alice's key and inputs gets his own task, never hers.
    let bob = submit(
        &*store,
        NewTask::new(RequestKey::new("bob", "chat.reply", "k-1"), hash),
    )
    .await;
    assert_ne!(bob.id, alice.id);
    let lease = acquire(&*store, bob.id, "w").await;
    assert!(
        store
            .complete(lease, Response::from("bob's reply"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(
        task(&*store, alice.id).await.status,
        Status::Pending,
        "alice's task untouched"
    );
    assert_eq!(
        store.find(&alice.key).await.unwrap().map(|t| t.id),
        Some(alice.id)
    );
}

/// Guarantee 11: the bad-input catalogue. Each gets a typed error, and nothing is written.
pub async fn bad_input_is_rejected_and_writes_nothing(f: &dyn Fixture) {
    let store = f.store();
    let long = |n: usize| "k".repeat(n + 1);
    let hash = InputHash::of(["x"]);
    let with_key = |scope: &str, op: &str, k: &str| NewTask::new(RequestKey::new(scope, op, k), hash);
    let bad_submissions: Vec<(&str, NewTask)> = vec![
        ("empty key", with_key("s", "op", "")),
        ("whitespace key", with_key("s", "op", " \t ")),
        ("oversized key", with_key("s", "op", &long(limits::MAX_KEY_LEN))),
        ("NUL in key", with_key("s", "op", "a\0b")),
        ("control character in key", with_key("s", "op", "a\u{1b}[31m")),
        ("empty scope", with_key("", "op", "k")),
        (
            "oversized scope",
            with_key(&long(limits::MAX_SCOPE_LEN), "op", "k"),
        ),
        ("NUL in scope", with_key("s\0", "op", "k")),
        ("empty operation", with_key("s", "", "k")),
        (
            "oversized operation",
            with_key("s", &long(limits::MAX_OPERATION_LEN), "k"),
        ),
        ("NUL in operation", with_key("s", "o\0p", "k")),
        (
            "oversized payload",
            new_task("k").payload(vec![0u8; limits::MAX_PAYLOAD_LEN + 1]),
        ),
        ("zero retention", new_task("k").retention(Duration::ZERO)),
        ("absurd retention", new_task("k").retention(Duration::MAX)),
        (
            "max_attempts = 0",
            new_task("k").policy(RetryPolicy::default().max_attempts(0)),
        ),
        (
            "huge max_attempts",
            new_task("k").policy(RetryPolicy::default().max_attempts(u32::MAX)),
        ),
        (
            "zero initial backoff",
            new_task("k").policy(RetryPolicy::default().initial_backoff(Duration::ZERO)),
        ),
        (
            "absurd max backoff",
            new_task("k").policy(RetryPolicy::default().max_backoff(Duration::MAX)),
        ),
        (
            "zero deadline",
            new_task("k").policy(RetryPolicy::default().deadline(Duration::ZERO)),
        ),
        (
            "absurd deadline",
            new_task("k").policy(RetryPolicy::default().deadline(Duration::MAX)),
        ),
        (
            "NaN multiplier",
            new_task("k").policy(RetryPolicy::default().multiplier(f64::NAN)),
        ),
        (
            "shrinking multiplier",
            new_task("k").policy(RetryPolicy::default().multiplier(0.5)),
        ),
        (
            "jitter above 1",
            new_task("k").policy(RetryPolicy::default().jitter(2.0)),
        ),
        (
            "negative jitter",
            new_task("k").policy(RetryPolicy::default().jitter(-0.5)),
        ),
    ];
    let records = f.record_count().await;
    for (what, bad) in bad_submissions {
        let err = store.submit(bad).await.expect_err(what);
        assert!(
            matches!(err, Error::InvalidInput(_)),
            "{what}: expected InvalidInput, got {err:?}"
        );
        assert_eq!(f.record_count().await, records, "{what}: nothing written");
    }
    assert!(
        matches!(
            store.find(&RequestKey::new("s", "op", "a\0b")).await,
            Err(Error::InvalidInput(_))
        ),
        "find with NUL"
    );

    // Bad input on a live task leaves it exactly as it was.
    let t = submit(&*store, new_task("valid")).await;
    let records = f.record_count().await;
    for (what, req) in [
        ("blank worker", ClaimRequest::new(" ", LEASE)),
        ("NUL worker", ClaimRequest::new("w\0", LEASE)),
        ("zero lease", ClaimRequest::new("w", Duration::ZERO)),
        ("absurd lease", ClaimRequest::new("w", Duration::MAX)),
        (
            "lease beyond the limit",
            ClaimRequest::new("w", limits::MAX_LEASE + Duration::from_secs(1)),
        ),
    ] {
        let err = store.claim(t.id, req).await.expect_err(what);
        assert!(matches!(err, Error::InvalidInput(_)), "{what}: {err:?}");
    }
    assert_eq!(f.record_count().await, records, "refused claims write nothing");
    assert_eq!(
        task(&*store, t.id).await,
        t,
        "refused claims leave the task as it was"
    );

    let mut lease = acquire(&*store, t.id, "w").await;
    let snapshot = task(&*store, t.id).await;
    let records = f.record_count().await;
    let invalid = |r: Result<Fenced<()>, Error>| matches!(r, Err(Error::InvalidInput(_)));
    assert!(
        invalid(store.renew(&mut lease, Duration::ZERO).await),
        "zero renewal"
    );
    assert!(
        invalid(store.renew(&mut lease, Duration::MAX).await),
        "absurd renewal"
    );
    assert!(
        invalid(store.record_operation(&lease, "").await),
        "empty operation id"
    );
    assert!(
        invalid(store.record_operation(&lease, "op\0").await),
        "NUL operation id"
    );
    assert!(
        invalid(
            store
                .record_operation(&lease, &long(limits::MAX_OPERATION_ID_LEN))
                .await
        ),
        "oversized operation id"
    );
    let oversized = Response::new(vec![b'x'; limits::MAX_RESPONSE_LEN + 1]);
    assert!(
        matches!(
            store.complete(lease.clone(), oversized).await,
            Err(Error::InvalidInput(_))
        ),
        "oversized response"
    );
    assert!(
        matches!(
            store.fail(lease.clone(), Failure::retryable("a\0b")).await,
            Err(Error::InvalidInput(_))
        ),
        "NUL failure message"
    );
    assert!(
        matches!(store.cancel(t.id, "why\0").await, Err(Error::InvalidInput(_))),
        "NUL cancel reason"
    );
    assert!(
        matches!(store.due(0).await, Err(Error::InvalidInput(_))),
        "due(0)"
    );
    assert!(
        matches!(store.purge_expired(0).await, Err(Error::InvalidInput(_))),
        "purge_expired(0)"
    );
    assert_eq!(f.record_count().await, records, "refused writes add nothing");
    assert_eq!(
        task(&*store, t.id).await,
        snapshot,
        "refused writes change nothing"
    );
    assert_eq!(store.attempts(t.id).await.unwrap()[0].operation_id, None);

    // A forged version is refused like any stale one.
    let forged = Lease::new(
        Task {
            version: 99,
            ..snapshot.clone()
        },
        lease.attempt_id(),
        "forger".into(),
        lease.expires_at(),
    );
    assert_eq!(
        store
            .complete(forged, Response::from("forged"))
            .await
            .unwrap()
            .rejection(),
        Some(&Rejection::Superseded { current_version: 1 })
    );
    assert_eq!(task(&*store, t.id).await, snapshot);
}
