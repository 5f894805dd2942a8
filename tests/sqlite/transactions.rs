//! `SqliteStore::on(&mut tx)`: the store's operations inside the
//! application's own transaction. The application's rows and the task's
//! commit together or roll back together; a refused operation leaves the
//! transaction usable.

use std::time::Duration;

use taskfence::testing::{Fixture, SqliteFixture, acquire, new_task};
use taskfence::{ClaimRequest, Error, Fenced, Status, TaskStore};

async fn host_rows(f: &SqliteFixture) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(f.sqlite_store().pool())
        .await
        .unwrap()
}

async fn setup() -> SqliteFixture {
    let f = SqliteFixture::new().await;
    sqlx::query("CREATE TABLE messages (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        .execute(f.sqlite_store().pool())
        .await
        .unwrap();
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_commits_and_rolls_back_with_the_application_row() {
    let f = setup().await;
    let store = f.sqlite_store();
    for commit in [false, true] {
        let mut tx = store.begin().await.unwrap();
        sqlx::query("INSERT INTO messages (id, body) VALUES (1, 'hello')")
            .execute(&mut *tx)
            .await
            .unwrap();
        let task = store.on(&mut tx).submit(new_task("k")).await.unwrap().into_task();
        // The handle sees its own transaction's writes; the pool does not, yet.
        assert!(store.on(&mut tx).get(task.id).await.unwrap().is_some());
        if commit {
            tx.commit().await.unwrap();
            assert_eq!(
                (
                    host_rows(&f).await,
                    f.count("tasks").await,
                    f.count("handoffs").await
                ),
                (1, 1, 1)
            );
        } else {
            tx.rollback().await.unwrap();
            assert_eq!(f.record_count().await, 0, "task and handoff rolled back");
            assert_eq!(host_rows(&f).await, 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_and_reply_are_one_transaction_and_a_rolled_back_claim_leaves_no_lease() {
    let f = setup().await;
    let store = f.sqlite_store();
    let task = store.submit(new_task("k")).await.unwrap().into_task();

    // A claim rolled back: the row is as before, and its lease writes nothing.
    let mut tx = store.begin().await.unwrap();
    let ghost = acquire(&store.on(&mut tx), task.id, "ghost").await;
    tx.rollback().await.unwrap();
    assert_eq!(store.get(task.id).await.unwrap().unwrap().status, Status::Pending);
    assert_eq!(f.count("attempts").await, 0);

    assert_eq!(
        store.complete(ghost, "ghost".into()).await.unwrap().rejection(),
        Some(&taskfence::Rejection::Superseded { current_version: 0 }),
        "the rolled-back assignment does not exist"
    );
    let lease = acquire(store, task.id, "w").await;

    let mut tx = store.begin().await.unwrap();
    sqlx::query("INSERT INTO messages (id, body) VALUES (1, 'the reply')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let saved = store
        .on(&mut tx)
        .complete(lease, "the reply".into())
        .await
        .unwrap();
    assert!(saved.is_accepted());
    tx.commit().await.unwrap();
    assert_eq!(host_rows(&f).await, 1);
    assert_eq!(
        store.get(task.id).await.unwrap().unwrap().status,
        Status::Completed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_inside_the_transaction_leave_it_usable() {
    let f = setup().await;
    let store = f.sqlite_store();
    let task = store.submit(new_task("k")).await.unwrap().into_task();
    let mut tx = store.begin().await.unwrap();
    let on = store.on(&mut tx);
    // Bad input, a conflict, an unknown task, a rejection: each refused, none ends the transaction.
    assert!(matches!(
        on.claim(task.id, ClaimRequest::new("w", Duration::ZERO)).await,
        Err(Error::InvalidInput(_))
    ));
    let conflicting = taskfence::NewTask::new(new_task("k").key, taskfence::InputHash::of(["other"]));
    assert!(matches!(
        on.submit(conflicting).await,
        Err(Error::KeyConflict { .. })
    ));
    assert!(matches!(
        on.cancel(taskfence::TaskId::new(), "x").await,
        Err(Error::NotFound(_))
    ));
    let lease = acquire(&on, task.id, "w").await;
    assert!(matches!(on.fence(&lease).await.unwrap(), Fenced::Accepted(())));
    drop(on);
    sqlx::query("INSERT INTO messages (id, body) VALUES (1, 'still usable')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(host_rows(&f).await, 1);
    assert_eq!(store.get(task.id).await.unwrap().unwrap().status, Status::Running);
}
