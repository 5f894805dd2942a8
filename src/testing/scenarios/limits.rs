//! Limits that hold across every worker: a concurrency key never runs more
//! than its limit of tasks, its slots are leases (they come back when a
//! lease expires; a superseded assignment frees nothing), a limit-1 key runs
//! in submission order; a rate bucket gives its burst, then its rate, and a
//! drain stops everyone. A claim refused for a limit writes nothing and
//! costs no attempt. Run by [`limits_suite!`](crate::testing::limits_suite)
//! on a store that [decides limits](crate::backend::Backend::decides_limits).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::error::{Error, InvalidInput};
use crate::policy::{Failure, RetryPolicy};
use crate::store::{ClaimNext, Rejection, ReopenRequest};
use crate::task::{Response, Status};
use crate::testing::{Fixture, InspectFixture, race};
use crate::throttle::{self, ConcurrencyKey, RateBucket, Throttled};

fn keyed(key: &str, name: &str, limit: u32) -> NewTask {
    new_task(key).concurrency(ConcurrencyKey::new(name, limit))
}

fn bucketed(key: &str, bucket: &str) -> NewTask {
    new_task(key).rate_bucket(bucket)
}

fn next(worker: &str, limit: usize) -> ClaimNext {
    ClaimNext::new(worker, LEASE, limit)
}

async fn throttled(store: &dyn TaskStore, id: TaskId) -> Throttled {
    match store.claim(id, request("w")).await.unwrap() {
        Claim::Throttled(why) => why,
        other => panic!("expected a claim refused for a limit, got {}", other.label()),
    }
}

/// Racing `claim_next` calls of many workers never start more tasks of a
/// key than its limit; the tasks that wait were not claimed (version 0, no
/// attempt), and a claim by id is refused with the key and its limit.
pub async fn a_concurrency_key_never_runs_more_than_its_limit(f: &dyn InspectFixture) {
    let store = f.store();
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(
            submit(&*store, keyed(&format!("t{i}"), "tenant-acme", 2))
                .await
                .id,
        );
    }
    let shared = Arc::clone(&store);
    let taken: Vec<Lease> = race(RACERS, move |i| {
        let store = Arc::clone(&shared);
        async move { store.claim_next(next(&format!("w{i}"), 3)).await.unwrap() }
    })
    .await
    .into_iter()
    .flatten()
    .collect();
    assert_eq!(taken.len(), 2, "the limit, across every racing worker");
    let slots = f.inspector().concurrency("tenant-acme").await.unwrap();
    assert_eq!(slots.running.len(), 2);
    assert_eq!(slots.waiting, 6);
    let running: HashSet<TaskId> = taken.iter().map(Lease::task_id).collect();
    let waiting = ids.iter().find(|id| !running.contains(id)).copied().unwrap();
    assert_eq!(
        throttled(&*store, waiting).await,
        Throttled::Concurrency {
            key: "tenant-acme".into(),
            limit: 2
        }
    );
    let t = task(&*store, waiting).await;
    assert_eq!(
        (t.status, t.version, t.attempts()),
        (Status::Pending, 0, 0),
        "nothing written"
    );
}

/// A slot is a lease: when a worker dies holding one, the slot comes back as
/// its lease expires, and no more than the limit run afterwards either.
pub async fn a_slot_comes_back_when_its_lease_expires(f: &dyn InspectFixture) {
    let store = f.store();
    for i in 0..3 {
        submit(&*store, keyed(&format!("t{i}"), "k", 2)).await;
        f.advance(Duration::from_millis(10)).await;
    }
    let crashed = store.claim_next(next("crashed", 10)).await.unwrap();
    assert_eq!(crashed.len(), 2);
    assert!(
        store.claim_next(next("w", 10)).await.unwrap().is_empty(),
        "both slots held"
    );
    f.advance(PAST_LEASE).await;
    let after = store.claim_next(next("w", 10)).await.unwrap();
    assert_eq!(
        after.len(),
        2,
        "the dead worker's slots came back, and only those"
    );
    let slots = f.inspector().concurrency("k").await.unwrap();
    let mut running = slots.running.clone();
    running.sort();
    let mut holders: Vec<TaskId> = after.iter().map(Lease::task_id).collect();
    holders.sort();
    assert_eq!(running, holders, "the slots are held by the new leases");
}

/// A superseded assignment's completion, release or unstarted release is
/// refused, and frees no slot: the key still runs its limit, and the next
/// task waits until the current holder completes.
pub async fn a_superseded_worker_frees_no_slot(f: &dyn InspectFixture) {
    let store = f.store();
    let a = submit(&*store, keyed("a", "k", 2)).await.id;
    let b = submit(&*store, keyed("b", "k", 2)).await.id;
    let c = submit(&*store, keyed("c", "k", 2)).await.id;
    let stale = acquire(&*store, a, "paused").await;
    f.advance(Duration::from_secs(20)).await;
    let b_lease = acquire(&*store, b, "w").await;
    f.advance(Duration::from_secs(15)).await; // a's lease has expired, b's has not
    let current = acquire(&*store, a, "w").await;
    let superseded = Some(Rejection::Superseded { current_version: 2 });
    assert_eq!(
        store
            .complete(stale.clone(), Response::from("late"))
            .await
            .unwrap()
            .rejection(),
        superseded.as_ref()
    );
    assert_eq!(
        store.release(stale.clone()).await.unwrap().rejection(),
        superseded.as_ref()
    );
    assert_eq!(
        store.release_unstarted(stale).await.unwrap().rejection(),
        superseded.as_ref()
    );
    assert_eq!(
        throttled(&*store, c).await,
        Throttled::Concurrency {
            key: "k".into(),
            limit: 2
        },
        "the stale writes freed nothing"
    );
    assert!(
        store
            .complete(current, Response::from("a"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert!(
        store.claim(c, request("w")).await.unwrap().is_acquired(),
        "a real completion frees a slot"
    );
    assert!(
        store
            .complete(b_lease, Response::from("b"))
            .await
            .unwrap()
            .is_accepted()
    );
}

/// A limit-1 key runs its tasks one at a time in submission order. A task
/// that fails and retries keeps its place: the next waits through its
/// backoff and starts once it completes; a cancelled task lets the next go.
pub async fn an_in_order_key_runs_in_submission_order_through_a_retry(f: &dyn InspectFixture) {
    let store = f.store();
    let policy = RetryPolicy::default()
        .jitter(0.0)
        .initial_backoff(Duration::from_secs(10));
    let mut ids = Vec::new();
    for i in 0..3 {
        // Submitted in one instant: submission order, not the clock, decides.
        ids.push(
            submit(
                &*store,
                keyed(&format!("m{i}"), "conversation-7", 1).policy(policy),
            )
            .await
            .id,
        );
    }
    let first = store.claim_next(next("w", 10)).await.unwrap();
    assert_eq!(first.iter().map(Lease::task_id).collect::<Vec<_>>(), [ids[0]]);
    fail_accepted(
        &*store,
        first.into_iter().next().unwrap(),
        Failure::retryable("provider down"),
    )
    .await;
    assert!(
        store.claim_next(next("w", 10)).await.unwrap().is_empty(),
        "the next waits for the retry"
    );
    assert_eq!(
        throttled(&*store, ids[1]).await,
        Throttled::InOrder {
            key: "conversation-7".into(),
            behind: ids[0]
        }
    );
    f.advance(Duration::from_secs(11)).await;
    let retry = store.claim_next(next("w", 10)).await.unwrap();
    assert_eq!(
        retry.iter().map(Lease::task_id).collect::<Vec<_>>(),
        [ids[0]],
        "the retry first"
    );
    assert!(
        store
            .complete(retry.into_iter().next().unwrap(), Response::from("1"))
            .await
            .unwrap()
            .is_accepted()
    );
    let second = store.claim_next(next("w", 10)).await.unwrap();
    assert_eq!(second.iter().map(Lease::task_id).collect::<Vec<_>>(), [ids[1]]);
    assert!(
        store
            .cancel(ids[1], "user deleted it")
            .await
            .unwrap()
            .is_accepted()
    );
    let third = store.claim_next(next("w", 10)).await.unwrap();
    assert_eq!(
        third.iter().map(Lease::task_id).collect::<Vec<_>>(),
        [ids[2]],
        "a cancelled task lets the next go"
    );
}

/// A reopened task of a limit-1 key is unfinished again: it keeps its place
/// in its key's order, so it goes before the younger task of its key that
/// has not started (a claim of that one is refused behind it, and
/// `claim_next` offers the reopened one).
pub async fn a_reopened_task_goes_before_its_keys_younger_tasks(f: &dyn InspectFixture) {
    let store = f.store();
    let mut ids = Vec::new();
    for k in ["m1", "m2", "m3"] {
        ids.push(submit(&*store, keyed(k, "conversation-7", 1)).await.id);
    }
    let first = acquire(&*store, ids[0], "w").await;
    fail_accepted(&*store, first, Failure::permanent("bad input")).await;
    let second = acquire(&*store, ids[1], "w").await;
    assert!(
        store
            .complete(second, Response::from("2"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert!(
        store
            .reopen(ids[0], ReopenRequest::new("ops", "input fixed"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(
        throttled(&*store, ids[2]).await,
        Throttled::InOrder {
            key: "conversation-7".into(),
            behind: ids[0]
        },
        "the reopened task first"
    );
    let next = store.claim_next(next("w", 10)).await.unwrap();
    assert_eq!(next.iter().map(Lease::task_id).collect::<Vec<_>>(), [ids[0]]);
}

/// `claim_next` goes round-robin by key: a key with many due tasks and a
/// key with one each get their oldest offered before either gets a second,
/// and a task over its key's limit is skipped, not claimed and released.
pub async fn claim_next_is_fair_across_keys(f: &dyn InspectFixture) {
    let store = f.store();
    let mut busy = Vec::new();
    for i in 0..6 {
        busy.push(
            submit(&*store, keyed(&format!("big{i}"), "tenant-big", 100))
                .await
                .id,
        );
        f.advance(Duration::from_millis(10)).await;
    }
    let small = submit(&*store, keyed("small", "tenant-small", 100)).await.id;
    let taken = store.claim_next(next("w", 2)).await.unwrap();
    let mut got: Vec<TaskId> = taken.iter().map(Lease::task_id).collect();
    got.sort();
    let mut want = vec![busy[0], small];
    want.sort();
    assert_eq!(got, want, "the big key's oldest and the small key's only task");
    let rest = store.claim_next(next("w", 10)).await.unwrap();
    assert_eq!(rest.len(), 5, "then the big key's others");
    for id in &busy[1..] {
        assert_eq!(task(&*store, *id).await.attempts(), 1);
    }
}

/// A bucket gives its burst at once, then one token per interval; a claim
/// without a token is refused with when the next is due, writes nothing and
/// costs no attempt.
pub async fn a_rate_bucket_gives_its_burst_then_its_rate(f: &dyn InspectFixture) {
    let store = f.store();
    store
        .define_bucket(RateBucket::per_minute("provider", 60).burst(2))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(submit(&*store, bucketed(&format!("t{i}"), "provider")).await.id);
    }
    assert_eq!(
        store.claim_next(next("w", 10)).await.unwrap().len(),
        2,
        "the burst"
    );
    let before = f.inspector().buckets().await.unwrap();
    assert_eq!(before.len(), 1);
    let waiting = task(&*store, ids[2]).await;
    let Throttled::Rate { bucket, next: due } = throttled(&*store, waiting.id).await else {
        panic!("a token is missing, not a slot");
    };
    assert_eq!(bucket, "provider");
    assert!(due > waiting.created_at, "the next token is in the future");
    let after = task(&*store, waiting.id).await;
    assert_eq!(
        (after.version, after.attempts()),
        (0, 0),
        "waiting for a token costs no attempt"
    );
    assert_eq!(
        f.inspector().buckets().await.unwrap(),
        before,
        "a refused claim takes no token"
    );
    f.advance(Duration::from_secs(1)).await;
    assert_eq!(
        store.claim_next(next("w", 10)).await.unwrap().len(),
        1,
        "one token a second"
    );
    f.advance(Duration::from_secs(1)).await;
    assert_eq!(store.claim_next(next("w", 10)).await.unwrap().len(), 1);
}

/// A drained bucket (a provider's 429 with Retry-After) gives no token to
/// any worker until then, and afterwards its steady rate without a burst.
pub async fn a_drained_bucket_stops_every_worker_until_retry_after(f: &dyn InspectFixture) {
    let store = f.store();
    store
        .define_bucket(RateBucket::per_second("provider", 10).burst(10))
        .await
        .unwrap();
    for i in 0..5 {
        submit(&*store, bucketed(&format!("t{i}"), "provider")).await;
    }
    let drained = store
        .drain_bucket("provider", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the bucket is defined");
    assert_eq!(drained.bucket.name(), "provider");
    assert!(store.claim_next(next("a", 10)).await.unwrap().is_empty());
    assert!(
        store.claim_next(next("b", 10)).await.unwrap().is_empty(),
        "every worker"
    );
    f.advance(Duration::from_secs(30)).await;
    assert_eq!(
        store.claim_next(next("a", 10)).await.unwrap().len(),
        1,
        "no burst after a drain"
    );
    f.advance(Duration::from_millis(100)).await;
    assert_eq!(
        store.claim_next(next("b", 10)).await.unwrap().len(),
        1,
        "then the steady rate"
    );
    assert!(
        store
            .drain_bucket("nonesuch", Duration::from_secs(1))
            .await
            .unwrap()
            .is_none(),
        "an unknown bucket is told, not created"
    );
}

/// Bad limits are typed errors and write nothing: limit 0, a rate of 0, a
/// burst over the rate, names over the size limit, a bucket never defined,
/// a drain of no time.
pub async fn bad_limits_are_refused_and_write_nothing(f: &dyn InspectFixture) {
    let store = f.store();
    let before = f.record_count().await;
    let long = "k".repeat(throttle::MAX_NAME_LEN + 1);
    for bad in [
        keyed("a", "k", 0),
        keyed("a", &long, 1),
        keyed("a", "k", throttle::MAX_CONCURRENCY + 1),
        bucketed("a", &long),
        bucketed("a", " "),
    ] {
        let err = store.submit(bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    }
    let err = store.submit(bucketed("a", "never-defined")).await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::UnknownBucket { ref bucket }) if bucket == "never-defined"),
        "{err}"
    );
    for bad in [
        RateBucket::per_minute("b", 0),
        RateBucket::per_minute("b", 10).burst(11),
        RateBucket::per_minute("b", 10).burst(0),
        RateBucket::new("b", 10, Duration::ZERO),
        RateBucket::per_minute(&long, 10),
    ] {
        let err = store.define_bucket(bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    }
    assert!(
        f.inspector().buckets().await.unwrap().is_empty(),
        "no bucket was defined"
    );
    for retry_after in [Duration::ZERO, throttle::MAX_DRAIN * 2] {
        let err = store.drain_bucket("b", retry_after).await.unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    }
    assert_eq!(f.record_count().await, before, "no task was written");
}

/// Every store either keeps a task's limits with it (the concurrency key,
/// its limit and the bucket read back as submitted) or refuses the task
/// with [`Error::Unsupported`] and writes nothing: no store ignores a limit,
/// whether the task comes alone or in a batch (`submit_many`). In the main
/// conformance suite, so it runs on every backend.
pub async fn limits_are_kept_or_refused_never_ignored(f: &dyn Fixture) {
    let store = f.store();
    let key = ConcurrencyKey::new("conversation-7", 1);
    let before = f.record_count().await;
    let alone = store.submit(keyed("m1", "conversation-7", 1)).await;
    let mut batch = store
        .submit_many(vec![keyed("m2", "conversation-7", 1)])
        .await
        .expect("a valid batch is answered item by item");
    for answer in [alone, batch.remove(0)] {
        match answer {
            Ok(submitted) => {
                let stored = task(&*store, submitted.task().id).await;
                assert_eq!(
                    stored.limits.concurrency.as_ref(),
                    Some(&key),
                    "the key and its limit are kept"
                );
            }
            Err(Error::Unsupported { .. }) => {
                assert_eq!(f.record_count().await, before, "a refused task writes nothing");
                let err = store
                    .define_bucket(RateBucket::per_minute("b", 10))
                    .await
                    .unwrap_err();
                assert!(matches!(err, Error::Unsupported { .. }), "{err}");
            }
            Err(other) => panic!("expected the task kept or refused as unsupported, got {other}"),
        }
    }
}
