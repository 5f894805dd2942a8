//! The store as the queue: `claim_next` hands out exactly the tasks that
//! need a worker, oldest due first, each to one caller; `renew_many` renews
//! a consumer's held leases, each fenced alone.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::error::{Error, InvalidInput};
use crate::limits;
use crate::policy::{Failure, RetryPolicy};
use crate::store::{ClaimNext, Rejection};
use crate::task::{Response, Status};
use crate::testing::{Fixture, race};

/// A `claim_next` for `worker`, up to `limit` leases of [`LEASE`].
fn next(worker: &str, limit: usize) -> ClaimNext {
    ClaimNext::new(worker, LEASE, limit)
}

/// The tasks' ids, in the order given.
fn ids(leases: &[Lease]) -> Vec<TaskId> {
    leases.iter().map(Lease::task_id).collect()
}

/// Due tasks come out oldest first, up to the limit, each once; every lease
/// is a claim's (version 1, running, the worker recorded, an attempt counted).
pub async fn claim_next_hands_out_due_tasks_oldest_first(f: &dyn Fixture) {
    let store = f.store();
    let mut submitted = Vec::new();
    for key in ["first", "second", "third"] {
        submitted.push(submit(&*store, new_task(key)).await.id);
        f.advance(Duration::from_secs(1)).await;
    }
    let taken = store.claim_next(next("w", 2)).await.unwrap();
    assert_eq!(ids(&taken), submitted[..2], "the two oldest, oldest first");
    for lease in &taken {
        assert_eq!((lease.version(), lease.worker()), (1, "w"));
        let t = task(&*store, lease.task_id()).await;
        assert_eq!((t.status, t.attempts()), (Status::Running, 1));
    }
    let rest = store.claim_next(next("w", 10)).await.unwrap();
    assert_eq!(ids(&rest), submitted[2..], "the rest, and only once");
    assert!(
        store.claim_next(next("w", 10)).await.unwrap().is_empty(),
        "nothing is due now"
    );
}

/// Only tasks that need a worker come out: not a live lease, a backoff
/// still running, or a completed, failed or cancelled task. Once the
/// backoff passes and the lease expires, those two come out (the expired
/// one as a takeover, the next version), oldest due first.
pub async fn claim_next_skips_tasks_that_need_no_worker(f: &dyn Fixture) {
    let store = f.store();
    let policy = RetryPolicy::default()
        .jitter(0.0)
        .initial_backoff(Duration::from_secs(10));
    let held = submit(&*store, new_task("held")).await;
    let backing_off = submit(&*store, new_task("backing-off").policy(policy)).await;
    let completed = submit(&*store, new_task("completed")).await;
    let failed = submit(&*store, new_task("failed")).await;
    let cancelled = submit(&*store, new_task("cancelled")).await;

    let _held = acquire(&*store, held.id, "a").await;
    let lease = acquire(&*store, backing_off.id, "a").await;
    fail_accepted(&*store, lease, Failure::retryable("429")).await;
    let lease = acquire(&*store, completed.id, "a").await;
    assert!(
        store
            .complete(lease, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );
    let lease = acquire(&*store, failed.id, "a").await;
    fail_accepted(&*store, lease, Failure::permanent("400")).await;
    assert!(store.cancel(cancelled.id, "gone").await.unwrap().is_accepted());
    let before = f.record_count().await;

    assert!(
        store.claim_next(next("b", 10)).await.unwrap().is_empty(),
        "no task needs a worker"
    );
    assert_eq!(
        f.record_count().await,
        before,
        "an empty claim_next wrote nothing"
    );

    f.advance(Duration::from_secs(11)).await;
    let retried = store.claim_next(next("b", 10)).await.unwrap();
    assert_eq!(ids(&retried), [backing_off.id], "the passed backoff");
    assert_eq!(retried[0].attempt(), 2);

    f.advance(PAST_LEASE).await;
    let taken = store.claim_next(next("b", 10)).await.unwrap();
    assert_eq!(
        ids(&taken),
        [held.id, backing_off.id],
        "both expired leases, the older first"
    );
    assert_eq!(taken[0].version(), 2, "a takeover is the next assignment");
}

/// A due task whose budget is spent is failed, not handed out, exactly as a
/// claim would decide it; the next due task still comes out.
pub async fn claim_next_fails_a_spent_budget_instead(f: &dyn Fixture) {
    let store = f.store();
    let once = new_task("once").policy(RetryPolicy::default().max_attempts(1));
    let once = submit(&*store, once).await;
    let _crashed = acquire(&*store, once.id, "a").await;
    f.advance(PAST_LEASE).await;
    let fresh = submit(&*store, new_task("fresh")).await;

    let taken = store.claim_next(next("b", 10)).await.unwrap();
    assert_eq!(ids(&taken), [fresh.id], "the spent task is not handed out");
    let spent = task(&*store, once.id).await;
    assert_eq!((spent.status, spent.attempts()), (Status::Failed, 1));
    assert!(store.claim_next(next("b", 10)).await.unwrap().is_empty());
}

/// Operations and scopes restrict what comes out: one deployment's several
/// queues share one store.
pub async fn claim_next_takes_only_the_operations_and_scopes_asked_for(f: &dyn Fixture) {
    let store = f.store();
    let reply = submit(&*store, new_task("reply")).await;
    let index = submit(
        &*store,
        NewTask::new(
            RequestKey::new(crate::testing::SCOPE, "doc.index", "d1"),
            InputHash::of(["d1"]),
        ),
    )
    .await;
    let other_tenant = submit(
        &*store,
        NewTask::new(
            RequestKey::new("tenant-b", crate::testing::OPERATION, "r9"),
            InputHash::of(["r9"]),
        ),
    )
    .await;

    let indexing = store
        .claim_next(next("w", 10).operation("doc.index"))
        .await
        .unwrap();
    assert_eq!(ids(&indexing), [index.id]);
    let tenant_b = store.claim_next(next("w", 10).scope("tenant-b")).await.unwrap();
    assert_eq!(ids(&tenant_b), [other_tenant.id]);
    let both = next("w", 10)
        .scope(crate::testing::SCOPE)
        .operation(crate::testing::OPERATION)
        .operation("doc.index");
    assert_eq!(ids(&store.claim_next(both).await.unwrap()), [reply.id]);
}

/// A released task is due again at once: `due` lists it and `claim_next`
/// hands it out, its attempt counted.
pub async fn released_task_is_due_and_handed_out_again(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("released")).await;
    let lease = store.claim_next(next("a", 1)).await.unwrap().remove(0);
    assert!(store.release(lease).await.unwrap().is_accepted());
    assert_eq!(
        store.due(10).await.unwrap(),
        [t.id],
        "a released task needs a worker"
    );
    let again = store.claim_next(next("b", 1)).await.unwrap();
    assert_eq!(ids(&again), [t.id]);
    assert_eq!((again[0].attempt(), again[0].worker()), (2, "b"));
}

/// Many callers at once drain a queue: every task is handed out exactly
/// once, none is left behind.
pub async fn concurrent_claim_next_hands_each_task_out_once(f: &dyn Fixture) {
    const TASKS: usize = 60;
    const CALLERS: usize = 8;
    let store = f.store();
    let mut submitted = HashSet::new();
    for i in 0..TASKS {
        submitted.insert(submit(&*store, new_task(&format!("q-{i}"))).await.id);
    }
    let answers = race(CALLERS, |i| {
        let store = Arc::clone(&store);
        async move {
            let mut mine = Vec::new();
            loop {
                let taken = store.claim_next(next(&format!("w{i}"), 4)).await.unwrap();
                if taken.is_empty() {
                    return mine;
                }
                mine.extend(ids(&taken));
            }
        }
    })
    .await;
    let handed: Vec<TaskId> = answers.into_iter().flatten().collect();
    let distinct: HashSet<TaskId> = handed.iter().copied().collect();
    assert_eq!(handed.len(), distinct.len(), "no task was handed out twice");
    assert_eq!(distinct, submitted, "every task was handed out");
    for id in submitted {
        assert_eq!(task(&*store, id).await.attempts(), 1, "one attempt each");
    }
}

/// Each lease of a `renew_many` is fenced on its own: the live one is
/// renewed (its expiry moved in place), the superseded one refused, in order.
pub async fn renew_many_fences_each_lease_on_its_own(f: &dyn Fixture) {
    let store = f.store();
    let live = submit(&*store, new_task("live")).await;
    let lost = submit(&*store, new_task("lost")).await;
    let superseded = acquire(&*store, lost.id, "a").await;
    f.advance(PAST_LEASE).await;
    let _taken_over = acquire(&*store, lost.id, "b").await;
    let live_lease = acquire(&*store, live.id, "a").await;
    let before = live_lease.expires_at();
    f.advance(Duration::from_secs(5)).await;

    let mut held = [live_lease, superseded];
    let answers = store.renew_many(&mut held, LEASE).await.unwrap();
    assert!(answers[0].is_accepted(), "{answers:?}");
    assert!(
        held[0].expires_at() > before,
        "the accepted renewal moved the expiry in place"
    );
    assert_eq!(
        answers[1].rejection(),
        Some(&Rejection::Superseded { current_version: 2 }),
        "taken over by b"
    );
    assert!(store.renew_many(&mut [], LEASE).await.unwrap().is_empty());
}

/// Bad input to `claim_next` and `renew_many` is a typed error and writes
/// nothing: a zero or too large limit, a blank worker, too many filters, a
/// lease twice in one batch.
pub async fn bad_claim_next_and_renew_many_are_refused_and_write_nothing(f: &dyn Fixture) {
    let store = f.store();
    let t = submit(&*store, new_task("send-1")).await;
    let before = f.record_count().await;
    let refused = [
        next("w", 0),
        next("w", limits::MAX_BATCH + 1),
        next("", 1),
        ClaimNext::new("w", Duration::ZERO, 1),
        next("w", 1).operation(""),
        (0..=limits::MAX_FILTERS).fold(next("w", 1), |n, i| n.scope(format!("s{i}"))),
    ];
    for request in refused {
        let answer = store.claim_next(request.clone()).await;
        assert!(
            matches!(answer, Err(Error::InvalidInput(_))),
            "{request:?}: {answer:?}"
        );
    }
    assert_eq!(f.record_count().await, before, "refused claim_next wrote nothing");
    assert_eq!(task(&*store, t.id).await.attempts(), 0);

    let lease = acquire(&*store, t.id, "w").await;
    let expires_at = task(&*store, t.id).await.lease_until;
    let mut twice = [lease.clone(), lease.clone()];
    assert!(matches!(
        store.renew_many(&mut twice, LEASE).await,
        Err(Error::InvalidInput(InvalidInput::DuplicateInBatch { .. }))
    ));
    assert!(matches!(
        store
            .renew_many(&mut [lease], limits::MAX_LEASE + Duration::from_secs(1))
            .await,
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(
        task(&*store, t.id).await.lease_until,
        expires_at,
        "no lease moved"
    );
}
