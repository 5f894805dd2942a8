//! Model-based property test against `DynamoStore` on a real DynamoDB API:
//! the same random interleavings and reference model as
//! `tests/memory_model.rs`, fewer cases (each gets a fresh table). Time moves
//! through the store's own clock (`DynamoFixture::advance`).

mod model_ops;

use proptest::prelude::*;
use taskfence::testing::model::{self, Op};
use taskfence_test_support::{dynamo, shared_runtime};

/// Runs `ops` against a fresh table and the model.
fn check(ops: &[Op]) {
    shared_runtime().block_on(async {
        let fixture = dynamo::fixture().await;
        model::run(&fixture, ops).await;
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    #[test]
    fn dynamo_store_agrees_with_the_model(ops in model_ops::ops(40)) {
        check(&ops);
    }
}

/// The counterexamples kept in `model_ops::regressions`, on `DynamoStore` too.
mod regressions {
    use super::*;

    #[test]
    fn claim_after_spent_budget_is_failed() {
        check(&model_ops::regressions::claim_after_spent_budget_is_failed());
    }

    #[test]
    fn claim_of_completed_task_answers_completed() {
        check(&model_ops::regressions::claim_of_completed_task_answers_completed());
    }
}
