//! A late worker for v1 finishing after v2 never makes v1 current again.
mod common;

use std::sync::Arc;

use common::{Harness, LEASE, V1, V2, expected_visible};
use document_indexing::{Claimed, Indexed, Job, chunk};
use taskfence::{Rejection, TaskId};
use tokio::sync::oneshot;

/// A worker that claims `task`, prepares its job, reports that it holds it,
/// then stops (a GC pause, a lost network) until told to go on and commit.
struct PausedWorker {
    resume: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Indexed>,
}

async fn pause_after_claim(h: &Arc<Harness>, task: TaskId, worker: &'static str) -> PausedWorker {
    let (claimed_tx, claimed_rx) = oneshot::channel();
    let (resume, resume_rx) = oneshot::channel::<()>();
    let h2 = Arc::clone(h);
    let done = tokio::spawn(async move {
        let Claimed::Job(job) = h2.indexer.claim(task, worker, LEASE).await.expect("claim") else {
            panic!("{worker} should get the task")
        };
        claimed_tx.send(()).expect("the test waits");
        resume_rx.await.expect("the test resumes the worker");
        let mut conn = h2.indexer.store().pool().acquire().await.expect("connection");
        h2.indexer.commit(&mut conn, job).await.expect("commit")
    });
    claimed_rx.await.expect("the worker claimed");
    PausedWorker { resume, done }
}

impl PausedWorker {
    async fn finish(self) -> Indexed {
        self.resume.send(()).expect("the worker waits");
        self.done.await.expect("the worker task")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_paused_past_its_lease_is_rejected_and_v2_stays_current() {
    let h = Arc::new(Harness::new().await);
    let v1 = h.indexer.upload("plan", 1, V1).await.unwrap().task.id;
    let late = pause_after_claim(&h, v1, "worker-slow").await;

    h.upload_and_index("plan", 2, V2).await;
    h.advance(LEASE + std::time::Duration::from_secs(1)).await; // v1's lease is over

    let outcome = late.finish().await;
    assert!(
        matches!(outcome, Indexed::Rejected(Rejection::LeaseExpired)),
        "{outcome:?}"
    );
    assert_eq!(h.indexer.current_version("plan").await.unwrap(), Some(2));
    assert!(
        h.stored_entries("plan", 1).await.is_empty(),
        "the rejected run rolled back"
    );
    assert_eq!(h.visible("plan").await, expected_visible(2, V2));

    // v1 is redelivered and finished by another worker: stored, never current.
    let redo = h.indexer.index_once("worker-b", v1, LEASE).await.unwrap();
    assert!(
        matches!(
            redo,
            Indexed::Done {
                became_current: false,
                ..
            }
        ),
        "{redo:?}"
    );
    assert_eq!(h.stored_entries("plan", 1).await, chunk(V1));
    assert_eq!(h.indexer.current_version("plan").await.unwrap(), Some(2));
    assert_eq!(h.visible("plan").await, expected_visible(2, V2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_with_a_live_lease_is_stored_but_never_becomes_current() {
    let h = Arc::new(Harness::new().await);
    let v1 = h.indexer.upload("plan", 1, V1).await.unwrap().task.id;
    let late = pause_after_claim(&h, v1, "worker-slow").await;

    h.upload_and_index("plan", 2, V2).await;

    // Its assignment is still valid: the result is accepted (v1 is its own
    // task), but the forward-only update leaves v2 current.
    let outcome = late.finish().await;
    let Indexed::Done {
        entries_written,
        became_current,
        ..
    } = outcome
    else {
        panic!("a live lease completes: {outcome:?}")
    };
    assert!(!became_current);
    assert_eq!(entries_written, chunk(V1).len() as u64);
    assert_eq!(h.stored_entries("plan", 1).await, chunk(V1));
    assert_eq!(h.indexer.current_version("plan").await.unwrap(), Some(2));
    assert_eq!(h.visible("plan").await, expected_visible(2, V2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_taken_over_while_paused_is_superseded_and_writes_nothing() {
    let h = Arc::new(Harness::new().await);
    let v1 = h.indexer.upload("plan", 1, V1).await.unwrap().task.id;
    let late = pause_after_claim(&h, v1, "worker-slow").await;
    h.advance(LEASE + std::time::Duration::from_secs(1)).await;

    // Recovery hands v1 to another worker, which holds it while v2 is indexed.
    let Claimed::Job(takeover) = h.indexer.claim(v1, "worker-b", LEASE).await.unwrap() else {
        panic!("an expired lease can be taken over")
    };
    h.upload_and_index("plan", 2, V2).await;

    let outcome = late.finish().await;
    assert!(
        matches!(
            outcome,
            Indexed::Rejected(Rejection::Superseded { current_version: 2 })
        ),
        "{outcome:?}"
    );
    assert!(h.stored_entries("plan", 1).await.is_empty());

    let mut conn = h.indexer.store().pool().acquire().await.unwrap();
    let outcome = h.indexer.commit(&mut conn, takeover).await.unwrap();
    assert!(
        matches!(
            outcome,
            Indexed::Done {
                became_current: false,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(
        h.stored_entries("plan", 1).await,
        chunk(V1),
        "one set of v1 entries"
    );
    assert_eq!(h.visible("plan").await, expected_visible(2, V2));
}

fn body(version: i64) -> String {
    format!("Version {version} decisions.\n\nVersion {version} owners.")
}

async fn claim_jobs(h: &Harness, versions: std::ops::RangeInclusive<i64>) -> Vec<Job> {
    let mut jobs = Vec::new();
    for v in versions {
        let task = h.indexer.upload("plan", v, &body(v)).await.unwrap().task.id;
        let Claimed::Job(job) = h.indexer.claim(task, "worker", LEASE).await.unwrap() else {
            panic!("a fresh task is claimable")
        };
        jobs.push(job);
    }
    jobs
}

#[tokio::test]
async fn versions_finishing_newest_first_leave_the_newest_current() {
    let h = Harness::new().await;
    let jobs = claim_jobs(&h, 1..=5).await;
    let mut conn = h.indexer.store().pool().acquire().await.unwrap();
    let mut current = Vec::new();
    for job in jobs.into_iter().rev() {
        let Indexed::Done { became_current, .. } = h.indexer.commit(&mut conn, job).await.unwrap() else {
            panic!("live leases complete")
        };
        current.push(became_current);
    }
    assert_eq!(current, [true, false, false, false, false]);
    assert_eq!(h.indexer.current_version("plan").await.unwrap(), Some(5));
    assert_eq!(h.visible("plan").await, expected_visible(5, &body(5)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_finishing_at_once_leave_the_newest_current() {
    let h = Arc::new(Harness::new().await);
    for round in 0..5 {
        let first = round * 8 + 1;
        let jobs = claim_jobs(&h, first..=first + 7).await;
        let start = Arc::new(tokio::sync::Barrier::new(jobs.len()));
        let mut workers = Vec::new();
        for job in jobs {
            let (h, start) = (Arc::clone(&h), Arc::clone(&start));
            workers.push(tokio::spawn(async move {
                let mut conn = h.indexer.store().pool().acquire().await.unwrap();
                start.wait().await;
                h.indexer.commit(&mut conn, job).await.unwrap()
            }));
        }
        for worker in workers {
            assert!(matches!(worker.await.unwrap(), Indexed::Done { .. }));
        }
        let newest = first + 7;
        assert_eq!(h.indexer.current_version("plan").await.unwrap(), Some(newest));
        assert_eq!(h.visible("plan").await, expected_visible(newest, &body(newest)));
    }
}
