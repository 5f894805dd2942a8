//! The whole conformance suite against `DynamoStore` on a real DynamoDB API
//! (moto in `scripts/test`), each test on a fresh table of its own.

use taskfence_test_support::dynamo;

taskfence::testing::conformance_suite!(dynamo::fixture());

/// The application's own writes under the fence: `with(items).write(&lease)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_writes_commit_only_under_a_current_lease() {
    taskfence::testing::scenarios::own_writes_commit_only_under_a_current_lease(&dynamo::fixture().await)
        .await;
}
