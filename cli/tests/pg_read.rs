//! `migrate`, `stats`, `depth`, `list` and `show` against the real PostgreSQL, each
//! test in a schema of its own, through the built binary.

mod common;

use std::time::Duration;

use common::{completed, failed, fixture, pg, run, submit, taskfence};
use taskfence::RetryPolicy;
use taskfence::testing::{Fixture, TempSchema, acquire};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_the_schema_then_is_a_no_op() {
    let url = taskfence_test_support::database_url().await;
    let schema = TempSchema::new(&url, "taskfence_cli_").await;
    let on_schema = |args: &[&str]| {
        run(taskfence()
            .args(["--database-url", &url, "--schema", schema.name()])
            .args(args))
    };
    // Before: no tables, and the error says what to do.
    let before = on_schema(&["stats"]);
    assert!(before.failed(1).contains("taskfence migrate"), "{before:#?}");

    let first = on_schema(&["migrate"]);
    assert_eq!(first.ok(), format!("schema {} is up to date\n", schema.name()));
    on_schema(&["migrate"]).ok(); // idempotent
    let json = on_schema(&["--json", "migrate"]).json();
    assert_eq!(json["backend"], "postgres");
    assert_eq!(json["target"], schema.name());

    let stats = on_schema(&["--json", "stats"]).json();
    assert_eq!(stats["total"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_counts_by_status_and_scope() {
    let f = fixture().await;
    let store = f.store();
    failed(&*store, "tenant-a", "k1", "provider down").await;
    completed(&*store, "tenant-a", "k2").await;
    submit(&*store, "tenant-b", "chat.reply", "k3", RetryPolicy::default()).await;
    let running = submit(&*store, "tenant-b", "chat.reply", "k4", RetryPolicy::default()).await;
    acquire(&*store, running.id, "w").await;

    let all = pg(&f, &["--json", "stats"]).json();
    assert_eq!(
        (
            all["pending"].as_u64(),
            all["running"].as_u64(),
            all["completed"].as_u64(),
            all["failed"].as_u64()
        ),
        (Some(1), Some(1), Some(1), Some(1))
    );
    assert_eq!(all["total"], 4);

    let a = pg(&f, &["stats", "--scope", "tenant-a"]);
    let text = a.ok();
    assert!(text.starts_with("scope tenant-a\n"), "{text}");
    let row = |status: &str| {
        text.lines()
            .find(|l| l.starts_with(status))
            .and_then(|l| l.split_whitespace().nth(1))
            .map(str::to_owned)
    };
    assert_eq!(row("failed").as_deref(), Some("1"));
    assert_eq!(row("pending").as_deref(), Some("0"));
    assert_eq!(row("total").as_deref(), Some("2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_shows_each_operations_queue_and_never_the_finished_tasks() {
    let f = fixture().await;
    let store = f.store();
    assert_eq!(pg(&f, &["depth"]).ok(), "no pending or running tasks\n");
    completed(&*store, "tenant-a", "done").await;
    failed(&*store, "tenant-a", "gone", "provider down").await;
    assert_eq!(
        pg(&f, &["depth"]).ok(),
        "no pending or running tasks\n",
        "finished tasks are no queue"
    );
    submit(&*store, "tenant-a", "chat.reply", "k1", RetryPolicy::default()).await;
    submit(&*store, "tenant-b", "chat.reply", "k2", RetryPolicy::default()).await;
    let indexing = submit(
        &*store,
        "tenant-a",
        "index.document",
        "k3",
        RetryPolicy::default(),
    )
    .await;
    acquire(&*store, indexing.id, "w").await;

    let json = pg(&f, &["--json", "depth"]).json();
    let queues: Vec<_> = json["queues"]
        .as_array()
        .expect("a list of queues")
        .iter()
        .map(|q| {
            (
                q["operation"].clone(),
                q["due"].clone(),
                q["scheduled"].clone(),
                q["running"].clone(),
            )
        })
        .collect();
    assert_eq!(
        queues,
        [
            ("chat.reply".into(), 2.into(), 0.into(), 0.into()),
            ("index.document".into(), 0.into(), 0.into(), 1.into())
        ]
    );
    assert!(json["queues"][0]["oldest_due_at"].is_string());
    assert!(json["queues"][1]["oldest_due_at"].is_null(), "nothing due there");

    let shown = pg(&f, &["depth"]);
    let text = shown.ok();
    let row = |operation: &str| {
        let line = text
            .lines()
            .find(|l| l.starts_with(operation))
            .expect("a row per operation");
        line.split_whitespace()
            .skip(1)
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(row("chat.reply"), "2 0 0", "{text}");
    assert_eq!(row("index.document"), "0 0 1", "{text}");
    assert!(text.contains(" ago)"), "the oldest due one's wait: {text}");
}

/// `limits` on PostgreSQL: each bucket with the tokens available on the
/// server's clock, and who holds a key's slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_show_each_bucket_and_who_holds_a_keys_slots() {
    use taskfence::throttle::{ConcurrencyKey, RateBucket};

    let f = fixture().await;
    let store = f.store();
    assert_eq!(pg(&f, &["limits"]).ok(), "no rate buckets\n");
    store
        .define_bucket(RateBucket::per_minute("openai-key-1", 500).burst(50))
        .await
        .unwrap();
    let keyed =
        |key: &str| taskfence::testing::new_task(key).concurrency(ConcurrencyKey::new("conversation-7", 1));
    let first = store.submit(keyed("m1")).await.unwrap().into_task();
    store.submit(keyed("m2")).await.unwrap();
    acquire(&*store, first.id, "worker-1").await;

    let json = pg(&f, &["--json", "limits", "--key", "conversation-7"]).json();
    let bucket = &json["buckets"][0];
    assert_eq!(
        (
            &bucket["name"],
            &bucket["rate"],
            &bucket["burst"],
            &bucket["available"]
        ),
        (&"openai-key-1".into(), &500.into(), &50.into(), &50.into())
    );
    assert_eq!(json["key"]["running"], serde_json::json!([first.id.to_string()]));
    assert_eq!(json["key"]["waiting"], 1);
    let shown = pg(&f, &["limits", "--key", "conversation-7"]);
    let text = shown.ok();
    assert!(
        text.contains("key conversation-7: 1 running, 1 waiting"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_filters_and_pages_through_the_printed_cursor() {
    let f = fixture().await;
    let store = f.store();
    let mut pending = Vec::new();
    for i in 0..5 {
        pending.push(
            submit(
                &*store,
                "tenant-a",
                "chat.reply",
                &format!("p{i}"),
                RetryPolicy::default(),
            )
            .await,
        );
    }
    let bad = failed(&*store, "tenant-a", "f1", "provider quota exceeded").await;
    submit(&*store, "tenant-b", "doc.index", "other", RetryPolicy::default()).await;

    // Filters.
    let failed_page = pg(&f, &["--json", "list", "--status", "failed"]).json();
    let ids: Vec<&str> = failed_page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [bad.id.to_string()]);
    assert!(failed_page["next"].is_null());
    let by_operation = pg(&f, &["--json", "list", "--operation", "doc.index"]).json();
    assert_eq!(by_operation["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(by_operation["tasks"][0]["key"]["scope"], "tenant-b");

    // The table: ids in the first column, the error, a next-page hint.
    let table = pg(&f, &["list", "--status", "failed"]);
    let text = table.ok();
    assert!(text.starts_with("ID"), "{text}");
    assert!(
        text.contains(&bad.id.to_string()) && text.contains("provider quota exceeded"),
        "{text}"
    );

    // Pages of two, oldest first, following the printed cursor.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..5 {
        let mut args = vec![
            "list",
            "--status",
            "pending",
            "--scope",
            "tenant-a",
            "--oldest-first",
            "--limit",
            "2",
        ];
        if let Some(cursor) = &after {
            args.extend(["--after", cursor]);
        }
        let page = pg(&f, &args);
        let text = page.ok().to_owned();
        seen.extend(
            text.lines()
                .skip(1)
                .filter(|l| !l.starts_with("next page"))
                .map(|l| l.split_whitespace().next().unwrap().to_owned()),
        );
        after = text
            .lines()
            .find_map(|l| l.strip_prefix("next page: --after "))
            .map(str::to_owned);
        if after.is_none() {
            break;
        }
    }
    let expected: Vec<String> = pending.iter().map(|t| t.id.to_string()).collect();
    assert_eq!(seen, expected, "every pending task once, oldest first");

    // Age filters count back from the store's clock: the fixture moves it
    // two hours on, and a new task is the only one newer than an hour.
    f.advance(Duration::from_secs(2 * 3600)).await;
    let new = submit(&*store, "tenant-a", "chat.reply", "late", RetryPolicy::default()).await;
    let newer = pg(&f, &["--json", "list", "--newer-than", "1h"]).json();
    assert_eq!(newer["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(newer["tasks"][0]["id"], new.id.to_string());
    let older = pg(&f, &["--json", "list", "--older-than", "1h", "--limit", "100"]).json();
    assert_eq!(older["tasks"].as_array().unwrap().len(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_tells_the_story_by_id_and_by_key() {
    let f = fixture().await;
    let store = f.store();
    let task = failed(&*store, "tenant-a", "req/with/slashes", "provider down").await;
    let reopened = store
        .reopen(
            task.id,
            taskfence::store::ReopenRequest::new("alice", "quota raised"),
        )
        .await
        .unwrap();
    assert!(reopened.is_accepted());
    let lease = acquire(&*store, task.id, "worker-2").await;
    let _ = store
        .complete(lease, taskfence::Response::from("hi"))
        .await
        .unwrap();

    let by_id = pg(&f, &["show", &task.id.to_string()]);
    let text = by_id.ok();
    for expected in [
        "tenant-a/chat.reply/req/with/slashes",
        "completed",
        "submitted",
        "attempt #1 claimed",
        "by worker-1",
        "attempt #1 failed_retryable",
        "provider down",
        "reopened #1",
        "by alice from failed at version 1: quota raised",
        "attempt #2 claimed",
        "attempt #2 completed",
        "handoff #1",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    // The timeline is in time order.
    let pos = |s: &str| text.find(s).unwrap();
    assert!(pos("attempt #1 claimed") < pos("reopened #1") && pos("reopened #1") < pos("attempt #2 claimed"));

    let by_key = pg(
        &f,
        &["--json", "show", "--key", "tenant-a/chat.reply/req/with/slashes"],
    )
    .json();
    assert_eq!(by_key["task"]["id"], task.id.to_string());
    assert_eq!(by_key["task"]["status"], "completed");
    assert_eq!(by_key["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(by_key["reopenings"][0]["by"], "alice");
    assert!(!by_key["handoffs"].as_array().unwrap().is_empty());

    let unknown_key = pg(&f, &["show", "--key", "tenant-a/chat.reply/nope"]);
    assert!(
        unknown_key
            .failed(3)
            .contains("no task with key tenant-a/chat.reply/nope")
    );
}
