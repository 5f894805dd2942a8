//! A deploy: the old worker is stopped while a reply is in flight. After its
//! grace it releases the task instead of leaving it to its lease, so the new
//! worker answers at once, and the conversation shows one reply.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chat_api::{Mode, ReplyProvider};
use support::{ALICE, TestDb, TestService, config, ids};
use taskfence::store::AttemptOutcome;
use taskfence::testing::Fixture;
use taskfence::{Failure, Status, TaskId};
use tokio::sync::Notify;

/// Long enough that a takeover waiting for the lease fails the test.
const LEASE: Duration = Duration::from_secs(60);

/// A provider that never answers, and says when it is called.
struct Hangs(Arc<Notify>);

#[async_trait]
impl ReplyProvider for Hangs {
    async fn reply(&self, _prompt: &str, _attempt: u32) -> Result<String, Failure> {
        self.0.notify_one();
        std::future::pending().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_releases_its_reply_in_flight_and_the_next_one_answers_it() {
    let db = TestDb::new().await;
    let api_service = TestService::start(&db, Mode::ApiOnly).await;
    let api = api_service.api().clone();

    let mut old = config(&db, Mode::WorkerOnly);
    old.worker.lease = LEASE;
    old.worker.grace = Duration::from_millis(200);
    let called = Arc::new(Notify::new());
    let old = TestService::start_with_provider(&db, old, Hangs(Arc::clone(&called))).await;

    let (task_id, _) = ids(&api.send(ALICE, "conv-1", Some("send-1"), "Still there?").await);
    tokio::time::timeout(Duration::from_secs(30), called.notified())
        .await
        .expect("the old worker calls the provider");

    // The deploy stops the old worker mid-call.
    let stopping = Instant::now();
    old.stop().await;
    let took = stopping.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the stop took the grace, not the provider call nor the lease ({took:?})"
    );
    let id: TaskId = task_id.parse().expect("a task id");
    let store = db.fixture.store();
    let task = store.get(id).await.unwrap().expect("the task");
    assert_eq!(task.status, Status::Pending, "released: due again now");
    let attempts = store.attempts(id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].outcome, AttemptOutcome::Released);

    let mut new = config(&db, Mode::WorkerOnly);
    new.worker.lease = LEASE;
    let new = TestService::start_with(&db, new).await;
    let view = api.wait_for_reply(ALICE, &task_id).await;
    assert!(
        stopping.elapsed() < LEASE / 2,
        "answered without waiting for the old lease ({:?})",
        stopping.elapsed()
    );
    assert_eq!(view["status"], "completed");
    assert_eq!(view["reply"]["content"], "Reply to: Still there? (attempt 2)");
    assert_eq!(view["attempts"], 2, "the released attempt stays counted");

    new.stop().await;
    api_service.stop().await;
    assert_eq!(db.count("replies").await, 1);
    let outcomes: Vec<_> = store
        .attempts(id)
        .await
        .unwrap()
        .iter()
        .map(|a| a.outcome)
        .collect();
    assert_eq!(outcomes, [AttemptOutcome::Released, AttemptOutcome::Completed]);
}
