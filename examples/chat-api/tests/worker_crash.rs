//! A worker that dies during the provider call (it cannot release its
//! lease): another takes the task over after the lease, and the conversation
//! still shows one reply.

mod support;

use std::time::Duration;

use chat_api::Mode;
use chat_api::sim::SimulatedLlm;
use support::{ALICE, TestDb, TestService, config, ids};
use taskfence::store::AttemptOutcome;
use taskfence::testing::Fixture;
use taskfence_test_support::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_mid_call_is_taken_over_and_one_reply_is_saved() {
    let db = TestDb::new().await;
    let api_service = TestService::start(&db, Mode::ApiOnly).await;
    let api = api_service.api().clone();

    // A worker whose provider never answers in time, with a short lease.
    let mut slow = config(&db, Mode::WorkerOnly);
    slow.worker.lease = Duration::from_secs(1);
    let slow = TestService::start_with_provider(&db, slow, SimulatedLlm::new(Duration::from_secs(600))).await;

    let (task_id, _) = ids(&api.send(ALICE, "conv-1", Some("send-1"), "Still there?").await);
    // The slow worker claims the task.
    let view = eventually(Duration::from_secs(30), || async {
        let view = api.task(ALICE, &task_id, None).await.json();
        (view["status"] == "running").then_some(view)
    })
    .await;
    assert_eq!(view["attempts"], 1);

    // The worker dies mid-call: its lease is no longer renewed and expires.
    slow.crash().await;
    let healthy = TestService::start(&db, Mode::WorkerOnly).await;
    let view = api.wait_for_reply(ALICE, &task_id).await;
    assert_eq!(view["status"], "completed");
    assert_eq!(view["attempts"], 2, "the takeover counts as an attempt");
    assert_eq!(view["reply"]["content"], "Reply to: Still there? (attempt 2)");
    assert_eq!(view["reply"]["attempt"], 2);

    healthy.stop().await;
    api_service.stop().await;
    assert_eq!(db.count("replies").await, 1);
    // The expired first attempt is in the journal; the answering one stays
    // in its task's row.
    assert_eq!(db.count("attempts").await, 1);
    let id = task_id.parse().expect("a task id");
    let attempts = db.fixture.store().attempts(id).await.unwrap();
    let outcomes: Vec<_> = attempts.iter().map(|a| a.outcome).collect();
    assert_eq!(
        outcomes,
        [AttemptOutcome::Expired, AttemptOutcome::Completed],
        "the dead worker released nothing: its lease expired"
    );
}
