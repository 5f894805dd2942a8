//! Workers that die at the worst moments, on the real server: the task keeps
//! one saved answer, redelivery skips the provider once it is saved, and the
//! retry budget survives redeliveries.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use taskfence::store::AttemptOutcome;
use taskfence::testing::Fixture;
use taskfence::{Claim, ClaimRequest, Failure, Response, RetryPolicy, Status, TaskId, TaskStore};

const LEASE: Duration = Duration::from_secs(30);

use common::new_task;

/// A stand-in LLM provider that counts its calls.
#[derive(Clone, Default)]
struct Provider(Arc<AtomicUsize>);

impl Provider {
    async fn call(&self) -> String {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        format!("answer from call {n}")
    }
    fn calls(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// What one delivery of a queue message did.
#[derive(Debug, PartialEq, Eq)]
enum Delivery {
    Saved,
    AlreadyDone,
    Gone,
    Other(String),
}

/// The worker loop body for one delivery: claim, call, complete.
async fn deliver(store: &dyn TaskStore, provider: &Provider, id: TaskId, worker: &str) -> Delivery {
    match store.claim(id, ClaimRequest::new(worker, LEASE)).await.unwrap() {
        Claim::Acquired(lease) => {
            let answer = provider.call().await;
            match store.complete(lease, Response::from(answer)).await.unwrap() {
                taskfence::Fenced::Accepted(_) => Delivery::Saved,
                taskfence::Fenced::Rejected(r) => Delivery::Other(r.to_string()),
            }
        }
        Claim::Completed(_) => Delivery::AlreadyDone,
        Claim::Failed(_) | Claim::Cancelled(_) => Delivery::Gone,
        other => Delivery::Other(format!("{other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_answered_but_worker_died_before_saving_takeover_saves_one_answer() {
    let f = common::fixture().await;
    let store = f.store();
    let provider = Provider::default();
    let task = store.submit(new_task("k")).await.unwrap().into_task();

    // Worker A claims, gets the provider's answer, and dies before saving it:
    // its task is aborted at that point, the answer is lost with it.
    let (answered_tx, answered_rx) = tokio::sync::oneshot::channel();
    let worker_a = tokio::spawn({
        let (store, provider) = (store.clone(), provider.clone());
        async move {
            let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("a", LEASE)).await.unwrap()
            else {
                panic!("fresh task")
            };
            let answer = provider.call().await;
            answered_tx.send(()).unwrap();
            std::future::pending::<()>().await; // never reaches complete()
            drop((lease, answer));
        }
    });
    answered_rx.await.unwrap();
    worker_a.abort();
    assert!(worker_a.await.unwrap_err().is_cancelled());

    // Until the lease expires the task is held; after it, B takes over and saves.
    assert!(matches!(
        store.claim(task.id, ClaimRequest::new("b", LEASE)).await.unwrap(),
        Claim::Busy { .. }
    ));
    f.advance(LEASE + Duration::from_secs(1)).await;
    assert_eq!(deliver(&*store, &provider, task.id, "b").await, Delivery::Saved);

    let done = store.get(task.id).await.unwrap().unwrap();
    assert_eq!(done.status, Status::Completed);
    assert_eq!(
        done.response,
        Some(Response::from("answer from call 2")),
        "one answer: B's"
    );
    assert_eq!(
        provider.calls(),
        2,
        "the provider did the work twice: documented, not hidden"
    );
    let outcomes: Vec<_> = store
        .attempts(task.id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.outcome)
        .collect();
    assert_eq!(outcomes, [AttemptOutcome::Expired, AttemptOutcome::Completed]);
    // Any further delivery finds it done.
    assert_eq!(
        deliver(&*store, &provider, task.id, "c").await,
        Delivery::AlreadyDone
    );
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_save_before_queue_ack_redelivery_skips_the_provider() {
    let f = common::fixture().await;
    let store = f.store();
    let provider = Provider::default();
    let task = store.submit(new_task("k")).await.unwrap().into_task();
    // The message is delivered, saved, and the worker crashes before acking:
    // the queue redelivers the same message, possibly several times.
    assert_eq!(deliver(&*store, &provider, task.id, "a").await, Delivery::Saved);
    for worker in ["b", "c", "d"] {
        assert_eq!(
            deliver(&*store, &provider, task.id, worker).await,
            Delivery::AlreadyDone
        );
    }
    assert_eq!(provider.calls(), 1, "redeliveries never reach the provider");
    assert_eq!(
        store.attempts(task.id).await.unwrap().len(),
        1,
        "and start no attempt"
    );
    assert_eq!(
        store.get(task.id).await.unwrap().unwrap().response,
        Some(Response::from("answer from call 1"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_runs_out_across_redeliveries_then_terminal_with_no_further_attempts() {
    let f = common::fixture().await;
    let store = f.store();
    let policy = RetryPolicy::default()
        .max_attempts(3)
        .jitter(0.0)
        .initial_backoff(Duration::from_secs(1));
    let task = store
        .submit(new_task("k").policy(policy))
        .await
        .unwrap()
        .into_task();
    let provider = Provider::default();
    // Attempt 1 fails (rate limited), attempt 2 crashes (lease expires), attempt 3 fails.
    let lease = match store.claim(task.id, ClaimRequest::new("a", LEASE)).await.unwrap() {
        Claim::Acquired(l) => l,
        other => panic!("{other:?}"),
    };
    provider.call().await;
    assert!(
        store
            .fail(lease, Failure::retryable("429"))
            .await
            .unwrap()
            .is_accepted()
    );
    f.advance(Duration::from_secs(2)).await;
    let crashed = match store.claim(task.id, ClaimRequest::new("b", LEASE)).await.unwrap() {
        Claim::Acquired(l) => l,
        other => panic!("{other:?}"),
    };
    provider.call().await;
    drop(crashed);
    f.advance(LEASE + Duration::from_secs(1)).await;
    let lease = match store.claim(task.id, ClaimRequest::new("c", LEASE)).await.unwrap() {
        Claim::Acquired(l) => l,
        other => panic!("{other:?}"),
    };
    assert_eq!(lease.attempt(), 3);
    provider.call().await;
    let out = store
        .fail(lease, Failure::retryable("503"))
        .await
        .unwrap()
        .accepted()
        .unwrap();
    assert!(
        matches!(out, taskfence::Retry::Exhausted(ref t) if t.status == Status::Failed),
        "{out:?}"
    );

    // Redeliveries keep coming: none reaches the provider or counts an attempt.
    for worker in ["d", "e", "f"] {
        f.advance(Duration::from_secs(60)).await;
        assert_eq!(deliver(&*store, &provider, task.id, worker).await, Delivery::Gone);
    }
    assert_eq!(provider.calls(), 3);
    let failed = store.get(task.id).await.unwrap().unwrap();
    assert_eq!(
        (failed.status, failed.attempts()),
        (Status::Failed, 3),
        "terminal, visible to all"
    );
    assert!(failed.last_error.unwrap().contains("attempts exhausted"));
    assert_eq!(store.attempts(task.id).await.unwrap().len(), 3);
    assert!(
        store.due(10).await.unwrap().is_empty(),
        "nothing left to re-dispatch"
    );
}
