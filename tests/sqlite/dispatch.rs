//! The dispatch suite (the outbox: the `handoffs` table) against `SqliteStore`.

taskfence::testing::dispatch_suite!(taskfence::testing::SqliteFixture::new());

/// A store built `without_handoffs` writes no handoff row, whatever the
/// task says: an application without a dispatcher accumulates nothing. The
/// default store writes one per submission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_handoffs_writes_no_handoff_row_and_the_default_one_does() {
    use taskfence::TaskStore;
    use taskfence::testing::new_task;
    let f = taskfence::testing::SqliteFixture::new().await;
    let plain = taskfence::SqliteStore::builder(f.path())
        .without_handoffs()
        .open()
        .await
        .unwrap();
    plain.submit(new_task("no-outbox")).await.unwrap();
    let mut tx = plain.begin().await.unwrap();
    plain
        .on(&mut tx)
        .submit(new_task("no-outbox-in-tx"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!((f.count("tasks").await, f.count("handoffs").await), (2, 0));
    f.sqlite_store().submit(new_task("outbox")).await.unwrap();
    assert_eq!((f.count("tasks").await, f.count("handoffs").await), (3, 1));
}
