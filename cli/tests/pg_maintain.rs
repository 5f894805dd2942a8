//! `purge`, `stranded` and `dispatch-due` against the real PostgreSQL. Time
//! passes on the fixture's store clock (no sleeping): the schema's
//! `store_clock()` is moved forward, which the binary's queries read too.

mod common;

use std::time::Duration;

use common::{completed, fixture, pg, submit};
use taskfence::testing::{Fixture, InspectFixture, acquire};
use taskfence::{InputHash, NewTask, RequestKey, RetryPolicy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_tasks_past_retention_in_batches() {
    let f = fixture().await;
    let store = f.store();
    let short = Duration::from_secs(3600);
    for i in 0..5 {
        let key = format!("old{i}");
        let task = store
            .submit(NewTask::new(RequestKey::new("t", "op", &key), InputHash::of([&key])).retention(short))
            .await
            .unwrap()
            .into_task();
        let lease = acquire(&*store, task.id, "w").await;
        let _ = store
            .complete(lease, taskfence::Response::from("ok"))
            .await
            .unwrap();
    }
    let kept = completed(&*store, "t", "kept").await; // the default retention: 7 days

    // Nothing has expired yet.
    assert_eq!(pg(&f, &["purge"]).ok(), "purged 0 task(s) past their retention\n");

    f.advance(Duration::from_secs(2 * 3600)).await;
    // --max stops early, in batches of two.
    let some = pg(&f, &["--json", "purge", "--batch", "2", "--max", "3"]).json();
    assert_eq!(some["purged"], 3);
    let rest = pg(&f, &["purge", "--batch", "2"]);
    assert_eq!(rest.ok(), "purged 2 task(s) past their retention\n");
    assert_eq!(rest.stderr, "", "no progress bar when stderr is not a terminal");

    let counts = f.inspector().counts(None).await.unwrap();
    assert_eq!(counts.total(), 1);
    assert!(store.get(kept.id).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stranded_lists_unclaimed_tasks_and_redispatch_hands_them_off_again() {
    let f = fixture().await;
    let store = f.store();
    let lost_a = submit(&*store, "t", "op", "lost-a", RetryPolicy::default()).await;
    let lost_b = submit(&*store, "t", "op", "lost-b", RetryPolicy::default()).await;
    let claimed = submit(&*store, "t", "op", "claimed", RetryPolicy::default()).await;
    acquire(&*store, claimed.id, "w").await;

    assert_eq!(
        pg(&f, &["stranded", "--older-than", "15m"]).ok(),
        "no stranded tasks\n"
    );

    f.advance(Duration::from_secs(20 * 60)).await;
    let fresh = submit(&*store, "t", "op", "fresh", RetryPolicy::default()).await;
    let listed = pg(&f, &["--json", "stranded", "--older-than", "15m"]).json();
    let ids: Vec<&str> = listed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [lost_a.id.to_string(), lost_b.id.to_string()],
        "oldest first, not the fresh one"
    );
    assert!(listed["redispatched"].is_null());
    assert!(!ids.contains(&fresh.id.to_string().as_str()));

    let handoffs_before = f
        .inspector()
        .story(lost_a.id)
        .await
        .unwrap()
        .unwrap()
        .handoffs
        .len();
    let text = pg(
        &f,
        &["stranded", "--older-than", "15m", "--limit", "1", "--redispatch"],
    );
    let out = text.ok();
    assert!(out.contains(&lost_a.id.to_string()), "{out}");
    assert!(out.contains("re-dispatched 1 task(s)"), "{out}");
    let story = f.inspector().story(lost_a.id).await.unwrap().unwrap();
    assert_eq!(
        story.handoffs.len(),
        handoffs_before + 1,
        "a fresh handoff for the dispatcher"
    );
    let untouched = f.inspector().story(lost_b.id).await.unwrap().unwrap();
    assert_eq!(
        untouched.handoffs.len(),
        handoffs_before,
        "--limit 1: only the oldest"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatch_due_prints_ids_one_per_line() {
    let f = fixture().await;
    let store = f.store();
    let expired = submit(&*store, "t", "op", "expired-lease", RetryPolicy::default()).await;
    acquire(&*store, expired.id, "w").await; // a 30 s lease
    let waiting = submit(&*store, "t", "op", "never-claimed", RetryPolicy::default()).await;
    let _done = completed(&*store, "t", "done").await;

    assert_eq!(pg(&f, &["dispatch-due", "--print"]).ok(), "");

    f.advance(Duration::from_secs(20 * 60)).await;
    let due = pg(&f, &["dispatch-due", "--print"]);
    assert_eq!(due.ok(), format!("{}\n", expired.id));

    let with_stranded = pg(&f, &["dispatch-due", "--print", "--stranded-older-than", "15m"]);
    assert_eq!(with_stranded.ok(), format!("{}\n{}\n", expired.id, waiting.id));

    let json = pg(
        &f,
        &[
            "--json",
            "dispatch-due",
            "--print",
            "--stranded-older-than",
            "15m",
        ],
    )
    .json();
    assert_eq!(json["due"][0], expired.id.to_string());
    assert_eq!(json["stranded"][0], waiting.id.to_string());

    // --print is required: the command never publishes by itself.
    common::run(
        common::taskfence()
            .args(["--database-url", f.url(), "--schema", f.schema()])
            .arg("dispatch-due"),
    )
    .failed(2);
}

/// `republish-due` is the command's name; `dispatch-due`, its former one,
/// runs the same command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn republish_due_is_the_name_and_dispatch_due_still_runs_it() {
    let f = fixture().await;
    let store = f.store();
    let expired = submit(&*store, "t", "op", "expired-lease", RetryPolicy::default()).await;
    acquire(&*store, expired.id, "w").await; // a 30 s lease
    f.advance(Duration::from_secs(60)).await;
    let expected = format!("{}\n", expired.id);
    assert_eq!(pg(&f, &["republish-due", "--print"]).ok(), expected);
    assert_eq!(pg(&f, &["dispatch-due", "--print"]).ok(), expected);
}
