//! The whole conformance suite against `PgStore` on a real PostgreSQL server,
//! each test in a fresh schema of its own (so they run in parallel).

use crate::common;

taskfence::testing::conformance_suite!(common::fixture());

/// Claims rolled back in the caller's transaction (`PgStore::on(&mut tx)`).
mod rollback {
    taskfence::testing::rollback_suite!(crate::common::fixture());
}

/// The application's own writes under the fence: `PgStore::on(&mut tx).fence`
/// in the application's transaction.
#[tokio::test]
async fn own_writes_commit_only_under_a_current_lease() {
    taskfence::testing::scenarios::own_writes_commit_only_under_a_current_lease(&common::fixture().await)
        .await;
}
