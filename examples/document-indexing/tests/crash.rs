//! A crash between writing the entries and completing the task leaves nothing behind.
mod common;

use std::time::Duration;

use common::{Harness, LEASE, V1, expected_visible};
use document_indexing::{Claimed, Indexed, chunk};
use sqlx::{Connection, PgConnection};
use taskfence::{Claim, Status, TaskStore};
use taskfence_test_support::eventually;

#[tokio::test]
async fn a_worker_killed_between_entries_and_completion_leaves_no_entries() {
    let h = Harness::new().await;
    let task = h.indexer.upload("plan", 1, V1).await.unwrap().task.id;
    let Claimed::Job(job) = h.indexer.claim(task, "worker-a", LEASE).await.unwrap() else {
        panic!("a fresh task is claimable")
    };

    // The worker's own session: write the entries inside its transaction…
    let mut conn = PgConnection::connect(h.fixture.url()).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let mut tx = conn.begin().await.unwrap();
    let written = h.indexer.write_entries(&mut tx, &job).await.unwrap();
    assert_eq!(
        written,
        chunk(V1).len() as u64,
        "the entries were written in the transaction"
    );
    assert!(h.indexer.advance_current(&mut tx, &job).await.unwrap());

    // …then the worker dies before completing: the server ends its session.
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(h.indexer.store().pool())
        .await
        .unwrap();
    assert!(killed);
    // The session is gone once the server has rolled its transaction back.
    eventually(Duration::from_secs(10), || async {
        let alive: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
            .bind(pid)
            .fetch_one(h.indexer.store().pool())
            .await
            .unwrap();
        (!alive).then_some(())
    })
    .await;
    assert!(
        h.indexer
            .store()
            .on(&mut tx)
            .complete(job.lease().clone(), "late".into())
            .await
            .is_err(),
        "the dead session cannot complete"
    );
    drop(tx);
    drop(conn);

    assert_eq!(h.app_rows("index_entries").await, 0, "no partial entries");
    assert_eq!(h.indexer.current_version("plan").await.unwrap(), Some(0));
    assert_eq!(h.status(task).await, Status::Running, "never completed");

    // The crashed worker's lease still holds the task until it expires; then
    // the task is claimable again, and one run indexes it once.
    let busy = h.indexer.index_once("worker-b", task, LEASE).await.unwrap();
    assert!(
        matches!(busy, Indexed::NotClaimed(Claim::Busy { .. })),
        "{busy:?}"
    );
    h.advance(LEASE + Duration::from_secs(1)).await;
    let redo = h.indexer.index_once("worker-b", task, LEASE).await.unwrap();
    assert!(
        matches!(redo, Indexed::Done { entries_written, became_current: true, .. } if entries_written == chunk(V1).len() as u64),
        "{redo:?}"
    );
    assert_eq!(h.stored_entries("plan", 1).await, chunk(V1));
    assert_eq!(h.visible("plan").await, expected_visible(1, V1));
    assert_eq!(h.indexer.store().attempts(task).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_rolled_back_transaction_leaves_no_entries_and_the_lease_still_works() {
    let h = Harness::new().await;
    let task = h.indexer.upload("plan", 1, V1).await.unwrap().task.id;
    let Claimed::Job(job) = h.indexer.claim(task, "worker-a", LEASE).await.unwrap() else {
        panic!("a fresh task is claimable")
    };
    let mut conn = h.indexer.store().pool().acquire().await.unwrap();
    {
        // An error after the writes (say, the embedding service failed): the
        // transaction is dropped without committing.
        let mut tx = conn.begin().await.unwrap();
        assert!(h.indexer.write_entries(&mut tx, &job).await.unwrap() > 0);
        assert!(h.indexer.advance_current(&mut tx, &job).await.unwrap());
        drop(tx);
    }
    assert_eq!(h.app_rows("index_entries").await, 0);
    assert_eq!(h.indexer.current_version("plan").await.unwrap(), Some(0));

    // The same worker, still holding a live lease, tries again: one set of entries.
    let outcome = h.indexer.commit(&mut conn, job).await.unwrap();
    assert!(
        matches!(
            outcome,
            Indexed::Done {
                became_current: true,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(h.stored_entries("plan", 1).await, chunk(V1));
    assert_eq!(h.indexer.store().attempts(task).await.unwrap().len(), 1);
}
