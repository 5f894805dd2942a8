//! `reopen` and `cancel` against the real PostgreSQL: the change is made
//! through the store's fenced operation, a refusal is exit 4 and writes
//! nothing.

mod common;

use std::time::Duration;

use common::{completed, failed, fixture, pg, submit};
use taskfence::testing::{Fixture, InspectFixture, acquire};
use taskfence::{RetryPolicy, Status};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_of_a_failed_task_lets_a_worker_claim_it() {
    let f = fixture().await;
    let store = f.store();
    let task = failed(&*store, "tenant-a", "k1", "provider quota exceeded").await;
    assert_eq!(task.status, Status::Failed);

    let run = pg(
        &f,
        &[
            "reopen",
            &task.id.to_string(),
            "--reason",
            "quota raised",
            "--by",
            "alice@ops",
            "--max-attempts",
            "3",
            "--deadline",
            "1h",
        ],
    );
    let text = run.ok();
    assert!(
        text.starts_with(&format!("reopened task {}: pending, 3 attempt(s)", task.id)),
        "{text}"
    );

    let story = f.inspector().story(task.id).await.unwrap().unwrap();
    assert_eq!(story.task.status, Status::Pending);
    assert_eq!(story.task.policy.max_attempts, 3);
    assert_eq!(story.task.policy.deadline, Some(Duration::from_secs(3600)));
    assert_eq!(story.reopenings.len(), 1);
    assert_eq!(
        (
            story.reopenings[0].by.as_str(),
            story.reopenings[0].reason.as_str()
        ),
        ("alice@ops", "quota raised")
    );

    // A worker takes it: attempt #2, in the fresh budget.
    let lease = acquire(&*store, task.id, "worker-2").await;
    assert_eq!(lease.attempt(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_by_default_is_user_at_host_and_prints_json() {
    let f = fixture().await;
    let task = failed(&*f.store(), "tenant-a", "k1", "boom").await;
    let json = common::run(
        common::taskfence()
            .env("USER", "carol")
            .args(["--database-url", f.url(), "--schema", f.schema(), "--json"])
            .args(["reopen", &task.id.to_string(), "--reason", "fixed"]),
    )
    .json();
    assert_eq!(json["id"], task.id.to_string());
    assert_eq!(json["status"], "pending");
    let story = f.inspector().story(task.id).await.unwrap().unwrap();
    assert!(
        story.reopenings[0].by.starts_with("carol@"),
        "{:?}",
        story.reopenings[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_of_a_completed_or_live_task_is_refused_and_writes_nothing() {
    let f = fixture().await;
    let store = f.store();
    let done = completed(&*store, "tenant-a", "done").await;
    let live = submit(&*store, "tenant-a", "chat.reply", "live", RetryPolicy::default()).await;
    let before = f.record_count().await;
    let story_before = f.inspector().story(done.id).await.unwrap();

    let refused = pg(&f, &["reopen", &done.id.to_string(), "--reason", "again"]);
    assert!(refused.failed(4).contains("it is completed"), "{refused:#?}");
    // With a policy change too: the read it needs writes nothing either.
    pg(
        &f,
        &[
            "reopen",
            &done.id.to_string(),
            "--reason",
            "again",
            "--max-attempts",
            "9",
        ],
    )
    .failed(4);
    let live_refused = pg(&f, &["reopen", &live.id.to_string(), "--reason", "again"]);
    assert!(
        live_refused
            .failed(4)
            .contains("it is pending; only a failed or cancelled task can be reopened"),
        "{live_refused:#?}"
    );

    assert_eq!(f.record_count().await, before);
    assert_eq!(f.inspector().story(done.id).await.unwrap(), story_before);
    let live_now = store.get(live.id).await.unwrap().unwrap();
    assert_eq!(live_now, live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_fences_off_the_running_worker() {
    let f = fixture().await;
    let store = f.store();
    let task = submit(&*store, "tenant-a", "chat.reply", "k1", RetryPolicy::default()).await;
    let lease = acquire(&*store, task.id, "worker-1").await;

    let json = pg(
        &f,
        &[
            "--json",
            "cancel",
            &task.id.to_string(),
            "--reason",
            "customer left",
        ],
    )
    .json();
    assert_eq!(json["status"], "cancelled");
    assert_eq!(json["last_error"], "customer left");

    // The worker that held it can no longer save.
    let late = store
        .complete(lease, taskfence::Response::from("late"))
        .await
        .unwrap();
    assert!(!late.is_accepted());

    // Cancelling a completed task is refused.
    let done = completed(&*store, "tenant-a", "done").await;
    let refused = pg(&f, &["cancel", &done.id.to_string(), "--reason", "too late"]);
    assert!(refused.failed(4).contains("completed"), "{refused:#?}");
    assert_eq!(
        store.get(done.id).await.unwrap().unwrap().status,
        Status::Completed
    );
}
