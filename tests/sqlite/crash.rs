//! `kill -9` of a writer: mid-way through its churn of submits, claims and
//! completions, and while it holds an open write transaction with
//! uncommitted tasks. After each kill the file passes `PRAGMA
//! integrity_check`, the invariants hold when read from the database, the
//! uncommitted tasks are nowhere, and the next writer writes at once.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use taskfence::testing::SqliteFixture;
use taskfence::{Claim, ClaimRequest, InputHash, NewTask, RequestKey, SqliteStore, TaskStore};

use crate::{child, invariants};

const TEST: &str = "crash::killed_writer_leaves_a_sound_file";

fn task(key: String) -> NewTask {
    NewTask::new(RequestKey::new("user", "op", key), InputHash::of(["x"]))
}

/// The writer's part: churn forever; in role `hold`, first also open a
/// write transaction with 50 submissions, say so, and never commit it.
async fn writer(path: &str, role: &str) {
    let store = SqliteStore::open(path).await.expect("open the file");
    let (going, started) = tokio::sync::oneshot::channel();
    let churn = {
        let store = store.clone();
        let role = role.to_owned();
        tokio::spawn(async move {
            let mut going = Some(going);
            for i in 0u64.. {
                let t = store
                    .submit(task(format!("{role}-{i}")))
                    .await
                    .unwrap()
                    .into_task();
                if let Claim::Acquired(lease) = store
                    .claim(t.id, ClaimRequest::new(&role, Duration::from_secs(30)))
                    .await
                    .unwrap()
                    && !i.is_multiple_of(3)
                {
                    assert!(store.complete(lease, "done".into()).await.unwrap().is_accepted());
                }
                if i == 20
                    && let Some(going) = going.take()
                {
                    let _ = going.send(());
                }
            }
        })
    };
    started.await.unwrap();
    println!("CHURNING");
    if role == "hold" {
        // Churn goes on, waiting for the lock this transaction holds.
        let mut tx = store.begin().await.unwrap();
        for i in 0..50 {
            store
                .on(&mut tx)
                .submit(task(format!("uncommitted-{i}")))
                .await
                .unwrap();
        }
        println!("MID-TRANSACTION");
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(tx);
    }
    churn.await.unwrap();
}

/// Waits until the child prints `line`.
async fn until_printed(child: &mut std::process::Child, line: &'static str) {
    let stdout = child.stdout.take().expect("piped stdout");
    tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        while let Some(Ok(l)) = lines.next() {
            if l.contains(line) {
                return;
            }
        }
        panic!("the child ended without printing {line}");
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_writer_leaves_a_sound_file() {
    if let Some((role, file)) = child::role() {
        return writer(&file, &role).await;
    }
    let f = SqliteFixture::new().await;
    for (round, role) in ["churn", "churn", "hold"].into_iter().enumerate() {
        let mut child = child::spawn(TEST, role, f.path());
        let marker = if role == "hold" {
            "MID-TRANSACTION"
        } else {
            "CHURNING"
        };
        tokio::time::timeout(Duration::from_secs(60), until_printed(&mut child, marker))
            .await
            .expect("the writer got going");
        if role == "churn" {
            tokio::time::sleep(Duration::from_millis(50 + 70 * round as u64)).await;
        }
        child.kill().expect("kill -9 the writer"); // SIGKILL: no destructor, no rollback, no checkpoint
        child.wait().unwrap();

        invariants::check(f.path()).await;
        let uncommitted: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tasks WHERE request_key LIKE 'uncommitted-%'")
                .fetch_one(f.sqlite_store().pool())
                .await
                .unwrap();
        assert_eq!(uncommitted, 0, "nothing of the killed transaction stays");
        // The lock died with the writer: the next write goes through at once.
        let next = f.reopen().await;
        let t = next
            .submit(task(format!("after-{round}")))
            .await
            .unwrap()
            .into_task();
        assert!(
            next.claim(t.id, ClaimRequest::new("next", Duration::from_secs(30)))
                .await
                .unwrap()
                .is_acquired()
        );
        let written: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE request_key LIKE ?1")
            .bind(format!("{role}-%"))
            .fetch_one(f.sqlite_store().pool())
            .await
            .unwrap();
        println!("round {round} ({role}): the killed writer had committed {written} tasks in all");
        assert!(written > 20, "the writer wrote before it was killed");
    }
}
