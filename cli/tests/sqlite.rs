//! The same commands on a SQLite file (`--sqlite PATH`): the binary opens the
//! file the library's store writes.

mod common;

use common::{Run, completed, failed, run, taskfence};
use taskfence::Status;
use taskfence::testing::{Fixture, SqliteFixture, acquire};

fn sqlite(path: &std::path::Path, args: &[&str]) -> Run {
    run(taskfence().arg("--sqlite").arg(path).args(args))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_list_show_reopen_and_stranded_on_a_sqlite_file() {
    let f = SqliteFixture::new().await;
    let store = f.store();
    let bad = failed(&*store, "tenant-a", "k1", "provider quota exceeded").await;
    let done = completed(&*store, "tenant-a", "k2").await;

    let stats = sqlite(f.path(), &["--json", "stats"]).json();
    assert_eq!(
        (stats["failed"].as_u64(), stats["completed"].as_u64()),
        (Some(1), Some(1))
    );

    let page = sqlite(f.path(), &["--json", "list", "--status", "failed"]).json();
    assert_eq!(page["tasks"][0]["id"], bad.id.to_string());
    assert!(sqlite(f.path(), &["list"]).ok().contains(&done.id.to_string()));

    let text = sqlite(f.path(), &["show", &bad.id.to_string()]).ok().to_owned();
    assert!(text.contains("provider quota exceeded"), "{text}");

    let reopened = sqlite(
        f.path(),
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
    assert_eq!(store.get(bad.id).await.unwrap().unwrap().status, Status::Running);

    // A task nobody claimed, an hour old on the store's clock: stranded, and handed off again.
    let lost = store
        .submit(taskfence::testing::new_task("lost"))
        .await
        .unwrap()
        .into_task();
    let handoffs = f.count("handoffs").await;
    let older = time::OffsetDateTime::now_utc() - time::Duration::hours(2);
    sqlx::query("UPDATE tasks SET created_at = ?1 WHERE id = ?2")
        .bind(i64::try_from(older.unix_timestamp_nanos()).unwrap())
        .bind(lost.id.as_uuid())
        .execute(f.sqlite_store().pool())
        .await
        .unwrap();
    let stranded = sqlite(
        f.path(),
        &["--json", "stranded", "--older-than", "1h", "--redispatch"],
    )
    .json();
    assert_eq!(stranded["tasks"][0]["id"], lost.id.to_string(), "{stranded}");
    assert_eq!(f.count("handoffs").await, handoffs + 1, "a fresh handoff");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_the_file_and_other_commands_need_it() {
    let dir = std::env::temp_dir().join(format!("taskfence-cli-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tasks.db");
    let missing = sqlite(&path, &["stats"]);
    assert!(missing.failed(1).contains("does not exist"), "{missing:#?}");
    assert!(!path.exists(), "a mistyped path is not a new store");
    assert!(sqlite(&path, &["migrate"]).ok().contains("is up to date"));
    assert!(
        sqlite(&path, &["migrate"]).ok().contains("is up to date"),
        "idempotent"
    );
    assert_eq!(sqlite(&path, &["--json", "stats"]).json()["total"], 0);
    let refused = sqlite(&path, &["migrate", "--print-sql"]);
    assert!(refused.failed(2).contains("for PostgreSQL"), "{refused:#?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_show_each_bucket_and_who_holds_a_keys_slots() {
    use taskfence::throttle::{ConcurrencyKey, RateBucket};

    let f = SqliteFixture::new().await;
    let store = f.store();
    assert_eq!(sqlite(f.path(), &["limits"]).ok(), "no rate buckets\n");
    store
        .define_bucket(RateBucket::per_minute("openai-key-1", 500).burst(50))
        .await
        .unwrap();
    let keyed =
        |key: &str| taskfence::testing::new_task(key).concurrency(ConcurrencyKey::new("conversation-7", 1));
    let first = store.submit(keyed("m1")).await.unwrap().into_task();
    store.submit(keyed("m2")).await.unwrap();
    // The fixture's clock is the binary's: both read the lease as live.
    f.clock().set(time::OffsetDateTime::now_utc());
    acquire(&*store, first.id, "worker-1").await;

    let json = sqlite(f.path(), &["--json", "limits", "--key", "conversation-7"]).json();
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

    let shown = sqlite(f.path(), &["limits", "--key", "conversation-7"]);
    let text = shown.ok();
    assert!(text.contains("openai-key-1  500/1m  50     50"), "{text}");
    assert!(
        text.contains("key conversation-7: 1 running, 1 waiting"),
        "{text}"
    );
    assert!(text.contains(&first.id.to_string()), "{text}");

    let too_long = "k".repeat(taskfence::throttle::MAX_NAME_LEN + 1);
    let refused = sqlite(f.path(), &["limits", "--key", &too_long]);
    assert!(refused.failed(2).contains("concurrency_key"), "{refused:#?}");
}
