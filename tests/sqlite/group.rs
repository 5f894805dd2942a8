//! Group commit: this process's concurrent writes share one transaction and
//! one commit, each still decided alone, none answered before the commit;
//! a failed write leaves its batch-mates written, a failed commit fails
//! them all, and a cancelled writer never leaves the write lock held.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{ConnectOptions, Connection};
use taskfence::testing::SqliteFixture;
use taskfence::{Error, InputHash, NewTask, RequestKey, SqliteStore, TaskStore};

fn task(key: &str, input: &str) -> NewTask {
    NewTask::new(RequestKey::new("user", "op", key), InputHash::of([input]))
}

/// A store on `f`'s file whose pool counts the transactions that wrote.
async fn counted(f: &SqliteFixture) -> (SqliteStore, Arc<AtomicU64>) {
    let commits = Arc::new(AtomicU64::new(0));
    let counter = commits.clone();
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .after_connect(move |conn, _meta| {
            let counter = counter.clone();
            Box::pin(async move {
                conn.lock_handle().await?.set_commit_hook(move || {
                    counter.fetch_add(1, Ordering::SeqCst);
                    true
                });
                Ok(())
            })
        })
        .connect_with(SqliteStore::connect_options(f.path()))
        .await
        .unwrap();
    (SqliteStore::new(pool), commits)
}

#[tokio::test(flavor = "current_thread")]
async fn concurrent_writes_share_commits_and_each_is_decided_alone() {
    let f = SqliteFixture::new().await;
    let (store, commits) = counted(&f).await;
    // 30 fresh keys, one key twice with the same inputs (one task), and one
    // key reused with other inputs (refused): 33 writes at once.
    let mut writes = Vec::new();
    for i in 0..30 {
        writes.push(task(&format!("k{i}"), "x"));
    }
    writes.push(task("k0", "x"));
    writes.push(task("k1", "other"));
    let handles: Vec<_> = writes
        .into_iter()
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move { store.submit(t).await })
        })
        .collect();
    let mut answers = Vec::new();
    for h in handles {
        answers.push(h.await.unwrap());
    }

    let created = answers
        .iter()
        .filter(|a| matches!(a, Ok(s) if s.is_created()))
        .count();
    assert_eq!(created, 30, "each fresh key created once: {answers:?}");
    assert!(
        matches!(&answers[30], Ok(s) if !s.is_created()),
        "the repeated submission found the task: {:?}",
        answers[30]
    );
    assert!(
        matches!(&answers[31], Err(Error::KeyConflict { .. })),
        "the reused key with other inputs refused: {:?}",
        answers[31]
    );
    assert_eq!(f.count("tasks").await, 30, "the file holds what was answered");
    let commits = commits.load(Ordering::SeqCst);
    assert!(
        commits <= 8,
        "{commits} commits for 31 writes that arrived together: they share commits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_fails_every_write_of_its_batch_and_writes_none() {
    let f = SqliteFixture::new().await;
    // The file may not grow: every big write fails, at its statement or at the commit.
    let full = super::faults::full_disk(&f).await;
    let before = f.count("tasks").await;
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let full = full.clone();
            let big = task(&format!("big{i}"), "x").payload(vec![7u8; 64 * 1024]);
            tokio::spawn(async move { full.submit(big).await })
        })
        .collect();
    for h in handles {
        let r = h.await.unwrap();
        assert!(matches!(r, Err(Error::Unwritable { .. })), "{r:?}");
    }
    assert_eq!(f.count("tasks").await, before, "none of the batch was written");
    assert_eq!(f.count("handoffs").await, 0, "no handoff either");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_writer_never_leaves_the_write_lock_held() {
    let f = SqliteFixture::new().await;
    let store = f.sqlite_store().clone();
    for round in 0..20u64 {
        let handles: Vec<_> = (0..12u64)
            .map(|i| {
                let store = store.clone();
                let key = format!("r{round}-{i}");
                tokio::spawn(async move {
                    let answer = store.submit(task(&key, "x")).await;
                    (key, answer)
                })
            })
            .collect();
        // Cancel every third writer at some point of its write: queued,
        // mid-operation, or waiting for its batch's commit.
        tokio::time::sleep(Duration::from_micros(200 * (round % 7))).await;
        for (i, h) in handles.iter().enumerate() {
            if i % 3 == 0 {
                h.abort();
            }
        }
        for h in handles {
            if let Ok((key, answer)) = h.await {
                let created = answer.expect("an uncancelled write answers");
                let found = store.find(&task(&key, "x").key).await.unwrap();
                assert_eq!(
                    found.map(|t| t.id),
                    Some(created.task().id),
                    "a write answered is in the file"
                );
            }
        }
    }
    // No batch is left holding the lock: another connection gets it, waiting
    // (SQLite's busy handler) at most for a left batch to be committed by
    // its waiters, never for the whole second a held lock would cost.
    let mut other = SqliteStore::connect_options(f.path())
        .busy_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .expect("the write lock is free");
    sqlx::raw_sql("ROLLBACK").execute(&mut other).await.unwrap();
    other.close().await.unwrap();
    // And the store still writes.
    assert!(store.submit(task("after", "x")).await.unwrap().is_created());
}
