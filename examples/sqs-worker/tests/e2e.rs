//! End to end against a real SQS API (moto) and PostgreSQL: 200 tasks,
//! every message sent twice, 4 workers, a visibility timeout shorter than the
//! provider call, transient and ambiguous provider errors, permanent refusals,
//! workers killed right after the provider answered, and workers that stall
//! past their lease after the answer and then try to save it. The scenario and
//! its checks are `support::e2e`, shared with `tests/e2e_dynamodb.rs`.

mod support;

use sqs_worker::sim::scenario::StoreChoice;
use taskfence::testing::Fixture;
use taskfence_test_support::fixture_with;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_task_ends_with_one_saved_response_or_a_terminal_failure() {
    let moto = support::Moto::start_or_env();
    let fixture = fixture_with(30).await;
    let store_choice = StoreChoice::Postgres(fixture.pg_store().clone());
    support::e2e::run_and_check(&moto, "taskfence-e2e", 200, 10, store_choice, fixture.store()).await;
}
