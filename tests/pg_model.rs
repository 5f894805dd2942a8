//! Model-based property test against `PgStore` on the real server: the same
//! random interleavings and reference model as `tests/memory_model.rs`,
//! fewer cases (each gets a fresh schema). Time moves through the store's own
//! clock (`PgFixture::advance` offsets `store_clock()`); `tests/pg_lease_expiry.rs`
//! lets real time pass instead.

mod common;
mod model_ops;

use proptest::prelude::*;
use taskfence::testing::PgFixture;
use taskfence::testing::model::{self, Op};

/// Runs `ops` against a fresh schema and the model.
fn check(ops: &[Op]) {
    let (url, pool) = common::shared_pool(4);
    common::shared_runtime().block_on(async {
        let fixture = PgFixture::on_pool(url, pool.clone()).await;
        model::run(&fixture, ops).await;
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn pg_store_agrees_with_the_model(ops in model_ops::ops(40)) {
        check(&ops);
    }
}

/// The counterexamples kept in `model_ops::regressions`, on `PgStore` too.
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
