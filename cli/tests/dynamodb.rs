//! The same commands on DynamoDB (moto, found through
//! `TASKFENCE_DYNAMODB_ENDPOINT`, which `scripts/test` exports): the binary
//! reaches it through the standard AWS configuration chain and
//! `--dynamodb-endpoint`.

mod common;

use common::{Run, completed, failed, run, taskfence};
use taskfence::testing::{DynamoFixture, Fixture, acquire};
use taskfence::{Status, TaskId};

/// The binary on `table` at the test endpoint, with static test credentials.
fn dynamo(table: &str, args: &[&str]) -> Run {
    let endpoint = taskfence_test_support::dynamo::endpoint();
    run(taskfence()
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .args(["--dynamodb-table", table, "--dynamodb-endpoint", &endpoint])
        .args(args))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_list_show_and_reopen_on_dynamodb() {
    let f: DynamoFixture = taskfence_test_support::dynamo::fixture().await;
    let table = f.table().to_owned();
    let store = f.store();
    let bad = failed(&*store, "tenant-a", "k1", "provider quota exceeded").await;
    let done = completed(&*store, "tenant-a", "k2").await;

    let stats = dynamo(&table, &["--json", "stats"]).json();
    assert_eq!(
        (stats["failed"].as_u64(), stats["completed"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(stats["total"], 2);

    let page = dynamo(&table, &["--json", "list", "--status", "failed"]).json();
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(page["tasks"][0]["id"], bad.id.to_string());
    let table_text = dynamo(&table, &["list"]);
    assert!(table_text.ok().contains(&done.id.to_string()), "{table_text:#?}");

    let shown = dynamo(&table, &["show", &bad.id.to_string()]);
    let text = shown.ok();
    assert!(
        text.contains("attempt #1 failed_retryable") && text.contains("provider quota exceeded"),
        "{text}"
    );
    let by_key = dynamo(&table, &["--json", "show", "--key", "tenant-a/chat.reply/k2"]).json();
    assert_eq!(by_key["task"]["id"], done.id.to_string());
    let handoffs = by_key["handoffs"].as_array().unwrap();
    assert_eq!(
        handoffs.len(),
        1,
        "the submission's handoff, from the outbox: {handoffs:?}"
    );
    assert!(handoffs[0]["published_at"].is_null(), "no dispatcher ran");

    let reopened = dynamo(
        &table,
        &[
            "reopen",
            &bad.id.to_string(),
            "--reason",
            "quota raised",
            "--by",
            "alice",
        ],
    );
    assert!(
        reopened.ok().starts_with(&format!("reopened task {}", bad.id)),
        "{reopened:#?}"
    );
    // The binary wrote on this machine's clock: bring the fixture's up to it.
    f.clock().set(time::OffsetDateTime::now_utc());
    acquire(&*store, bad.id, "worker-2").await;

    let before = f.record_count().await;
    dynamo(&table, &["reopen", &done.id.to_string(), "--reason", "again"]).failed(4);
    dynamo(&table, &["show", &TaskId::new().to_string()]).failed(3);
    assert_eq!(f.record_count().await, before);
    assert_eq!(
        store.get(done.id).await.unwrap().unwrap().status,
        Status::Completed
    );

    // --redispatch on DynamoDB: a fresh handoff in the store's outbox.
    // A task submitted an hour ago (on the writer's clock) nobody claimed.
    f.clock()
        .set(time::OffsetDateTime::now_utc() - std::time::Duration::from_secs(3600));
    let lost = common::submit(&*store, "tenant-a", "op", "k3", taskfence::RetryPolicy::default()).await;
    let stranded = dynamo(&table, &["stranded", "--older-than", "15m", "--redispatch"]);
    assert_eq!(stranded.code, 0, "{stranded:#?}");
    assert!(stranded.stdout.contains(&lost.id.to_string()), "{stranded:#?}");
    assert!(
        stranded.stdout.contains("re-dispatched 1 task(s)"),
        "{stranded:#?}"
    );
    let story = taskfence::inspect::Inspect::story(f.dynamo_store(), lost.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        story.handoffs.len(),
        2,
        "the submission's handoff and the re-dispatch's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_a_missing_table_once() {
    let unique = uuid_suffix();
    let table = format!("taskfence_test_cli_{unique}");
    let missing = dynamo(&table, &["stats"]);
    assert!(missing.failed(1).contains("does not exist"), "{missing:#?}");

    assert_eq!(
        dynamo(&table, &["migrate"]).ok(),
        format!("created table {table}\n")
    );
    assert_eq!(
        dynamo(&table, &["migrate"]).ok(),
        format!("table {table} already exists: nothing to do\n")
    );
    assert_eq!(dynamo(&table, &["--json", "stats"]).json()["total"], 0);

    taskfence_test_support::dynamo::client()
        .delete_table()
        .table_name(&table)
        .send()
        .await
        .expect("delete the table");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_status_and_dry_run_describe_the_table() {
    let table = format!("taskfence_test_cli_{}", uuid_suffix());
    assert_eq!(
        dynamo(&table, &["migrate", "--status"]).ok(),
        format!("table {table} does not exist: `taskfence migrate` creates it\n")
    );
    assert_eq!(
        dynamo(&table, &["migrate", "--dry-run"]).ok(),
        format!("would create table {table} (nothing changed)\n")
    );
    let missing = dynamo(&table, &["--json", "migrate", "--status"]).json();
    assert_eq!(missing["exists"], false, "still missing: looking creates nothing");
    // PostgreSQL-only flags: usage errors, before anything connects.
    for args in [&["migrate", "--print-sql"][..], &["migrate", "--to", "3"]] {
        assert!(dynamo(&table, args).failed(2).contains("PostgreSQL"));
    }

    dynamo(&table, &["migrate"]).ok();
    let status = dynamo(&table, &["migrate", "--status"]);
    let text = status.ok();
    assert!(
        text.starts_with(&format!("table {table} exists (ACTIVE)\n")),
        "{text}"
    );
    for index in ["due", "purge", "status", "unclaimed"] {
        assert!(
            text.lines().any(|l| l.starts_with(index) && l.ends_with("yes")),
            "{index} in\n{text}"
        );
    }
    let json = dynamo(&table, &["--json", "migrate", "--status"]).json();
    assert_eq!(json["exists"], true);
    assert_eq!(json["ttl"], true);
    assert!(
        json["indexes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["present"] == true)
    );
    assert_eq!(
        dynamo(&table, &["migrate", "--dry-run"]).ok(),
        format!("table {table} already exists: migrate would change nothing\n")
    );

    taskfence_test_support::dynamo::client()
        .delete_table()
        .table_name(&table)
        .send()
        .await
        .expect("delete the table");
}

fn uuid_suffix() -> String {
    let id = TaskId::new().to_string().replace('-', "");
    id[id.len() - 12..].to_owned()
}
