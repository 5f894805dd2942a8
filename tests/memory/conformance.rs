//! The whole conformance suite against `MemoryStore` on a manual clock.

taskfence::testing::conformance_suite!(async { taskfence::testing::MemoryFixture::new() });

/// The application's own writes under the fence: `MemoryStore::fenced_write`.
#[tokio::test]
async fn own_writes_commit_only_under_a_current_lease() {
    taskfence::testing::scenarios::own_writes_commit_only_under_a_current_lease(
        &taskfence::testing::MemoryFixture::new(),
    )
    .await;
}
