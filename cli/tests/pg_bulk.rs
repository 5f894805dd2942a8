//! Bulk `reopen` and `cancel` by filter against the real PostgreSQL: a dry
//! run counts and changes nothing, no confirmation (stdin is not a terminal
//! here) refuses with exit 5, `--yes` changes exactly the matches, and bad
//! input is a usage error that writes nothing.

mod common;

use common::{completed, failed, fixture, pg, submit};
use taskfence::inspect::Counts;
use taskfence::testing::{Fixture, InspectFixture, acquire};
use taskfence::{RetryPolicy, Status};

async fn counts(f: &taskfence::testing::PgFixture) -> Counts {
    f.inspector().counts(None).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_reopen_counts_asks_and_reopens_exactly_the_matches() {
    let f = fixture().await;
    let store = f.store();
    let a1 = failed(&*store, "tenant-a", "a1", "429 quota exceeded").await;
    let a2 = failed(&*store, "tenant-a", "a2", "429 quota exceeded").await;
    let a3 = failed(&*store, "tenant-a", "a3", "429 quota exceeded").await;
    let b1 = failed(&*store, "tenant-b", "b1", "429 quota exceeded").await;
    let _done = completed(&*store, "tenant-a", "done").await;
    let before = counts(&f).await;

    // Dry run: counted and listed, nothing changed.
    let dry = pg(
        &f,
        &[
            "reopen",
            "--scope",
            "tenant-a",
            "--reason",
            "quota raised",
            "--dry-run",
        ],
    );
    let text = dry.ok();
    assert!(
        text.starts_with("would reopen 3 task(s) (nothing changed):\n"),
        "{text}"
    );
    for t in [&a1, &a2, &a3] {
        assert!(text.contains(&t.id.to_string()), "{text}");
    }
    assert!(!text.contains(&b1.id.to_string()), "{text}");
    let json = pg(
        &f,
        &[
            "--json",
            "reopen",
            "--scope",
            "tenant-a",
            "--reason",
            "r",
            "--dry-run",
        ],
    )
    .json();
    assert_eq!(json["matched"], 3);
    assert_eq!(json["dry_run"], true);
    assert_eq!(json["tasks"][0]["id"], a1.id.to_string(), "oldest first");
    assert_eq!(counts(&f).await, before, "a dry run writes nothing");

    // Without --yes, and stdin is not a terminal: refused, exit 5, nothing changed.
    let refused = pg(&f, &["reopen", "--scope", "tenant-a", "--reason", "quota raised"]);
    assert!(refused.failed(5).contains("--yes"), "{refused:#?}");
    assert_eq!(counts(&f).await, before);

    // --max 2 --yes: the two oldest.
    let two = pg(
        &f,
        &[
            "--json",
            "reopen",
            "--scope",
            "tenant-a",
            "--max",
            "2",
            "--reason",
            "quota raised",
            "--by",
            "alice",
            "--max-attempts",
            "3",
            "--yes",
        ],
    )
    .json();
    assert_eq!(two["dry_run"], false);
    assert_eq!(two["done"], serde_json::json!([a1.id, a2.id]));
    assert_eq!(two["skipped"], serde_json::json!([]));
    for id in [a1.id, a2.id] {
        let task = store.get(id).await.unwrap().unwrap();
        assert_eq!(task.status, Status::Pending);
        assert_eq!(task.attempts_left(), 3, "--max-attempts applies to each");
        let story = f.inspector().story(id).await.unwrap().unwrap();
        assert_eq!(story.reopenings[0].by, "alice");
    }
    assert_eq!(store.get(a3.id).await.unwrap().unwrap().status, Status::Failed);

    // The rest of tenant-a; tenant-b untouched.
    let rest = pg(
        &f,
        &["reopen", "--scope", "tenant-a", "--reason", "quota raised", "-y"],
    );
    assert_eq!(rest.ok(), "reopened 1 of 1 matching task(s)\n");
    assert_eq!(store.get(b1.id).await.unwrap().unwrap().status, Status::Failed);
    let none = pg(
        &f,
        &["reopen", "--scope", "tenant-a", "--reason", "again", "--yes"],
    );
    assert_eq!(none.ok(), "no task matches: nothing to reopen\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_cancel_takes_pending_and_running_by_default() {
    let f = fixture().await;
    let store = f.store();
    let waiting = submit(&*store, "tenant-a", "doc.index", "w", RetryPolicy::default()).await;
    let running = submit(&*store, "tenant-a", "doc.index", "r", RetryPolicy::default()).await;
    acquire(&*store, running.id, "worker-1").await;
    let other_op = submit(&*store, "tenant-a", "chat.reply", "c", RetryPolicy::default()).await;
    let done = completed(&*store, "tenant-a", "done").await;

    let dry = pg(
        &f,
        &[
            "--json",
            "cancel",
            "--operation",
            "doc.index",
            "--reason",
            "index rebuilt",
            "--dry-run",
        ],
    )
    .json();
    assert_eq!(dry["matched"], 2);
    let only_running = pg(
        &f,
        &[
            "--json",
            "cancel",
            "--operation",
            "doc.index",
            "--status",
            "running",
            "--reason",
            "x",
            "--dry-run",
        ],
    )
    .json();
    assert_eq!(only_running["tasks"][0]["id"], running.id.to_string());
    assert_eq!(only_running["matched"], 1);

    let out = pg(
        &f,
        &[
            "cancel",
            "--operation",
            "doc.index",
            "--reason",
            "index rebuilt",
            "--yes",
        ],
    );
    assert_eq!(out.ok(), "cancelled 2 of 2 matching task(s)\n");
    for id in [waiting.id, running.id] {
        assert_eq!(store.get(id).await.unwrap().unwrap().status, Status::Cancelled);
    }
    assert_eq!(
        store.get(other_op.id).await.unwrap().unwrap().status,
        Status::Pending
    );
    assert_eq!(
        store.get(done.id).await.unwrap().unwrap().status,
        Status::Completed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bulk_input_is_a_usage_error_and_writes_nothing() {
    let f = fixture().await;
    let store = f.store();
    let bad = failed(&*store, "tenant-a", "a1", "boom").await;
    submit(&*store, "tenant-a", "op", "p1", RetryPolicy::default()).await;
    let before = counts(&f).await;
    let id = bad.id.to_string();
    for args in [
        // neither an id nor a filter
        &["reopen", "--reason", "x", "--yes"][..],
        &["cancel", "--reason", "x", "--yes"],
        // an id and a filter
        &["reopen", &id, "--scope", "tenant-a", "--reason", "x"],
        // a dry run is for a filter
        &["reopen", &id, "--reason", "x", "--dry-run"],
        // statuses the command cannot change
        &["reopen", "--status", "completed", "--reason", "x", "--yes"],
        &["cancel", "--status", "failed", "--reason", "x", "--yes"],
        // malformed filters and reasons
        &["reopen", "--older-than", "soon", "--reason", "x", "--yes"],
        &[
            "reopen", "--scope", "tenant-a", "--max", "0", "--reason", "x", "--yes",
        ],
        &["reopen", "--scope", " ", "--reason", "x", "--yes"],
        &["cancel", "--scope", "tenant-a", "--reason", " ", "--yes"],
    ] {
        pg(&f, args).failed(2);
    }
    assert_eq!(counts(&f).await, before, "nothing written");
}
