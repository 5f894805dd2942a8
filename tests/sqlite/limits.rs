//! Concurrency keys and rate buckets decided by `SqliteStore`: the limits
//! suite, each test in a fresh file on a manual clock; and a file made by
//! the previous migration upgraded in place, its tasks kept; and what the
//! suite leaves to each backend: a bucket emptied by a `claim_next` batch
//! itself.

use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::SqlitePool;
use taskfence::testing::{Fixture, SqliteFixture, new_task};
use taskfence::throttle::{ConcurrencyKey, RateBucket, Throttled};
use taskfence::{
    Claim, ClaimNext, ClaimRequest, Error, InputHash, Lease, NewTask, RequestKey, SqliteStore, Status,
    TaskId, TaskStore,
};

taskfence::testing::limits_suite!(taskfence::testing::SqliteFixture::new());

const MIGRATION_1: &str = include_str!("../../migrations-sqlite/0001_tasks.sql");

/// A file as the library before limits left it: migration 1 applied and
/// recorded as its runner records it, and one pending task written with
/// that migration's columns.
async fn file_at_migration_1(pool: &SqlitePool, id: TaskId) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE taskfence_migrations (
            version INTEGER PRIMARY KEY, description TEXT NOT NULL,
            checksum BLOB NOT NULL, applied_at INTEGER NOT NULL);
         {MIGRATION_1}"
    )))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO taskfence_migrations VALUES (1, 'tasks, attempts, reopenings, handoffs, effects', ?1, 0)")
        .bind(Sha256::digest(MIGRATION_1.as_bytes()).to_vec())
        .execute(pool)
        .await
        .unwrap();
    let hash = InputHash::of(["old"]);
    sqlx::query(
        "INSERT INTO tasks (id, scope, operation, request_key, input_hash, payload, status, version,
            max_attempts, initial_backoff_ns, max_backoff_ns, multiplier, jitter, on_ambiguous, acceptance,
            budget_base, budget_started_at, created_at, expires_at, handoff)
        VALUES (?1, 'u', 'op', 'old', ?2, x'', 'pending', 0, 3, 1000000000, 60000000000, 2.0, 0.0,
            'retry', 'current_assignment', 0, 1, 1, 9000000000000000000, 0)",
    )
    .bind(id.as_uuid())
    .bind(hash.as_bytes().as_slice())
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_the_previous_migration_upgrades_in_place_and_keeps_its_tasks() {
    let dir = std::env::temp_dir().join(format!("taskfence-upgrade-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tasks.db");
    let pool = SqlitePool::connect_with(SqliteStore::connect_options(&path).create_if_missing(true))
        .await
        .unwrap();
    let old = TaskId::new();
    file_at_migration_1(&pool, old).await;

    let store = SqliteStore::open(&path).await.unwrap();
    let refused = store.get(old).await;
    assert!(
        matches!(refused, Err(Error::NotMigrated { .. })),
        "the library needs the new migration: {refused:?}"
    );
    store.migrate().await.unwrap();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM taskfence_migrations ORDER BY version")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(versions, [1, 2], "only the new migration applied");
    store.migrate().await.unwrap();

    let kept = store.get(old).await.unwrap().expect("the task is kept");
    assert_eq!(
        (kept.status, kept.version, kept.key.key.as_str()),
        (Status::Pending, 0, "old")
    );
    assert!(kept.limits.is_none(), "an old task names no limit");
    let lease = ClaimRequest::new("w", Duration::from_secs(30));
    assert!(
        store.claim(old, lease.clone()).await.unwrap().is_acquired(),
        "and runs"
    );

    // New tasks name limits on the upgraded file.
    store
        .define_bucket(RateBucket::per_minute("provider", 60).burst(1))
        .await
        .unwrap();
    let key = ConcurrencyKey::new("conversation-7", 1);
    let mut ids = Vec::new();
    for k in ["m1", "m2"] {
        let new = NewTask::new(RequestKey::new("u", "op", k), InputHash::of([k]))
            .concurrency(key.clone())
            .rate_bucket("provider");
        ids.push(store.submit(new).await.unwrap().into_task().id);
    }
    let stored = store.get(ids[0]).await.unwrap().unwrap();
    assert_eq!(stored.limits.concurrency.as_ref(), Some(&key));
    assert_eq!(stored.limits.bucket.as_deref(), Some("provider"));
    assert_eq!(
        store.claim(ids[1], lease.clone()).await.unwrap().throttled(),
        Some(&Throttled::InOrder {
            key: "conversation-7".into(),
            behind: ids[0]
        })
    );
    assert!(store.claim(ids[0], lease).await.unwrap().is_acquired());

    store.pool().close().await;
    pool.close().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A bucket emptied by a `claim_next` batch itself: the batch's other
/// bucketed tasks are skipped, and it goes on to tasks beyond them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_emptied_by_the_batch_leaves_its_places_to_other_tasks() {
    let f = SqliteFixture::new().await;
    let store = f.store();
    store
        .define_bucket(RateBucket::per_minute("provider", 60).burst(2))
        .await
        .unwrap();
    let mut bucketed = Vec::new();
    for i in 0..12 {
        bucketed.push(
            store
                .submit(new_task(&format!("b{i}")).rate_bucket("provider"))
                .await
                .unwrap()
                .into_task()
                .id,
        );
        f.advance(Duration::from_millis(1)).await;
    }
    let mut free = Vec::new();
    for i in 0..3 {
        free.push(
            store
                .submit(new_task(&format!("f{i}")))
                .await
                .unwrap()
                .into_task()
                .id,
        );
    }
    let taken = store
        .claim_next(ClaimNext::new("w", Duration::from_secs(30), 10))
        .await
        .unwrap();
    let mut got: Vec<TaskId> = taken.iter().map(Lease::task_id).collect();
    got.sort();
    let mut want = vec![bucketed[0], bucketed[1], free[0], free[1], free[2]];
    want.sort();
    assert_eq!(got, want, "the burst, then the tasks without a bucket");
    for id in &bucketed[2..] {
        let t = store.get(*id).await.unwrap().unwrap();
        assert_eq!((t.version, t.attempts()), (0, 0), "skipped, not claimed");
    }
}

/// With keyed tasks unfinished, `claim_next`'s ranked scan keeps the
/// request's operation and scope filters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ranked_scan_keeps_the_operation_and_scope_filters() {
    let f = SqliteFixture::new().await;
    let store = f.store();
    let key = ConcurrencyKey::new("tenant-acme", 10);
    let mut wanted = Vec::new();
    for (scope, operation, k) in [
        ("u1", "chat.reply", "a"),
        ("u1", "index", "b"),
        ("u2", "chat.reply", "c"),
        ("u1", "chat.reply", "d"),
    ] {
        let new =
            NewTask::new(RequestKey::new(scope, operation, k), InputHash::of([k])).concurrency(key.clone());
        let id = store.submit(new).await.unwrap().into_task().id;
        if scope == "u1" && operation == "chat.reply" {
            wanted.push(id);
        }
    }
    let asked = ClaimNext::new("w", Duration::from_secs(30), 10)
        .operation("chat.reply")
        .scope("u1");
    let mut got: Vec<TaskId> = store
        .claim_next(asked)
        .await
        .unwrap()
        .iter()
        .map(Lease::task_id)
        .collect();
    got.sort();
    wanted.sort();
    assert_eq!(got, wanted, "only the operation and scope asked for");
}

/// `Claim::Throttled`'s reason, if the claim was refused for a limit.
trait ThrottledReason {
    fn throttled(&self) -> Option<&Throttled>;
}

impl ThrottledReason for Claim {
    fn throttled(&self) -> Option<&Throttled> {
        match self {
            Claim::Throttled(why) => Some(why),
            _ => None,
        }
    }
}
