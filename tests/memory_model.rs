//! Model-based property test: random interleavings of every operation across
//! several workers, against `MemoryStore`, checked after every step against
//! the reference model in `taskfence::testing::model`.

mod model_ops;

use proptest::prelude::*;
use taskfence::testing::MemoryFixture;
use taskfence::testing::model;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_agrees_with_the_model(ops in model_ops::ops(60)) {
        runtime().block_on(model::run(&MemoryFixture::new(), &ops));
    }
}

/// Shrunk counterexamples found while mutation-testing the rules, kept as regressions.
mod regressions {
    use super::*;

    #[test]
    fn claim_after_spent_budget_is_failed() {
        let ops = model_ops::regressions::claim_after_spent_budget_is_failed();
        runtime().block_on(model::run(&MemoryFixture::new(), &ops));
    }

    #[test]
    fn claim_of_completed_task_answers_completed() {
        let ops = model_ops::regressions::claim_of_completed_task_answers_completed();
        runtime().block_on(model::run(&MemoryFixture::new(), &ops));
    }
}
