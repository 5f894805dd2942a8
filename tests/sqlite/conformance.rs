//! The whole conformance suite against `SqliteStore`, each test in a fresh
//! file of its own on a manual clock.

taskfence::testing::conformance_suite!(taskfence::testing::SqliteFixture::new());

/// Claims rolled back in the application's transaction (`SqliteStore::on(&mut tx)`).
mod rollback {
    taskfence::testing::rollback_suite!(taskfence::testing::SqliteFixture::new());
}

/// The application's own writes under the fence: `SqliteStore::on(&mut tx).fence`
/// in the application's `BEGIN IMMEDIATE` transaction.
#[tokio::test]
async fn own_writes_commit_only_under_a_current_lease() {
    taskfence::testing::scenarios::own_writes_commit_only_under_a_current_lease(
        &taskfence::testing::SqliteFixture::new().await,
    )
    .await;
}
