//! Two OS processes on one file, racing: both submit the same keys, both
//! claim (from the queue and by id) and complete, with leases short enough
//! that they take tasks over from each other and late answers race the new
//! holder's. Every task ends with exactly one saved response, no task is
//! lost, and no call in either process fails (no `SQLITE_BUSY`, no
//! `Error::Busy`, nothing at all).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use taskfence::policy::AcceptanceRule;
use taskfence::testing::SqliteFixture;
use taskfence::{
    Claim, ClaimNext, ClaimRequest, Fenced, InputHash, NewTask, RequestKey, RetryPolicy, SqliteStore, Status,
    Submitted, TaskStore,
};

use crate::{child, invariants};

const TASKS: usize = 200;
const TEST: &str = "processes::two_processes_race_claims_and_completions_on_one_file";

fn task(i: usize) -> NewTask {
    let acceptance = if i.is_multiple_of(2) {
        AcceptanceRule::CurrentAssignment
    } else {
        AcceptanceRule::FirstValidAnswer
    };
    NewTask::new(
        RequestKey::new("user", "op", format!("k-{i}")),
        InputHash::of([i.to_string()]),
    )
    .policy(RetryPolicy::default().max_attempts(1000))
    .acceptance(acceptance)
    .without_handoff()
}

/// A pause of 0..`max_ms` milliseconds, drawn without a random number generator.
async fn pause(max_ms: u64) {
    let draw = taskfence::backend::jitter_unit(taskfence::task::AttemptId::new());
    tokio::time::sleep(Duration::from_micros((draw * max_ms as f64 * 1000.0) as u64)).await;
}

/// One process's part: submit every key, then work until every task is done.
async fn racer(path: &str, me: &str) {
    let store = SqliteStore::builder(path)
        .busy_budget(Duration::from_secs(60))
        .open()
        .await
        .expect("open the shared file");
    let mut created = 0;
    // The two processes submit in opposite orders, so they meet and race for the same keys.
    let order: Vec<usize> = if me == "a" {
        (0..TASKS).collect()
    } else {
        (0..TASKS).rev().collect()
    };
    for i in order {
        if let Submitted::Created(_) = store.submit(task(i)).await.expect("submit") {
            created += 1;
        }
    }
    let ids: Vec<_> = futures_ids(&store).await;
    let accepted = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (store, accepted, ids, me) =
                (store.clone(), accepted.clone(), ids.clone(), format!("{me}-{w}"));
            tokio::spawn(async move {
                let lease = Duration::from_millis(15);
                let mut round = 0usize;
                loop {
                    let counts = taskfence::inspect::Inspect::counts(&store, None)
                        .await
                        .expect("counts");
                    if counts.completed == TASKS as u64 {
                        break;
                    }
                    // Every other round, claim by id (racing the other process's queue).
                    let leases = if round.is_multiple_of(2) {
                        store
                            .claim_next(ClaimNext::new(&me, lease, 8))
                            .await
                            .expect("claim_next")
                    } else {
                        let id = ids[(round * 7 + w * 13) % ids.len()];
                        match store
                            .claim(id, ClaimRequest::new(&me, lease))
                            .await
                            .expect("claim")
                        {
                            Claim::Acquired(lease) => vec![lease],
                            _ => Vec::new(),
                        }
                    };
                    round += 1;
                    for lease in leases {
                        pause(20).await; // some leases expire: the other process takes over
                        match store.complete(lease, me.as_str().into()).await.expect("complete") {
                            Fenced::Accepted(_) => {
                                accepted.fetch_add(1, Ordering::Relaxed);
                            }
                            Fenced::Rejected(_) => {}
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("a worker panicked");
    }
    println!("created={created} accepted={}", accepted.load(Ordering::Relaxed));
}

async fn futures_ids(store: &SqliteStore) -> Vec<taskfence::TaskId> {
    let mut ids = Vec::with_capacity(TASKS);
    for i in 0..TASKS {
        ids.push(
            store
                .find(&task(i).key)
                .await
                .expect("find")
                .expect("submitted")
                .id,
        );
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_race_claims_and_completions_on_one_file() {
    if let Some((role, file)) = child::role() {
        return racer(&file, &role).await;
    }
    let f = SqliteFixture::new().await;
    let a = child::spawn(TEST, "a", f.path());
    let b = child::spawn(TEST, "b", f.path());
    let (a, b) = tokio::join!(child::finish(a, "process a"), child::finish(b, "process b"));
    let created = child::reported(&a, "created") + child::reported(&b, "created");
    let accepted = child::reported(&a, "accepted") + child::reported(&b, "accepted");
    println!("process a: {a}process b: {b}");
    assert_eq!(
        created, TASKS as u64,
        "each key created once across the processes"
    );
    assert_eq!(
        accepted, TASKS as u64,
        "one saved response per task, across the processes"
    );

    let store = f.sqlite_store();
    let mut took_over = 0;
    for i in 0..TASKS {
        let t = store.find(&task(i).key).await.unwrap().expect("no task lost");
        assert_eq!(t.status, Status::Completed);
        let saved = t.response.expect("saved response");
        let text = saved.as_str().expect("text");
        assert!(text.starts_with("a-") || text.starts_with("b-"), "{text}");
        let attempts = store.attempts(t.id).await.unwrap();
        assert_eq!(attempts.len() as u64, t.version);
        took_over += u64::from(attempts.len() > 1);
    }
    assert!(
        took_over > 0,
        "the leases were short enough for takeovers to race"
    );
    println!("{took_over} of {TASKS} tasks were taken over at least once");
    invariants::check(f.path()).await;
}
