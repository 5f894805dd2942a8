//! Faults injected for real: a read-only file, a full disk (the file capped
//! at its size with `max_page_count`), and a write lock held by another
//! connection. Each is a typed error with nothing half-written, or a wait.

use std::time::{Duration, Instant};

use sqlx::{ConnectOptions, Connection};
use taskfence::testing::{Fixture, SqliteFixture};
use taskfence::{ClaimRequest, Error, InputHash, NewTask, RequestKey, SqliteStore, TaskStore};

fn unwritable<T>(r: &taskfence::Result<T>) -> bool {
    matches!(r, Err(Error::Unwritable { .. }))
}

fn task(key: &str) -> NewTask {
    NewTask::new(RequestKey::new("user", "op", key), InputHash::of(["x"]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_file_is_a_typed_error_and_nothing_is_written() {
    let f = SqliteFixture::new().await;
    let task = f.sqlite_store().submit(task("k")).await.unwrap().into_task();
    let before = (
        f.record_count().await,
        f.sqlite_store().get(task.id).await.unwrap(),
    );
    let read_only = SqliteStore::builder(f.path())
        .options(SqliteStore::connect_options(f.path()).read_only(true))
        .open()
        .await
        .unwrap();
    // Reads work.
    assert_eq!(read_only.get(task.id).await.unwrap(), before.1);
    // Writes are refused, typed.
    let submitted = read_only.submit(self::task("other")).await;
    assert!(unwritable(&submitted), "{submitted:?}");
    let claimed = read_only
        .claim(task.id, ClaimRequest::new("w", Duration::from_secs(30)))
        .await;
    assert!(unwritable(&claimed), "{claimed:?}");
    let cancelled = read_only.cancel(task.id, "why").await;
    assert!(unwritable(&cancelled), "{cancelled:?}");
    assert_eq!(
        (
            f.record_count().await,
            f.sqlite_store().get(task.id).await.unwrap()
        ),
        before,
        "nothing written"
    );
}

/// A store on `f`'s file that may not grow past its size now: a full disk.
pub(crate) async fn full_disk(f: &SqliteFixture) -> SqliteStore {
    let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
        .fetch_one(f.sqlite_store().pool())
        .await
        .unwrap();
    SqliteStore::builder(f.path())
        .options(SqliteStore::connect_options(f.path()).pragma("max_page_count", pages.to_string()))
        .open()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_a_typed_error_and_nothing_is_half_written() {
    let f = SqliteFixture::new().await;
    let store = f.sqlite_store();
    store.submit(task("first")).await.unwrap();
    let full = full_disk(&f).await;
    let before = f.record_count().await;
    let big = task("big").payload(vec![7u8; 256 * 1024]);
    let r = full.submit(big.clone()).await;
    assert!(matches!(r, Err(Error::Unwritable { .. })), "{r:?}");
    assert_eq!(
        f.record_count().await,
        before,
        "no task row, no handoff: nothing half-written"
    );
    assert!(store.find(&big.key).await.unwrap().is_none());
    // Space again: the same submission goes through whole.
    assert!(store.submit(big).await.unwrap().is_created());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_elsewhere_is_waited_for_then_refused_past_the_budget() {
    let f = SqliteFixture::new().await;
    let mut other = SqliteStore::connect_options(f.path()).connect().await.unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();

    // Within the budget: the write waits for the lock, then goes through.
    let store = f.sqlite_store().clone();
    let started = Instant::now();
    let waiting = tokio::spawn(async move { store.submit(task("waits")).await });
    tokio::time::sleep(Duration::from_millis(1500)).await; // past one busy_timeout: a retry happened
    sqlx::raw_sql("COMMIT").execute(&mut other).await.unwrap();
    assert!(
        waiting.await.unwrap().unwrap().is_created(),
        "no busy error reached the caller"
    );
    assert!(started.elapsed() >= Duration::from_millis(1500));

    // Past the budget: a typed refusal, nothing written.
    let impatient = SqliteStore::builder(f.path())
        .busy_timeout(Duration::from_millis(50))
        .busy_budget(Duration::from_millis(300))
        .open()
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let before = f.record_count().await;
    let r = impatient.submit(task("refused")).await;
    match r {
        Err(Error::Busy { waited }) => assert!(waited >= Duration::from_millis(300), "{waited:?}"),
        other => panic!("expected Error::Busy, got {other:?}"),
    }
    sqlx::raw_sql("ROLLBACK").execute(&mut other).await.unwrap();
    assert_eq!(f.record_count().await, before, "nothing written");
    other.close().await.unwrap();
}
